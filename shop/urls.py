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
    path("account/email/", views.account_email, name="account-email"),
    path("account/delete/", views.account_delete, name="account-delete"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", views.ShopLoginView.as_view(), name="login"),
    path("accounts/logout/", views.logout_page, name="logout"),
    path("accounts/password-reset/", views.PasswordResetView.as_view(), name="password-reset"),
    path(
        "accounts/password-reset/done/",
        views.PasswordResetDoneView.as_view(),
        name="password-reset-done",
    ),
    path(
        "accounts/password-reset/complete/",
        views.PasswordResetCompleteView.as_view(),
        name="password-reset-complete",
    ),
    path(
        "accounts/password-reset/<uidb64>/<token>/",
        views.PasswordResetConfirmView.as_view(),
        name="password-reset-confirm",
    ),
    path("accounts/password-change/", views.PasswordChangeView.as_view(), name="password-change"),
    path(
        "accounts/password-change/done/",
        views.PasswordChangeDoneView.as_view(),
        name="password-change-done",
    ),
]
