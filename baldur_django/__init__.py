"""baldur_django: circuit breakers for Django and plain Python.

The names below are the fixed public contract (see "Public names" on the Behaviour
reference page of the docs). Importing this package needs no Django settings: the core
reads environment variables until the Django app
(``baldur_django.apps.BaldurDjangoConfig``) installs ``django.conf.settings``.
"""

from .core.breaker import CircuitBreaker
from .core.decorators import aprotect, aprotected, circuit_breaker, protect, protected
from .core.errors import (
    BaldurError,
    BulkheadFullError,
    CallRefusedError,
    CircuitOpenError,
    ConfigError,
    DeadlineExceededError,
    RateLimitCooldownError,
    ThrottledError,
)
from .core.marks import mark_rate_limited
from .core.registry import force_close_circuit, force_open_circuit, get_breaker, record_rate_limit, release_circuit
from .core.retry import RetryPolicy
from .core.stages.deadline import deadline
from .core.states import CircuitState

__version__ = "0.1.0"

__all__ = [
    "protected",
    "aprotected",
    "protect",
    "aprotect",
    "circuit_breaker",
    "deadline",
    "force_open_circuit",
    "force_close_circuit",
    "release_circuit",
    "record_rate_limit",
    "get_breaker",
    "mark_rate_limited",
    "CircuitBreaker",
    "CircuitState",
    "RetryPolicy",
    "BaldurError",
    "ConfigError",
    "CallRefusedError",
    "CircuitOpenError",
    "RateLimitCooldownError",
    "BulkheadFullError",
    "ThrottledError",
    "DeadlineExceededError",
    "__version__",
]
