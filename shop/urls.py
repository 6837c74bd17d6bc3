"""The storefront's paths (the contract's "Storefront"); the API stays under /api/."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.catalog, name="catalog"),
    path("products/<str:sku>/", views.product_page, name="product"),
    path("cart/", views.cart_page, name="cart"),
    path("checkout/", views.checkout_page, name="checkout"),
    path("orders/", views.order_list, name="orders"),
    path("orders/<str:order_id>/", views.order_page, name="order"),
    path("orders/<str:order_id>/status/", views.order_status_fragment, name="order-status"),
    path("orders/<str:order_id>/confirm/", views.order_confirm, name="order-confirm"),
    path("orders/<str:order_id>/cancel/", views.order_cancel, name="order-cancel"),
    path("orders/<str:order_id>/return/", views.order_return, name="order-return"),
    path("account/", views.account_page, name="account"),
    path("account/delete/", views.account_delete, name="account-delete"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", views.ShopLoginView.as_view(), name="login"),
    path("accounts/logout/", views.logout_page, name="logout"),
]
