from django.apps import AppConfig


class SupportConfig(AppConfig):
    name = "tests.support"
    label = "testsupport"
    verbose_name = "Test support (probe, unkeyed twin)"

    def ready(self) -> None:
        # The probe declares its keyed operation for the completer.
        from . import probe  # noqa: F401
