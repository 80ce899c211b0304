"""The permission a breaker hands out for one call, and the trial a thread or task runs.

A :class:`Permit` is stamped with the breaker's state generation: an outcome whose
generation is no longer current is dropped. Nested use of one breaker is one call: the
record-number context variable, the Nest marks and the stack walk that finds an outer call
live in ``nesting.py``; the trial variable here is set only while a HALF_OPEN trial runs
(never on the CLOSED hot path).
"""

from __future__ import annotations

import contextvars
import math
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from .states import CircuitState

from .errors import ConfigError
from .knobs import MAX_LIFETIME_MINUTES
from .nesting import entering

__all__ = ["Permit", "View", "validate_ttl", "trial_in_progress", "enter_trial", "leave_trial"]

#: ``(breaker, permit)``: the trial this thread or task is running through a breaker.
_TRIAL: contextvars.ContextVar[tuple[Any, Permit] | None] = contextvars.ContextVar("baldur_trial", default=None)


def trial_in_progress(breaker: Any) -> Permit | None:
    """The permit this thread or task already holds for *breaker*, or None: a trial's (a
    call nested in a trial runs on it, neither taking a slot nor refused), or the one a call
    entered again under its Nest was admitted with (see core/nesting.py)."""
    running = _TRIAL.get()
    if running is not None and running[0] is breaker:
        return running[1]
    admitted: Permit | None = entering(breaker)  # a call entered again under its Nest keeps its permit
    return admitted


def enter_trial(breaker: Any, permit: Permit) -> contextvars.Token[tuple[Any, Permit] | None]:
    """Mark *permit*'s trial as running in this thread or task; pass the token to :func:`leave_trial`."""
    return _TRIAL.set((breaker, permit))


def leave_trial(token: contextvars.Token[tuple[Any, Permit] | None]) -> None:
    """End what :func:`enter_trial` marked."""
    _TRIAL.reset(token)


class Permit:
    """Permission for one call, stamped with the breaker's state generation.

    Attributes:
        generation (int): the breaker's generation when the call was admitted.
        trial (bool): True for a HALF_OPEN probe.
        dry_run (bool): True when dry-run let through a call it would have rejected; its
            outcome is never recorded.
        token (str | None): the probe slot of a trial: a shared store's lease, or
            ``"local-<n>"``, a slot of the breaker's own record (taken while it judges alone).
        started (float | None): monotonic admission time (seconds) while the slow-call
            trigger is on: the outcome is slow when it comes that long after.
    """

    __slots__ = ("generation", "trial", "dry_run", "token", "started")

    def __init__(
        self,
        generation: int,
        trial: bool = False,
        dry_run: bool = False,
        token: str | None = None,
        started: float | None = None,
    ) -> None:
        self.generation = generation
        self.trial = trial
        self.dry_run = dry_run
        self.token = token  # a trial's probe slot: a store's lease, or local-<n> (its own record)
        self.started = started  # monotonic admission time, while the slow-call trigger is on

    def __repr__(self) -> str:
        kind = "trial" if self.trial else ("dry-run" if self.dry_run else "closed")
        return f"<Permit {kind} gen={self.generation}>"


def validate_ttl(ttl_minutes: Any, default: float) -> float:
    """Check a force lifetime in minutes (``None`` -> *default*). Raises ConfigError."""
    if ttl_minutes is None:
        ttl_minutes = default
    if isinstance(ttl_minutes, bool) or not isinstance(ttl_minutes, (int, float)):
        raise ConfigError(f"ttl_minutes={ttl_minutes!r}: expected a number of minutes")
    if not math.isfinite(ttl_minutes) or ttl_minutes <= 0 or ttl_minutes > MAX_LIFETIME_MINUTES:
        raise ConfigError(
            f"ttl_minutes={ttl_minutes!r}: must be greater than 0 and at most {MAX_LIFETIME_MINUTES} minutes"
        )
    return float(ttl_minutes)


class View(NamedTuple):
    """What a breaker's store strategy reads of its state (``SharedMachine.view``).

    Attributes:
        state (CircuitState): the local state.
        forced (str | None): the force held locally.
        force_until (float): monotonic deadline of that force (seconds).
        open_until (float): monotonic end of the current automatic open (seconds).
        sync_due (float): monotonic time of the next due consult of the store (seconds).
    """

    state: CircuitState
    forced: str | None
    force_until: float
    open_until: float
    sync_due: float
