"""A deliberately naive re-implementation of the breaker rules, for model-based testing.

Nothing here is optimised: the window is a ``deque`` of booleans, the rate is computed
with exact fractions, every transition is a plain method. ``tests/core/test_model.py``
drives this model and the real :class:`~baldur_django.core.breaker.CircuitBreaker` with
the same random operations and compares them after every step.

Rules covered (REQUIREMENTS section 2): CB-1 states, CB-2 consecutive trigger, CB-3 rate
trigger over the last N outcomes gated by ``minimum_calls`` (threshold 0 disables it),
CB-4 OPEN rejects, CB-5 lazy HALF_OPEN after the recovery timeout, CB-6 trial budget per
round, N successes close and one failed trial reopens, CB-7 closing clears the counts,
CB-8 stale outcomes are dropped, CB-10 ignored outcomes count for nothing and give a trial
slot back, CB-11 returned failure statuses are failures (the caller classifies them).

Out of scope: forces, dry-run, the 429 cascade and cooldowns (the model test never
produces a 429).

Modelling choices the requirements leave open, made to match the implementation:

* Opening keeps the consecutive count and the window frozen as they were at the trip;
  only closing clears them (CB-7). Nothing recorded while OPEN or HALF_OPEN enters them.
* When one failure reaches both the consecutive and the rate trigger, either trigger name
  is accepted (``Transition.triggers`` holds every acceptable name).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["ModelPermit", "Transition", "Rejection", "ReferenceBreaker"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True)
class ModelPermit:
    """What the model handed out: the generation it belongs to and whether it is a trial."""

    generation: int
    trial: bool


@dataclass(frozen=True)
class Transition:
    """One expected ``state_changed`` event; *triggers* is the set of acceptable trigger names."""

    from_state: str
    to_state: str
    triggers: frozenset[str]


@dataclass(frozen=True)
class Rejection:
    """An expected ``CircuitOpenError``: its reason and ``retry_after`` (None when unknown)."""

    reason: str
    retry_after: float | None


@dataclass
class ReferenceBreaker:
    """The model. Times are the fake clock's monotonic seconds, passed in by the caller.

    Args (all required, keyword-only via the dataclass fields):
        failure_threshold (int): consecutive failures that open (CB-2).
        failure_rate_threshold (float): percent, 0 disables the rate trigger (CB-3).
        sliding_window_size (int): how many recent CLOSED outcomes the window keeps.
        minimum_calls (int): outcomes the window needs before the rate trigger applies.
        recovery_timeout (float): seconds OPEN before the breaker admits probes (CB-5).
        half_open_max_calls (int): trials per round and successes needed to close (CB-6).
    """

    failure_threshold: int
    failure_rate_threshold: float
    sliding_window_size: int
    minimum_calls: int
    recovery_timeout: float
    half_open_max_calls: int

    state: str = CLOSED
    generation: int = 0
    consecutive_failures: int = 0
    outcomes: deque = field(default_factory=deque)  # True = failure, newest on the right
    probe_at: float | None = None  # monotonic time the OPEN breaker may probe again
    trials_taken: int = 0
    trial_successes: int = 0
    transitions: list[Transition] = field(default_factory=list)
    rejections: int = 0

    # ------------------------------------------------------------------ reading
    @property
    def window_calls(self) -> int:
        return len(self.outcomes)

    @property
    def window_failures(self) -> int:
        return sum(1 for failed in self.outcomes if failed)

    def tick(self, now: float) -> None:
        """Apply the recovery timeout lazily, as any call or read does (CB-5)."""
        if self.state == OPEN and now >= self.probe_at:
            self._move(HALF_OPEN, {"recovery_timeout"})

    def read_state(self, now: float) -> str:
        self.tick(now)
        return self.state

    # ---------------------------------------------------------------- admission
    def acquire(self, now: float) -> ModelPermit | Rejection:
        """A permit, or the rejection the breaker must raise (CB-4, CB-6)."""
        self.tick(now)
        if self.state == CLOSED:
            return ModelPermit(self.generation, trial=False)
        if self.state == HALF_OPEN:
            if self.trials_taken < self.half_open_max_calls:
                self.trials_taken += 1
                return ModelPermit(self.generation, trial=True)
            self.rejections += 1
            return Rejection("half_open_full", None)
        self.rejections += 1
        return Rejection("open", self.probe_at - now)

    # ---------------------------------------------------------------- outcomes
    def is_stale(self, permit: ModelPermit) -> bool:
        """CB-8: the breaker changed state since the permit was handed out."""
        return permit.generation != self.generation

    def success(self, permit: ModelPermit, now: float) -> None:
        if self.is_stale(permit):
            return
        if permit.trial:
            self.trial_successes += 1
            if self.trial_successes == self.half_open_max_calls:
                self._close()
            return
        self.consecutive_failures = 0
        self._remember(False)
        if self._rate_reached():
            self._open(now, {"failure_rate"})

    def failure(self, permit: ModelPermit, now: float) -> None:
        if self.is_stale(permit):
            return
        if permit.trial:
            self._open(now, {"half_open_failure"})
            return
        self.consecutive_failures += 1
        self._remember(True)
        triggers = set()
        if self.consecutive_failures >= self.failure_threshold:
            triggers.add("consecutive_failures")
        if self._rate_reached():
            triggers.add("failure_rate")
        if triggers:
            self._open(now, triggers)

    def ignored(self, permit: ModelPermit) -> None:
        """Neither success nor failure; a current trial gives its slot back (CB-10)."""
        if permit.trial and not self.is_stale(permit):
            self.trials_taken -= 1

    # ------------------------------------------------------------------ helpers
    def _remember(self, failed: bool) -> None:
        self.outcomes.append(failed)
        while len(self.outcomes) > self.sliding_window_size:
            self.outcomes.popleft()

    def _rate_reached(self) -> bool:
        if self.failure_rate_threshold == 0:
            return False
        calls = len(self.outcomes)
        if calls < self.minimum_calls:
            return False
        return Fraction(self.window_failures * 100, calls) >= Fraction(self.failure_rate_threshold)

    def _move(self, to_state: str, triggers: set[str]) -> None:
        self.transitions.append(Transition(self.state, to_state, frozenset(triggers)))
        self.state = to_state
        self.generation += 1
        self.trials_taken = 0
        self.trial_successes = 0

    def _open(self, now: float, triggers: set[str]) -> None:
        self._move(OPEN, triggers)
        self.probe_at = now + self.recovery_timeout

    def _close(self) -> None:
        self._move(CLOSED, {"half_open_success"})
        self.probe_at = None
        self.consecutive_failures = 0
        self.outcomes.clear()
