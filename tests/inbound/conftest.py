"""Fixtures of the inbound-side tests: a site with the Baldur middlewares installed."""

from __future__ import annotations

import pytest
from django.core.cache import caches
from django.test import override_settings

from . import views

CB = "baldur_django.middleware.CircuitBreakerMiddleware"
RL = "baldur_django.middleware.RateLimitMiddleware"

#: Django's usual stack with the circuit breaker outermost and the limiter after auth.
STACK = [
    CB,
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    RL,
    "django.contrib.messages.middleware.MessageMiddleware",
]

MAPPING = {"/payments/": "payments", "/payments/refunds/": "refunds", "/api/": "api"}


@pytest.fixture
def configure():
    """``configure(**settings)``: override Django settings until the test ends."""
    applied = []

    def apply(**kwargs):
        override = override_settings(**kwargs)
        override.enable()
        applied.append(override)

    yield apply
    for override in reversed(applied):
        override.disable()


@pytest.fixture
def site(configure):
    """The test URLconf, the Baldur middlewares and a domain mapping; an empty cache."""
    configure(ROOT_URLCONF="tests.inbound.urls", MIDDLEWARE=STACK, BALDUR_DOMAIN_MAPPING=MAPPING)
    for alias in caches:
        caches[alias].clear()
    views.CALLS.clear()
    views.STREAM["started"] = False
    yield configure
    for alias in caches:
        caches[alias].clear()
