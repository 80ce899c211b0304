"""URLs of the inbound-side demo API (included under ``api/``)."""

from django.urls import path

from . import views

app_name = "api"

urlpatterns = [
    path("quote/", views.QuoteView.as_view(), name="quote"),
    path("payments-health/", views.payments_health, name="payments-health"),
    path("limited/", views.limited, name="limited"),
    path("breaker/", views.breaker, name="breaker"),
]
