"""Oscar's URLs, plus /healthz for the bench's readiness probe (bench.server.Gunicorn)."""

from django.apps import apps
from django.http import HttpResponse
from django.urls import include, path


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("healthz", healthz),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include(apps.get_app_config("oscar").urls[0])),
]
