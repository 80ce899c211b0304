"""The ``baldur_django.contrib.health`` app: registers :class:`BreakerHealthCheck`."""

from __future__ import annotations

import importlib
from typing import Any

from django.apps import AppConfig


class BaldurHealthConfig(AppConfig):
    """App ``baldur_django.contrib.health`` (label ``baldur_health``, no models).

    ``ready()`` registers the breaker check with django-health-check when it is installed:
    its default check list (what ``HealthCheckView.as_view()`` runs when no ``checks=`` is
    given) gains :data:`~baldur_django.contrib.health.CHECK_PATH`. Views that list their
    own checks add that path themselves. Idempotent.
    """

    name = "baldur_django.contrib.health"
    label = "baldur_health"
    verbose_name = "Baldur health endpoint"

    def ready(self) -> None:
        """Register the check; nothing happens without django-health-check."""
        try:
            views: Any = importlib.import_module("health_check.views")  # untyped package
        except ImportError:  # pragma: no cover - the [health] extra is not installed
            return
        view = views.HealthCheckView
        from . import CHECK_PATH

        checks = tuple(view.checks)
        if CHECK_PATH not in checks:
            view.checks = (*checks, CHECK_PATH)
