"""App configuration of the shop: connects the breaker-transition log to baldur's signals."""

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """``testproject.shop``; ``ready()`` only wires signal receivers and the metrics (idempotent)."""

    name = "testproject.shop"
    label = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from baldur_django.contrib import prometheus

        from . import breaker_log

        breaker_log.connect()
        # Prometheus metrics, served at /metrics (urls.py). Installed here, when every
        # process starts, rather than on the first scrape: under a multi-process server
        # (PROMETHEUS_MULTIPROC_DIR set) each worker must write its counts from its start.
        prometheus.install()
