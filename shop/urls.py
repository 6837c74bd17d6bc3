"""The storefront's paths (the contract's "Storefront"); the API stays under /api/."""

from django.urls import path

from .views import accounts, catalog, orders

urlpatterns = [
    path("", catalog.catalog, name="catalog"),
    path("products/<str:sku>/", catalog.product_page, name="product"),
    path("cart/", catalog.cart_page, name="cart"),
    path("checkout/", catalog.checkout_page, name="checkout"),
    path("orders/", orders.order_list, name="orders"),
    path("orders/<str:order_id>/", orders.order_page, name="order"),
    path("orders/<str:order_id>/status/", orders.order_status_fragment, name="order-status"),
    path("orders/<str:order_id>/confirm/", orders.order_confirm, name="order-confirm"),
    path("orders/<str:order_id>/cancel/", orders.order_cancel, name="order-cancel"),
    path("orders/<str:order_id>/return/", orders.order_return, name="order-return"),
    path("account/", accounts.account_page, name="account"),
    path("account/email/", accounts.account_email, name="account-email"),
    path("account/delete/", accounts.account_delete, name="account-delete"),
    path(
        "account/logout-everywhere/",
        accounts.account_logout_everywhere,
        name="account-logout-everywhere",
    ),
    path("accounts/signup/", accounts.signup, name="signup"),
    path("accounts/login/", accounts.ShopLoginView.as_view(), name="login"),
    path("accounts/logout/", accounts.logout_page, name="logout"),
    path("accounts/password-reset/", accounts.PasswordResetView.as_view(), name="password-reset"),
    path(
        "accounts/password-reset/done/",
        accounts.PasswordResetDoneView.as_view(),
        name="password-reset-done",
    ),
    path(
        "accounts/password-reset/complete/",
        accounts.PasswordResetCompleteView.as_view(),
        name="password-reset-complete",
    ),
    path(
        "accounts/password-reset/<uidb64>/<token>/",
        accounts.PasswordResetConfirmView.as_view(),
        name="password-reset-confirm",
    ),
    path(
        "accounts/password-change/", accounts.PasswordChangeView.as_view(), name="password-change"
    ),
    path(
        "accounts/password-change/done/",
        accounts.PasswordChangeDoneView.as_view(),
        name="password-change-done",
    ),
]
