"""App configuration of the shop: connects the breaker-transition log to baldur's signals."""

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """``testproject.shop``; ``ready()`` only wires signal receivers (idempotent)."""

    name = "testproject.shop"
    label = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import breaker_log

        breaker_log.connect()
