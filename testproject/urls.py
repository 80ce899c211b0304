"""URLs of the test project: the shop at the root, Django's admin under ``/admin/``."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("testproject.api.urls")),  # inbound-side demo API (docs/inbound.md)
    path("", include("testproject.shop.urls")),
]
