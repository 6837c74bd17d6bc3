from django.urls import path

from . import views

urlpatterns = [
    path("products/", views.ProductListView.as_view(), name="product-list"),
    path("products/<str:sku>/", views.ProductDetailView.as_view(), name="product-detail"),
    path("products/<str:sku>/stock/", views.StockView.as_view(), name="product-stock"),
]
