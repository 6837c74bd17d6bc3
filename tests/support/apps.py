from django.apps import AppConfig


class SupportConfig(AppConfig):
    name = "tests.support"
    label = "testsupport"
    verbose_name = "Test support (probe, unkeyed twin)"

    def ready(self) -> None:
        from idempotency.keys import register_operation

        from . import probe

        register_operation(probe.OPERATION, resume=probe.probe_resume)
