from django.urls import path

from . import views

urlpatterns = [
    path("auth/register/", views.RegisterView.as_view(), name="auth-register"),
    path("auth/token/", views.TokenView.as_view(), name="auth-token"),
    path("auth/account/", views.AccountView.as_view(), name="auth-account"),
    path("loyalty/", views.LoyaltyView.as_view(), name="loyalty"),
    path("purchase-history/", views.PurchaseHistoryView.as_view(), name="purchase-history"),
]
