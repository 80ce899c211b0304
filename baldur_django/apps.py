"""Django app configuration: ``ready()`` only wires (design habit 1)."""

from __future__ import annotations

from django.apps import AppConfig


class BaldurDjangoConfig(AppConfig):
    """Installs the Django settings lookup, the signal bridge and the system checks."""

    name = "baldur_django"
    label = "baldur_django"
    verbose_name = "Baldur circuit breakers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, conf, signals  # noqa: F401 - registers checks and receivers
        from .core.events import bus

        conf.install()
        bus.subscribe(signals.bridge)
        try:
            from .core.registry import registry

            registry.reconfigure_all()
        except Exception:
            # a bad setting is reported by the system checks with a hint, not here
            pass
