"""Injectable time source.

``monotonic()`` drives in-process timers (recovery timeout, cooldowns, lifetimes);
``wall()`` gives Unix seconds for values that are stored or shown (``opened_at``,
``force_expires_at``). Tests swap in :class:`baldur_django.core.testing.FakeClock`.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "SYSTEM_CLOCK"]


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time` and :func:`time.sleep`."""

    __slots__ = ()
    monotonic = staticmethod(time.monotonic)
    wall = staticmethod(time.time)
    sleep = staticmethod(time.sleep)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
