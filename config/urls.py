from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import views

api_v1 = [
    path("", include("shop.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("orders.api.urls")),
]
pages: list = []

# Test-only endpoints (the idempotency probe), never mounted in production.
if settings.SHOP_TEST_ENDPOINTS:
    from idempotency import test_urls

    api_v1 += test_urls.api_urlpatterns
    pages += test_urls.page_urlpatterns

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    *pages,
]
