"""``baldur_settings``: every ``BALDUR_*`` knob resolved Django setting -> env -> default.

One object, built from the core's defaults table, with the source of every value
recorded (CFG-4). A ``setting_changed`` receiver (``signals.py``) clears it and
re-resolves every breaker's configuration without a restart (CFG-2). Never writes into
``django.conf.settings``. Implements CFG-1, CFG-2, CFG-4.
"""

from __future__ import annotations

from typing import Any

from .core.config import MISSING, settings as baldur_settings
from .core.knobs import KNOBS

__all__ = ["baldur_settings", "django_lookup", "install", "reload"]


def django_lookup(name: str) -> Any:
    """Value of Django setting *name*, or MISSING when it is not defined."""
    from django.conf import settings

    return getattr(settings, name, MISSING)


def install() -> None:
    """Make the process-wide settings source read Django settings first (called by ``ready()``)."""
    baldur_settings.set_lookup(django_lookup)


def reload(setting: str | None = None) -> None:
    """Drop cached values and re-resolve every breaker's configuration (CFG-2).

    Args:
        setting: the Django setting that changed; anything not ``BALDUR_*`` is ignored.

    Raises:
        ConfigError: the new value is invalid; breakers keep their previous configuration.
    """
    if setting is not None and not setting.startswith("BALDUR_"):
        return
    from .core.registry import registry

    baldur_settings.reset()
    registry.reconfigure_all()


def known_settings() -> list[str]:
    """Every knob name, in table order."""
    return list(KNOBS)
