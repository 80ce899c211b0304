"""The test project's API mounted as it is in testproject/urls.py (without the shop)."""

from django.urls import include, path

urlpatterns = [path("api/", include("testproject.api.urls"))]
