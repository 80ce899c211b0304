"""Deadlines: how much time a protected call has left, carried in a context variable.

A deadline is an instant on a clock (:class:`Deadline`). The current one lives in a
context variable, so it follows a request through threads started with a copied context
and through asyncio tasks; entering a deadline while one is in force keeps the earlier of
the two (nested deadlines: the earliest wins). Three things set one: the ``deadline``
knob of a breaker (for its own call), :func:`deadline` (a block of code) and
``RequestDeadlineMiddleware`` (a request).

Reading the deadline costs a context-variable read, so the wrappers of a breaker without
the ``deadline`` knob read it only once any deadline was ever set in the process
(:data:`ARMED` is then non-empty): until then nothing on the call path changes.
"""

from __future__ import annotations

import math
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigError

__all__ = [
    "Deadline",
    "ARMED",
    "current",
    "set_deadline",
    "reset_deadline",
    "time_left",
    "enter",
    "enter_at",
    "leave",
    "deadline",
    "check_seconds",
    "header_seconds",
    "request_seconds",
]


class Deadline:
    """An instant on a clock by which a call must be done.

    Args:
        at (float): the instant, in the monotonic seconds of *clock*.
        clock (Clock): the clock *at* is read on.
        owner: the breaker core whose staged call entered it (its own wrapper then runs
            the call as usual), or None.
    """

    __slots__ = ("at", "clock", "owner")

    def __init__(self, at: float, clock: Clock, owner: object = None) -> None:
        self.at = at
        self.clock = clock
        self.owner = owner

    def left(self) -> float:
        """Seconds left until the deadline (negative once it has passed)."""
        return self.at - self.clock.monotonic()

    def __repr__(self) -> str:
        return f"Deadline(at={self.at!r}, left={self.left():.3f})"


_current: ContextVar[Deadline | None] = ContextVar("baldur_deadline", default=None)

#: Empty until a deadline is set for the first time in this process; then holds True. The
#: wrappers test it (one truth test of a list) before they read the context variable.
ARMED: list[bool] = []

#: The context variable's reader, bound once (``current()`` is the current deadline or None).
current = _current.get
#: Its setter and resetter, bound once, for a wrapper that arms the process itself (see
#: :data:`ARMED`): ``set_deadline(d)`` returns the token ``reset_deadline`` takes.
set_deadline = _current.set
reset_deadline = _current.reset


def time_left() -> float | None:
    """Seconds the current deadline leaves (negative once passed), or None without one."""
    found = _current.get()
    return None if found is None else found.left()


def check_seconds(where: str, seconds: Any) -> float:
    """*seconds* as a float above 0, else ConfigError naming *where* and the value."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{where}={seconds!r}: expected a number of seconds above 0")
    return float(seconds)


def enter(seconds: float, clock: Clock = SYSTEM_CLOCK) -> Token[Deadline | None]:
    """Make the current deadline *seconds* from now on *clock*, unless the one in force is
    earlier (then it stays). Pair with :func:`leave`.

    Args:
        seconds: seconds from now (already checked: a number above 0).
        clock: the clock the deadline is read on.

    Returns:
        The token :func:`leave` takes.
    """
    if not ARMED:
        ARMED.append(True)
    new = Deadline(clock.monotonic() + seconds, clock)
    found = _current.get()
    if found is not None and found.left() <= seconds:
        new = found  # the earliest deadline wins
    return _current.set(new)


def enter_at(new: Deadline) -> Token[Deadline | None]:
    """Make *new* the current deadline, as it is (the caller chose it, the earliest one).
    Pair with :func:`leave`."""
    if not ARMED:
        ARMED.append(True)
    return _current.set(new)


def leave(token: Token[Deadline | None] | None) -> None:
    """Restore the deadline in force before the matching :func:`enter` (None: nothing to do)."""
    if token is not None:
        _current.reset(token)


class deadline:  # noqa: N801 - a context manager named like a function, as contextlib's are
    """``with baldur.deadline(8.0): ...``: every protected call inside gets at most the
    time left (``async with`` works too). Nested deadlines: the earliest wins.

    Args:
        seconds (float): seconds from entering the block; above 0.
        clock (Clock | None): the clock to read (None: the system clock; tests pass the
            breakers' fake clock).

    Raises:
        ConfigError: *seconds* is not a number above 0 (raised when the object is made).
    """

    __slots__ = ("seconds", "clock", "_tokens")

    def __init__(self, seconds: float, *, clock: Clock | None = None) -> None:
        self.seconds = check_seconds("deadline(seconds)", seconds)
        self.clock = clock or SYSTEM_CLOCK
        self._tokens: list[Token[Deadline | None]] = []

    def __enter__(self) -> deadline:
        self._tokens.append(enter(self.seconds, self.clock))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        leave(self._tokens.pop())

    async def __aenter__(self) -> deadline:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, error, tb)

    def left(self) -> float | None:
        """Seconds the deadline in force leaves now (None outside any deadline)."""
        return time_left()


def header_seconds(raw: Any) -> float | None:
    """The seconds a deadline header's value gives: a positive, finite number (``"2.5"``),
    else None (the value is ignored)."""
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    if not isinstance(raw, str):
        return None
    try:
        seconds = float(raw.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def request_seconds(setting: float | None, header: float | None) -> float | None:
    """A request's deadline in seconds: the header's value capped by the setting when both
    are given, else whichever is, else None (no deadline)."""
    if header is None:
        return setting
    return header if setting is None else min(header, setting)
