"""The bench's URLs: the test support's (production's plus the test-only routes) and the peer."""

from django.urls import path

from tests.support.urls import urlpatterns as test_urlpatterns

from .peer import PeerOrderView

urlpatterns = [
    path("api/v1/_bench/orders-peer/", PeerOrderView.as_view(), name="bench-orders-peer"),
    *test_urlpatterns,
]
