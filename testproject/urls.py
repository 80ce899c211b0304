"""URLs of the test project: the shop at the root, Django's admin under ``/admin/``, the
Prometheus metrics under ``/metrics`` and (with DEBUG on) the static files under
``/static/`` for servers other than runserver."""

from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path

from baldur_django.contrib import prometheus

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", prometheus.metrics_view, name="metrics"),  # install() runs in ShopConfig.ready()
    path("api/", include("testproject.api.urls")),  # inbound-side demo API (docs/inbound.md)
    path("", include("testproject.shop.urls")),
]
# empty unless DEBUG: what runserver serves itself, for testproject.serve (the demo's server)
urlpatterns += staticfiles_urlpatterns()
