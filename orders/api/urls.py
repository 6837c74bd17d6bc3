from django.urls import path

from . import views

urlpatterns = [
    path("orders/", views.OrderListView.as_view(), name="order-list"),
    path("orders/<str:order_id>/", views.OrderDetailView.as_view(), name="order-detail"),
    path("orders/<str:order_id>/confirm/", views.OrderConfirmView.as_view(), name="order-confirm"),
    path("orders/<str:order_id>/cancel/", views.OrderCancelView.as_view(), name="order-cancel"),
]
