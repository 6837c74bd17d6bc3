from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = _("Core")

    def ready(self) -> None:
        # Celery task retries and task log context (signals), in web and worker processes.
        from . import (
            checks,  # noqa: F401 - checks register themselves
            instruments,  # noqa: F401
        )
