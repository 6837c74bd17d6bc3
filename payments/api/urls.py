from django.urls import path

from . import views

urlpatterns = [
    path("payments/webhooks/", views.WebhookView.as_view(), name="payments-webhooks"),
]
