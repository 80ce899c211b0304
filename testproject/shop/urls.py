"""URLs of the shop."""

from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("", views.home, name="home"),
    path("orders/", views.orders, name="orders"),
    path("orders/<int:order_id>/charge/", views.charge, name="charge"),
    path("orders/<int:order_id>/charge-unprotected/", views.charge_unprotected, name="charge-unprotected"),
    path("orders/<int:order_id>/shipping-quotes/", views.shipping_quotes, name="shipping-quotes"),
    path("orders/<int:order_id>/rate/<str:client>/", views.rate, name="rate"),
    path("breakers/", views.breakers, name="breakers"),
    path("emergency/", views.emergency, name="emergency"),
]
