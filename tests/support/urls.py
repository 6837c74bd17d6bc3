"""The production URLs plus the test-only routes (the probe and the unkeyed checkout)."""

from django.urls import path

from config.urls import urlpatterns as production_urlpatterns

from . import probe_views, unkeyed

urlpatterns = [
    path("api/v1/_test/probe/", probe_views.ProbeView.as_view(), name="test-probe"),
    path(
        "api/v1/_test/probe-unkeyed/",
        probe_views.ProbeUnkeyedView.as_view(),
        name="test-probe-unkeyed",
    ),
    path(
        "api/v1/_test/orders-unkeyed/",
        unkeyed.OrderPlaceUnkeyedView.as_view(),
        name="test-orders-unkeyed",
    ),
    path("_test/probe-form/", probe_views.probe_form, name="test-probe-form"),
    path("_test/probe-form/<uuid:probe_id>/", probe_views.probe_page, name="test-probe-page"),
    *production_urlpatterns,
]
