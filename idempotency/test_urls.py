"""Test-only URLs, included by config.urls only when settings.SHOP_TEST_ENDPOINTS is true."""

from django.urls import path

from . import probe_views

api_urlpatterns = [
    path("_test/probe/", probe_views.ProbeView.as_view(), name="test-probe"),
    path("_test/probe-unkeyed/", probe_views.ProbeUnkeyedView.as_view(), name="test-probe-unkeyed"),
]

page_urlpatterns = [
    path("_test/probe-form/", probe_views.probe_form, name="test-probe-form"),
    path("_test/probe-form/<uuid:probe_id>/", probe_views.probe_page, name="test-probe-page"),
]
