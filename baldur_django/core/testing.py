"""Test helpers, public like ``structlog.testing``: a fake clock and a recording listener."""

from __future__ import annotations

import asyncio
import threading

from .events import Event, EventBus, StateChanged

__all__ = ["FakeClock", "RecordingListener"]


class FakeClock:
    """A clock that moves only when told to.

    ``sleep`` and ``asleep`` advance it instead of waiting, and record the waits in
    ``sleeps``; ``asleep`` still yields to the event loop once.

    Args:
        start (float): initial monotonic reading, seconds.
        wall (float): initial Unix time, seconds.
    """

    def __init__(self, start: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self._mono = start
        self._wall = wall
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        """Move both readings forward by *seconds*."""
        with self._lock:
            self._mono += seconds
            self._wall += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)


class RecordingListener:
    """Collects every event published on a bus; ``kinds()`` lists their kinds in order."""

    def __init__(self, bus: EventBus | None = None) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        if bus is not None:
            bus.subscribe(self)

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def transitions(self) -> list[tuple[str, str, str]]:
        """``(from_state, to_state, trigger)`` of every StateChanged event, in order."""
        return [(e.from_state, e.to_state, e.trigger) for e in self.events if isinstance(e, StateChanged)]
