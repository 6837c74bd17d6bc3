from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "devtools.demo"
    label = "demo"
    verbose_name = "Demo data (development only)"
