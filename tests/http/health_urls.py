"""A URLconf with the health view, for tests that go through Django's request handler."""

from django.urls import path

from baldur_django.contrib.health import health_view

urlpatterns = [path("health/ready/", health_view)]
