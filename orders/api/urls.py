from django.urls import path

from . import refunds, shipments, views

urlpatterns = [
    path("orders/", views.OrderListView.as_view(), name="order-list"),
    path("orders/<str:order_id>/", views.OrderDetailView.as_view(), name="order-detail"),
    path("orders/<str:order_id>/confirm/", views.OrderConfirmView.as_view(), name="order-confirm"),
    path("orders/<str:order_id>/cancel/", views.OrderCancelView.as_view(), name="order-cancel"),
]

# Shipments and courier tracking events (orders/api/shipments.py).
urlpatterns += [
    path(
        "orders/<str:order_id>/shipments/",
        shipments.ShipmentCreateView.as_view(),
        name="order-shipments",
    ),
    path(
        "shipments/<str:shipment_id>/tracking-events/",
        shipments.TrackingEventsView.as_view(),
        name="shipment-tracking-events",
    ),
]

# Refunds (orders/api/refunds.py).
urlpatterns += [
    path("orders/<str:order_id>/refunds/", refunds.RefundsView.as_view(), name="order-refunds"),
]

# Returns (orders/api/returns.py).
from . import returns as returns_api  # noqa: E402

urlpatterns += [
    path(
        "orders/<str:order_id>/returns/",
        returns_api.OrderReturnsView.as_view(),
        name="order-returns",
    ),
    path("returns/<str:return_id>/", returns_api.ReturnDetailView.as_view(), name="return-detail"),
    path(
        "returns/<str:return_id>/receive/",
        returns_api.ReturnReceiveView.as_view(),
        name="return-receive",
    ),
]
