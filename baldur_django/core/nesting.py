"""Finding the call a nested one runs in: a call through breaker X made inside another call
through X, in the same thread or asyncio task, is part of that outer call.

The outer call records the one outcome of the two; the nested call records nothing of its
own. Telling them apart costs nothing on the CLOSED success path: no call sets a context
variable or any other per-call mark. The question is asked only where a call is about to
record something off the lock-free healthy lane (a failure, a success that changes the
window, a trial's outcome), and it is answered from the interpreter's own call stack.

Every frame that runs a protected call (the wrappers the breaker builds, the inline path
of ``protect()``/``aprotect()``) is of a code object registered here, together with the
name of the local that holds its breaker. While such a frame runs the call, its locals
also hold the call's ``permit`` and ``mark`` (the breaker's record number when the call
began). A call is nested when the stack holds a second such frame of the same breaker
with a permit of the same state generation. An outer call from an earlier state (the
breaker tripped and moved on while it ran) does not count: its own outcome is dropped as
stale, so the nested call records its own.

For a coroutine the stack is the chain of coroutines that await one another inside one
task, so "the same task" is exactly what the walk sees; a call made in another task or
thread (``asyncio.gather``, a thread pool) is a call of its own.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

__all__ = ["RECORDED", "recorded_since", "register", "outer_call", "settled_elsewhere"]

#: ``(breaker, n)``: the breaker that last counted an outcome in this thread or task off the
#: lock-free healthy lane, and its record number then (written by the breaker, under its
#: lock; read by :func:`recorded_since`). Never written on the CLOSED healthy path.
RECORDED: contextvars.ContextVar[tuple[Any, int] | None] = contextvars.ContextVar("baldur_recorded", default=None)

#: code object of a frame that runs a protected call -> reads its breaker from its locals
_ENTRIES: dict[CodeType, Callable[[dict[str, Any]], Any]] = {}


def recorded_since(breaker: Any, mark: int) -> bool:
    """True when *breaker* counted an outcome in this thread or task after its record
    number was *mark* (read with ``CircuitBreaker.record_mark()`` when a call began): a
    call nested in this one through the same breaker recorded this call's outcome."""
    last = RECORDED.get()
    return last is not None and last[0] is breaker and last[1] > mark


def register(code: CodeType, breaker_of: Callable[[dict[str, Any]], Any]) -> None:
    """Mark the frames of *code* as running protected calls.

    Args:
        code: the code object of the function whose frames run the call.
        breaker_of: reads the frame's breaker from its locals (a dict); may return None.
    """
    _ENTRIES[code] = breaker_of


def outer_call(breaker: Any, permit: Any) -> tuple[Any, int] | None:
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
    frame = sys._getframe(1)
    found = 0
    outermost: tuple[Any, int] | None = None
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
        frame = frame.f_back  # type: ignore[assignment]
    return outermost if found > 1 else None


def settled_elsewhere(breaker: Any, permit: Any, mark: int) -> bool:
    """True when the call admitted by *permit* must record nothing of its own: a call nested
    in it through the same breaker already recorded its outcome (a failure that the nested
    call's fallback answered), or it runs nested in an outer call through the same breaker,
    whose outcome is the one the breaker counts.

    Args:
        breaker: the call's breaker.
        permit: the call's permit.
        mark: the breaker's record number when the call began (``record_mark()``).
    """
    return recorded_since(breaker, mark) or outer_call(breaker, permit) is not None
