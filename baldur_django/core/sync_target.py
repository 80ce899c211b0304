"""What a store strategy (``sync.py``) needs from the breaker it serves, as a typing protocol.

:mod:`baldur_django.core.sync` is written against it instead of the breaker's classes, so
the strategy and the breaker's parts do not import each other (not even for type checking).
A breaker's core (:class:`~baldur_django.core.calls.BreakerCore`) satisfies it as it is.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .clock import Clock
    from .config import BreakerConfig
    from .events import Event
    from .permit import Permit, View
    from .stores.base import Answer

__all__ = ["SyncTarget"]


class SyncTarget(Protocol):
    """What a store strategy reads and calls of the breaker it serves (the breaker's core,
    :class:`~baldur_django.core.calls.BreakerCore`): its name, configuration and clock, a
    :class:`~baldur_django.core.permit.View` of its state, and the methods that adopt a
    store's answer. The strategy changes nothing of the breaker in any other way."""

    @property
    def name(self) -> str:
        """The breaker's name."""

    @property
    def config(self) -> BreakerConfig:
        """The breaker's effective configuration."""

    @property
    def clock(self) -> Clock:
        """The breaker's clock (monotonic and wall seconds)."""

    def view(self, *, locked: bool = False) -> View:
        """The state the strategy decides on."""

    def schedule(self, deadline: float, *, refresh: bool = False) -> None:
        """Set the next consult (monotonic seconds)."""

    def apply(
        self, answer: Answer, *, force: bool = False, first: Collection[Event] = (), announced: bool = False
    ) -> None:
        """Adopt a store answer, then deliver *first* and the adoption's events."""

    def apply_probe(self, answer: Answer, token: str, now: float) -> Permit | None:
        """Adopt the answer to a probe request; the permit it grants, or None."""

    def publish(self, events: Collection[Event] = ()) -> None:
        """Deliver events (state lock not held)."""

    def held_open(self) -> str | None:
        """The trigger of an automatic open this process holds, or None."""

    def open_timing(self) -> tuple[float, float, float]:
        """``(recovery_timeout, backoff factor, cap)`` in seconds."""
