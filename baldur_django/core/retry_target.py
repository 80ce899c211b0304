"""What the retry engine needs from the breaker it retries through, as typing protocols.

:mod:`baldur_django.core.retry` is written against these instead of the breaker class, so
the two modules do not import each other (not even for type checking). A breaker's core
(:class:`~baldur_django.core.calls.BreakerCore`) and its permits satisfy them as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .clock import Clock
    from .config import BreakerConfig

__all__ = ["RetryPermit", "RetryTarget", "PermitT"]


class RetryPermit(Protocol):
    """The permission one call was admitted with."""

    @property
    def generation(self) -> int:
        """The breaker's state generation when the call was admitted."""

    @property
    def trial(self) -> bool:
        """True for a HALF_OPEN trial call (it gets one attempt)."""


#: The permit type of one breaker class (its recording methods take its own permits).
PermitT = TypeVar("PermitT", bound=RetryPermit, contravariant=True)


class RetryTarget(Protocol[PermitT]):
    """The breaker a retry sequence runs through: its clock, state generation and 429
    cooldown, and the recording methods every call outcome goes through."""

    @property
    def name(self) -> str:
        """The breaker's name."""

    @property
    def config(self) -> BreakerConfig:
        """The breaker's effective configuration."""

    @property
    def clock(self) -> Clock:
        """The breaker's clock (``monotonic()`` in seconds)."""

    @property
    def generation(self) -> int:
        """The current state generation (a new one with every transition)."""

    def cooldown_remaining(self) -> float:
        """Seconds left of the 429 cooldown (0 when none runs)."""

    def note_dry_run_refusal(self, remaining: float) -> None:
        """Count a refusal that dry-run turned into an admission (*remaining*: seconds)."""

    def note_attempt(self, *, rate_limited: bool = False, retry_after: Any = None, evaluate: bool = True) -> None:
        """Count one attempt in the 429 cascade window; a 429 starts the cooldown."""

    def healthy_success(self, permit: PermitT) -> bool:
        """Count a success on the lock-free healthy lane; True when counted there, False
        when it must be recorded with :meth:`record_success`."""

    def record_success(self, permit: PermitT, *, count_attempt: bool = True) -> None:
        """Record the call's final outcome as a success."""

    def record_failure(
        self, permit: PermitT, *, rate_limited: bool = False, retry_after: Any = None, count_attempt: bool = True
    ) -> None:
        """Record the call's final outcome as a failure."""

    def record_ignored(self, permit: PermitT) -> None:
        """Record that the call counts neither way (its trial slot comes back)."""
