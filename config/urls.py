from django.contrib import admin
from django.urls import include, path
from django.views.decorators.http import require_POST
from django.views.i18n import set_language
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from backoffice import health, metrics, needs_attention
from backoffice.admin_login import admin_login

api_v1 = [
    path("", include("shop.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("orders.api.urls")),
    path("", include("payments.api.urls")),
    path("", include("reports.urls")),
]
urlpatterns = [
    # Before the admin's own URLs: its log-in page, throttled.
    path("admin/login/", admin_login, name="admin-login"),
    # The index with the "Needs attention" link and count, and that page (staff only).
    path("admin/", admin.site.admin_view(needs_attention.index_view), name="admin-index"),
    path(
        "admin/needs-attention/",
        admin.site.admin_view(needs_attention.needs_attention_view),
        name="admin-needs-attention",
    ),
    path("admin/", admin.site.urls),
    path("livez", health.livez, name="livez"),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    # The language switcher's form: Django's set_language, POST only (docs/storefront.md).
    path("i18n/setlang/", require_POST(set_language), name="set_language"),
    path("", include("shop.urls")),
]
