"""Deadlines: how much time a protected call has left, carried in a context variable.

A deadline is an instant on a clock (:class:`Deadline`). The current one lives in a
context variable, so it follows a request through threads started with a copied context
and through asyncio tasks; entering a deadline while one is in force keeps the earlier of
the two (nested deadlines: the earliest wins). Three things set one: the ``deadline``
knob of a breaker (for its own call), :func:`deadline` (a block of code) and
``RequestDeadlineMiddleware`` (a request).

Reading the deadline costs a context-variable read, so the wrappers of a breaker without
the ``deadline`` knob read it only once a deadline block or a request deadline was ever
entered in the process (:data:`ARMED` is then non-empty): until then nothing on the call
path changes.

The ``deadline`` knob bounds its own call: every attempt, backoff and cooldown wait of it,
and whatever the call runs in its own thread that asks how much time is left (the HTTP
adapters, the retry plans of calls nested in it, :func:`time_left`). It does not arm the
process, so the breaker wrappers of nested calls do not refuse on its account. Setting a
context variable on every call would cost more than the breaker itself, so a call on a
deadline lane (``lanes.py``) carries its deadline in its own frame instead (the locals
``at`` and ``core``; the lane's code is registered with :func:`register_lane`), and
:func:`in_force` finds it on the interpreter's stack (microseconds, read where time is
about to be spent: before a retry sequence, a bulkhead wait, an HTTP request). The staged
way sets the context variable for the knob, as before; a deadline that must follow code
into other threads or asyncio tasks is given with :func:`deadline`.
"""

from __future__ import annotations

import inspect
import math
from contextvars import ContextVar, Token
from types import CodeType, TracebackType
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigError

__all__ = [
    "Deadline",
    "ARMED",
    "current",
    "in_force",
    "register_lane",
    "set_deadline",
    "reset_deadline",
    "time_left",
    "enter",
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


#: code objects of the lanes whose frames carry their call's deadline (module's text)
_LANE_CODES: set[CodeType] = set()


def register_lane(code: CodeType) -> None:
    """Mark *code* as a lane's: while one of its frames runs, its locals ``at`` (the
    call's deadline, monotonic seconds on ``core.clock``) and ``core`` (the breaker core)
    give the deadline :func:`in_force` finds."""
    _LANE_CODES.add(code)


def in_force() -> Deadline | None:
    """The deadline in force here: the earliest of the context variable's (a deadline
    block, a request, a staged call's knob) and of the calls on deadline lanes running
    further up this thread's stack; None without any. Walks the stack only once a deadline
    lane exists in the process."""
    found = _current.get()
    if not _LANE_CODES:
        return found
    frame = inspect.currentframe()  # this function's own frame first (its code is never a lane's)
    while frame is not None:
        if frame.f_code in _LANE_CODES:
            local = frame.f_locals
            at = local.get("at")  # none while the lane hands its call to the staged way
            if at is not None:
                core = local["core"]
                carried = Deadline(at, core.clock, core)
                if found is None or carried.left() < found.left():
                    found = carried
        frame = frame.f_back
    return found


def time_left() -> float | None:
    """Seconds the deadline in force leaves (negative once passed), or None without one
    (see :func:`in_force`)."""
    found = in_force()
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
