"""How long a half-open trial holds its slot in a shared store: the call's own bound when
one is known.

A trial admitted by the shared store holds a lease on its slot, so a worker killed during
the trial cannot keep the breaker half-open for ever. By default the lease is
``BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS``; a caller that knows how long its call can take
at most (an HTTP client's timeout) says so with :func:`call_bound`, and a trial admitted
inside it leases its slot for that bound plus :data:`LEASE_MARGIN`, when that is shorter.
The HTTP adapters do this for every request with its timeout.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["LEASE_MARGIN", "call_bound", "enter_call_bound", "leave_call_bound", "probe_lease"]

_NEVER = float("inf")

#: Seconds added to a call's own bound to make its trial lease (the time between the lease
#: being written and the call starting, and its outcome being written after it ends).
LEASE_MARGIN = 1.0
# The bound of the call running in this thread or task (seconds), while one is known.
_CALL_BOUND: contextvars.ContextVar[float | None] = contextvars.ContextVar("baldur_call_bound", default=None)


@contextlib.contextmanager
def call_bound(seconds: float | None) -> Iterator[None]:
    """Say how long the calls made inside the block can take at most (their own timeout), so
    a half-open trial among them leases its slot in the shared store for that long plus
    :data:`LEASE_MARGIN` instead of ``BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS``, when that
    is shorter: a worker killed during the trial then frees the slot within the call's own
    bound. The HTTP adapters do this with each request's timeout.

    Args:
        seconds: the bound, seconds; None (or not a positive finite number) says nothing.

    Yields:
        None. Raises nothing.
    """
    token = enter_call_bound(seconds)
    try:
        yield
    finally:
        leave_call_bound(token)


def enter_call_bound(seconds: float | None) -> contextvars.Token[float | None]:
    """:func:`call_bound` without the ``with``: set the bound (seconds, or None) for this
    thread or task and return the token to hand to :func:`leave_call_bound` afterwards."""
    known = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 < seconds < _NEVER
    return _CALL_BOUND.set(float(seconds) if known else None)  # type: ignore[arg-type]  # checked just above


def leave_call_bound(token: contextvars.Token[float | None]) -> None:
    """Put back the bound that held before :func:`enter_call_bound` returned *token*."""
    _CALL_BOUND.reset(token)


def probe_lease(configured: float) -> float:
    """The lease of a trial admitted now (seconds): *configured*, or the bound given to
    :func:`call_bound` plus :data:`LEASE_MARGIN` when that is shorter."""
    bound = _CALL_BOUND.get()
    if bound is None:
        return configured
    return min(configured, bound + LEASE_MARGIN)
