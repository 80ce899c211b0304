"""Nested use of one breaker: a call through breaker X made inside another call through X,
in the same thread or asyncio task, is part of that outer call. The outer call records the
one outcome of the two; the nested call records nothing of its own.

Telling them apart must cost nothing on the CLOSED healthy success path (admitted while the
breaker's healthy lane is open): such a call sets no mark at all. Every other call through
a wrapper is *marked*: it runs with a :class:`Nest` in the :data:`NEST` context variable
(the wrapper enters itself again under it), and a call that finds its breaker's Nest
already claimed is nested in it. A call admitted on the healthy lane that must record off
it after all (it failed, or another thread made the breaker unhealthy meanwhile) finds an
unmarked outer call on the interpreter's call stack instead (:func:`outer_call`): that walk
costs microseconds, and happens about once per healthy stretch.

Every frame that runs a protected call (the wrappers the breaker builds, the inline path
of ``protect()``/``aprotect()``) is of a code object registered here, together with a
function that reads its breaker from its locals; while the call runs, its locals also hold
its ``permit`` and ``mark``. Only outer calls of the same state generation count: an outer
call admitted before the breaker tripped has its own outcome dropped as stale, so the
nested call records its own.

For a coroutine the stack is the chain of coroutines awaiting one another in one task; a
call made in another thread or task (a thread pool, ``asyncio.gather``) is its own call.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from types import CodeType, FrameType
from typing import Any, cast

__all__ = [
    "RECORDED",
    "NEST",
    "Nest",
    "Inside",
    "recorded_since",
    "register",
    "outer_call",
    "nest_mark",
    "entering",
    "marked",
    "amarked",
    "outer_of",
    "seq_of",
    "settled_elsewhere",
]

#: ``(breaker, n)``: the breaker that last counted an outcome in this thread or task off the
#: lock-free healthy lane, and its record number then (written by the breaker, under its
#: lock; read by :func:`recorded_since`). Never written on the CLOSED healthy path.
RECORDED: contextvars.ContextVar[tuple[Any, int] | None] = contextvars.ContextVar("baldur_recorded", default=None)

#: code object of a frame that runs a protected call -> reads its breaker from its locals
_ENTRIES: dict[CodeType, Callable[[dict[str, Any]], Any]] = {}


class Nest:
    """The mark of a call through *breaker* that runs off the healthy lane: calls through
    the same breaker made inside it are nested in it. Also that call's own ``mark``.

    Attributes:
        breaker: the breaker.
        permit: the call's permit (its generation is the state the call was admitted in).
        mark: the breaker's record number when the call began.
        claimed: True once the call entered under this Nest took it as its own.
    """

    __slots__ = ("breaker", "permit", "mark", "claimed")

    def __init__(self, breaker: Any, permit: Any, mark: int) -> None:
        self.breaker = breaker
        self.permit = permit
        self.mark = mark
        self.claimed = False


class Inside:
    """The ``mark`` of a call nested in the call *nest* marks: it records nothing."""

    __slots__ = ("nest",)

    def __init__(self, nest: Nest) -> None:
        self.nest = nest


#: The :class:`Nest` of the innermost marked call running in this thread or task.
NEST: contextvars.ContextVar[Nest | None] = contextvars.ContextVar("baldur_nest", default=None)

#: A call's ``mark``: the record number (healthy-lane admission, trials), its own
#: :class:`Nest`, or :class:`Inside` for a nested call.
Mark = int | Nest | Inside


def seq_of(mark: Mark) -> int:
    """The record number a call's *mark* stands for."""
    if type(mark) is int:
        return mark
    if type(mark) is Nest:
        return mark.mark
    return cast(Inside, mark).nest.mark


def recorded_since(breaker: Any, mark: Mark) -> bool:
    """True when *breaker* counted an outcome in this thread or task after the record
    number *mark* stands for (read when a call began): a call nested in this one through
    the same breaker recorded this call's outcome."""
    last = RECORDED.get()
    if last is None or last[0] is not breaker:
        return False
    return last[1] > (mark if type(mark) is int else seq_of(mark))


def nest_mark(breaker: Any, permit: Any) -> Mark | None:
    """The mark of a call admitted off the healthy lane with *permit*: its own :class:`Nest`
    when it was entered under one (see :func:`marked`), :class:`Inside` when it runs in a
    marked call through the same breaker and state, None when it must be marked first."""
    nest = NEST.get()
    if nest is not None and nest.breaker is breaker:
        if not nest.claimed:
            nest.claimed = True  # set by marked() for this very call
            return nest
        if nest.permit.generation == permit.generation:
            return Inside(nest)
    return None


def entering(breaker: Any) -> Any:
    """The permit that :func:`marked` re-enters a call of *breaker* with (its Nest not yet
    claimed), else None: the call was admitted already and must not be admitted again."""
    nest = NEST.get()
    if nest is not None and nest.breaker is breaker and not nest.claimed:
        return nest.permit
    return None


def marked(
    breaker: Any, permit: Any, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run ``wrapper(*args, **kwargs)`` again under a new :class:`Nest` of *breaker*."""
    token = NEST.set(Nest(breaker, permit, breaker.record_mark()))
    try:
        return wrapper(*args, **kwargs)
    finally:
        NEST.reset(token)


async def amarked(
    breaker: Any, permit: Any, wrapper: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The async :func:`marked` (the Nest lives in this task's context)."""
    token = NEST.set(Nest(breaker, permit, breaker.record_mark()))
    try:
        return await wrapper(*args, **kwargs)
    finally:
        NEST.reset(token)


def register(code: CodeType, breaker_of: Callable[[dict[str, Any]], Any]) -> None:
    """Mark the frames of *code* as running protected calls.

    Args:
        code: the code object of the function whose frames run the call.
        breaker_of: reads the frame's breaker from its locals (a dict); may return None.
    """
    _ENTRIES[code] = breaker_of


def outer_call(breaker: Any, permit: Any) -> tuple[Any, Mark] | None:
    """The call through *breaker* that the current one is nested in, if any.

    Call it from inside the current call (any depth below the frame that runs it), on the
    thread that runs it (for a coroutine: on the event loop's thread, never from a worker
    thread).

    Args:
        breaker: the breaker of the current call.
        permit: the current call's permit; an outer call counts only when its permit has
            the same state generation.

    Returns:
        ``(permit, mark)`` of the outermost call through *breaker* around the current one,
        or None when the current call is not nested.
    """
    entries = _ENTRIES
    generation = permit.generation
    # this function's own frame first (its code is never registered); None where the
    # interpreter keeps no frames, and then no outer call is found
    frame: FrameType | None = inspect.currentframe()
    found = 0
    outermost: tuple[Any, Mark] | None = None
    while frame is not None:
        breaker_of = entries.get(frame.f_code)
        if breaker_of is not None:
            local = frame.f_locals
            theirs = local.get("permit")
            if (
                "mark" in local
                and theirs is not None
                and theirs.generation == generation
                and breaker_of(local) is breaker
            ):
                found += 1
                outermost = (theirs, local["mark"])
        frame = frame.f_back
    return outermost if found > 1 else None


def outer_of(breaker: Any, permit: Any, mark: Mark) -> tuple[Any, Mark] | None:
    """``(permit, mark)`` of the call through *breaker* that the call with *permit* and
    *mark* is nested in, or None when it is a call of its own (asked only off the healthy
    lane; on the loop's thread for a coroutine)."""
    if type(mark) is Nest:
        return None
    if isinstance(mark, Inside):
        return mark.nest.permit, mark.nest
    current = NEST.get()
    if (
        current is not None
        and current.breaker is breaker
        and current.claimed
        and current.permit.generation == permit.generation
    ):
        return current.permit, current
    return outer_call(breaker, permit)  # an outer call admitted on the healthy lane is unmarked


def settled_elsewhere(breaker: Any, permit: Any, mark: Mark) -> bool:
    """True when the call with *permit* and *mark* must record nothing of its own: a call
    nested in it through the same breaker already recorded its outcome (a failure that the
    nested call's fallback answered), or it runs nested in an outer call through the same
    breaker, whose outcome is the one the breaker counts."""
    if type(mark) is Inside:
        return True
    if type(mark) is Nest:  # a marked call is nobody's nested call
        return recorded_since(breaker, mark)
    return recorded_since(breaker, mark) or outer_of(breaker, permit, mark) is not None
