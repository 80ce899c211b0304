"""Django REST framework throttle bridge.

DRF refuses a throttled request by raising ``Throttled`` inside the view, so the 429 it
answers carries no header saying it came from the application itself. The classes here
mark the underlying Django request when they refuse it
(:func:`baldur_django.mark_rate_limited`), and the circuit-breaker middleware then leaves
that 429 out. Their ``wait()`` is never below one second, so DRF always sends a
``Retry-After`` header of at least 1 with the refusal.

Use them in place of DRF's own classes::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": [
            "baldur_django.contrib.drf.BaldurAnonRateThrottle",
            "baldur_django.contrib.drf.BaldurUserRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/hour", "user": "1000/hour"},
    }

or add :class:`BaldurThrottleMixin` in front of a throttle class of your own.
"""

from __future__ import annotations

from typing import Any

try:
    from rest_framework.throttling import AnonRateThrottle, ScopedRateThrottle, UserRateThrottle
except ImportError as exc:  # pragma: no cover - exercised only without DRF installed
    raise ImportError(
        "baldur_django.contrib.drf needs Django REST framework; install it with "
        "pip install 'baldur-django[drf]' (or pip install djangorestframework)"
    ) from exc

from ..core.marks import mark_rate_limited

__all__ = ["BaldurThrottleMixin", "BaldurUserRateThrottle", "BaldurAnonRateThrottle", "BaldurScopedRateThrottle"]

#: The smallest wait reported with a refusal, seconds.
MIN_WAIT = 1.0


class BaldurThrottleMixin:
    """Mix in before a DRF throttle class.

    ``allow_request()`` marks the underlying ``HttpRequest`` when the throttle refuses
    (DRF's ``Request`` forwards attribute reads to it but keeps writes on itself, and the
    middleware only sees the ``HttpRequest``). ``wait()`` returns seconds, at least 1,
    also when the wrapped throttle cannot tell (``None``) or says 0.
    """

    def allow_request(self, request: Any, view: Any) -> bool:
        """Ask the wrapped throttle; on refusal mark the request. Returns True to admit."""
        allowed: bool = super().allow_request(request, view)  # type: ignore[misc]
        if not allowed:
            mark_rate_limited(request)
        return allowed

    def wait(self) -> float:
        """Seconds until a request may be admitted again, at least :data:`MIN_WAIT`."""
        seconds = super().wait()  # type: ignore[misc]
        if seconds is None:
            return MIN_WAIT
        try:
            return max(MIN_WAIT, float(seconds))
        except (TypeError, ValueError):
            return MIN_WAIT


class BaldurUserRateThrottle(BaldurThrottleMixin, UserRateThrottle):
    """DRF's ``UserRateThrottle`` (scope ``user``) that marks its refusals."""


class BaldurAnonRateThrottle(BaldurThrottleMixin, AnonRateThrottle):
    """DRF's ``AnonRateThrottle`` (scope ``anon``) that marks its refusals."""


class BaldurScopedRateThrottle(BaldurThrottleMixin, ScopedRateThrottle):
    """DRF's ``ScopedRateThrottle`` (the view's ``throttle_scope``) that marks its refusals."""
