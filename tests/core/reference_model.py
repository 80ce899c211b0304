"""A deliberately naive re-implementation of the breaker rules, for model-based testing.

Nothing here is optimised: the window is a plain list of ``(completion time, failed, slow)``
entries filtered at every read, rates are computed with exact fractions, the number of
consecutive opens is a plain counter, every transition is a plain method.
``tests/core/test_model.py`` drives this model and the real
:class:`~baldur_django.core.breaker.CircuitBreaker` with the same random operations and
compares them after every step.

Rules covered (REQUIREMENTS section 2): CB-1 states, CB-2 consecutive trigger, CB-3 rate
trigger over the last N outcomes gated by ``minimum_calls`` (threshold 0 disables it),
CB-4 OPEN rejects, CB-5 lazy HALF_OPEN after the recovery timeout, CB-6 trial budget per
round, N successes close and one failed trial reopens, CB-7 closing clears the counts,
CB-8 stale outcomes are dropped, CB-10 ignored outcomes count for nothing and give a trial
slot back, CB-11 returned failure statuses are failures (the caller classifies them),
CB-15 the time-based window (the outcomes of the calls completed in the last N whole
seconds of the monotonic clock), CB-16 the recovery backoff (the k-th consecutive
automatic open lasts ``min(recovery_timeout * factor**(k-1), recovery_timeout_max)``, a
close resets k), CB-17 slow calls (a success or failure lasting at least
``slow_call_duration`` is slow; the slow-call rate opens with ``slow_call_rate``; a slow
trial fails its round; ignored outcomes are never slow; the failure rate wins a tie).

Out of scope: forces, dry-run, the Level 3 freeze, the 429 cascade and cooldowns (the
model test never produces a 429).

Modelling choices the requirements leave open, made to match the implementation:

* Opening keeps the consecutive count and the window as they were at the trip; only
  closing clears them (CB-7). Nothing recorded while OPEN or HALF_OPEN enters them. A
  time window still ages while OPEN (its seconds pass whatever the state).
* Triggers are evaluated when an outcome is recorded, never because time passed: a time
  window whose successes aged out leaving a failure rate above the threshold trips at the
  next recorded outcome, not before.
* When one failure reaches both the consecutive and a rate trigger, either trigger name
  is accepted (``Transition.triggers`` holds every acceptable name). The failure rate and
  the slow-call rate are not ambiguous: the failure rate wins (CB-17).
* A trial that fails *and* is slow reopens with either ``half_open_failure`` or
  ``slow_call_rate`` (CB-17 names the trigger of a slow trial, CB-6 that of a failed one).
* With the backoff off (factor 1.0) every open lasts ``recovery_timeout`` and k still counts
  the automatic opens since the last close (CB-16's letter), capped at the first value whose
  duration reaches the maximum.
* Times are the fake clock's float readings, used as they come: a call is slow when
  ``end - start >= slow_call_duration`` and ``retry_after`` is ``probe_at - now``, the
  formulas of the requirements applied to those readings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["ModelPermit", "Transition", "Rejection", "ReferenceBreaker"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True)
class ModelPermit:
    """What the model handed out: its generation, whether it is a trial, and when it was
    admitted (monotonic seconds) while the slow-call trigger is on (else None)."""

    generation: int
    trial: bool
    started: float | None = None


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


@dataclass(frozen=True)
class Outcome:
    """One recorded CLOSED outcome: when the call completed (monotonic), failed, slow."""

    at: float
    failed: bool
    slow: bool


@dataclass
class ReferenceBreaker:
    """The model. Times are the fake clock's monotonic seconds, passed in by the caller.

    Args (keyword-only via the dataclass fields; the first six are required):
        failure_threshold (int): consecutive failures that open (CB-2).
        failure_rate_threshold (float): percent, 0 disables the rate trigger (CB-3).
        sliding_window_size (int): how many recent CLOSED outcomes a count window keeps.
        minimum_calls (int): outcomes the window needs before the rate triggers apply.
        recovery_timeout (float): seconds OPEN before the first probe (CB-5).
        half_open_max_calls (int): trials per round and successes needed to close (CB-6).
        sliding_window_type (str): ``"count"`` or ``"time"`` (CB-15).
        sliding_window_seconds (int): whole seconds a time window spans (CB-15).
        recovery_backoff_factor (float): 1.0 = no backoff (CB-16).
        recovery_timeout_max (float | None): seconds, cap of an open; None = no cap (CB-16).
        slow_call_duration (float): seconds that make a call slow; 0 = off (CB-17).
        slow_call_rate_threshold (float): percent of slow calls that opens; 0 disables (CB-17).
    """

    failure_threshold: int
    failure_rate_threshold: float
    sliding_window_size: int
    minimum_calls: int
    recovery_timeout: float
    half_open_max_calls: int
    sliding_window_type: str = "count"
    sliding_window_seconds: int = 60
    recovery_backoff_factor: float = 1.0
    recovery_timeout_max: float | None = None
    slow_call_duration: float = 0.0
    slow_call_rate_threshold: float = 100.0

    state: str = CLOSED
    generation: int = 0
    consecutive_failures: int = 0
    outcomes: list[Outcome] = field(default_factory=list)  # oldest first; filtered at every read
    now: float = float("-inf")  # the latest time the model was told about
    probe_at: float | None = None  # monotonic time the OPEN breaker may probe again
    opened_wall: float | None = None  # wall-clock time of the latest open (None once closed)
    opens_since_close: int = 0  # automatic opens since the last close, uncapped (CB-16)
    trials_taken: int = 0
    trial_successes: int = 0
    transitions: list[Transition] = field(default_factory=list)
    rejections: int = 0

    # ------------------------------------------------------------------ reading
    def window(self) -> list[Outcome]:
        """The outcomes the rate triggers see at ``self.now`` (CB-3, CB-15)."""
        if self.sliding_window_type == "time":
            # the window holds the whole seconds floor(now) - N + 1 .. floor(now)
            newest = math.floor(self.now)
            return [o for o in self.outcomes if newest - math.floor(o.at) < self.sliding_window_seconds]
        return self.outcomes[-self.sliding_window_size :]

    @property
    def window_calls(self) -> int:
        return len(self.window())

    @property
    def window_failures(self) -> int:
        return sum(1 for o in self.window() if o.failed)

    @property
    def window_slow_calls(self) -> int:
        return sum(1 for o in self.window() if o.slow)

    def duration_of(self, k: int) -> Fraction:
        """How long the k-th consecutive automatic open lasts, exactly (CB-16)."""
        seconds = Fraction(self.recovery_timeout) * Fraction(self.recovery_backoff_factor) ** (k - 1)
        if self.recovery_timeout_max is not None:
            seconds = min(seconds, Fraction(self.recovery_timeout_max))
        return seconds

    @property
    def consecutive_opens(self) -> int:
        """k as the breaker stores it: automatic opens since the last close, never past the
        first k whose duration reaches the cap (CB-16)."""
        n = self.opens_since_close
        if self.recovery_timeout_max is None:
            return n
        cap = Fraction(self.recovery_timeout_max)
        k = 1
        while k < n and self.duration_of(k) < cap:
            k += 1
        return min(n, k)

    @property
    def open_duration(self) -> float | None:
        """Seconds the current (or latest, while HALF_OPEN) open lasts; None while CLOSED."""
        if self.state == CLOSED:
            return None
        return float(self.duration_of(max(1, self.opens_since_close)))

    @property
    def open_until(self) -> float | None:
        """Wall-clock end of the current open; None unless OPEN."""
        if self.state != OPEN or self.opened_wall is None:
            return None
        return self.opened_wall + float(self.duration_of(max(1, self.opens_since_close)))

    def tick(self, now: float) -> None:
        """Apply the recovery timeout lazily, as any call or read does (CB-5)."""
        self.now = max(self.now, now)
        if self.state == OPEN and self.probe_at is not None and now >= self.probe_at:
            self._move(HALF_OPEN, {"recovery_timeout"})

    def read_state(self, now: float) -> str:
        self.tick(now)
        return self.state

    # ---------------------------------------------------------------- admission
    @property
    def timing(self) -> bool:
        """The slow-call trigger is on (a duration and a rate threshold, both above 0): every
        permit carries its admission time; with either at 0 nothing is slow (CB-17)."""
        return self.slow_call_duration > 0 and self.slow_call_rate_threshold > 0

    def acquire(self, now: float) -> ModelPermit | Rejection:
        """A permit, or the rejection the breaker must raise (CB-4, CB-6)."""
        self.tick(now)
        started = now if self.timing else None
        if self.state == CLOSED:
            return ModelPermit(self.generation, trial=False, started=started)
        if self.state == HALF_OPEN:
            if self.trials_taken < self.half_open_max_calls:
                self.trials_taken += 1
                return ModelPermit(self.generation, trial=True, started=started)
            self.rejections += 1
            return Rejection("half_open_full", None)
        self.rejections += 1
        assert self.probe_at is not None  # OPEN always has a deadline
        return Rejection("open", self.probe_at - now)

    # ---------------------------------------------------------------- outcomes
    def is_stale(self, permit: ModelPermit) -> bool:
        """CB-8: the breaker changed state since the permit was handed out."""
        return permit.generation != self.generation

    def is_slow(self, permit: ModelPermit, now: float) -> bool:
        """CB-17: the call lasted at least ``slow_call_duration`` on the monotonic clock."""
        return permit.started is not None and now - permit.started >= self.slow_call_duration

    def success(self, permit: ModelPermit, now: float, wall: float | None = None) -> None:
        self.now = max(self.now, now)
        if self.is_stale(permit):
            return
        slow = self.is_slow(permit, now)
        if permit.trial:
            if slow:  # CB-17: a slow trial is a failed trial
                self._open(now, wall, {"slow_call_rate"})
                return
            self.trial_successes += 1
            if self.trial_successes == self.half_open_max_calls:
                self._close()
            return
        self.consecutive_failures = 0  # a slow success is still a success (CB-2)
        self.outcomes.append(Outcome(now, False, slow))
        triggers = self._rate_triggers()
        if triggers:
            self._open(now, wall, triggers)

    def failure(self, permit: ModelPermit, now: float, wall: float | None = None) -> None:
        self.now = max(self.now, now)
        if self.is_stale(permit):
            return
        slow = self.is_slow(permit, now)
        if permit.trial:
            self._open(now, wall, {"half_open_failure", "slow_call_rate"} if slow else {"half_open_failure"})
            return
        self.consecutive_failures += 1
        self.outcomes.append(Outcome(now, True, slow))
        triggers = self._rate_triggers()
        if self.consecutive_failures >= self.failure_threshold:
            triggers.add("consecutive_failures")
        if triggers:
            self._open(now, wall, triggers)

    def ignored(self, permit: ModelPermit) -> None:
        """Neither success nor failure, never slow; a current trial gives its slot back (CB-10)."""
        if permit.trial and not self.is_stale(permit):
            self.trials_taken -= 1

    # ------------------------------------------------------------------ helpers
    def _rate_triggers(self) -> set[str]:
        """The rate triggers the window reaches now: the failure rate, else the slow-call rate."""
        window = self.window()
        calls = len(window)
        if calls == 0 or calls < self.minimum_calls:
            return set()
        failures = sum(1 for o in window if o.failed)
        slow = sum(1 for o in window if o.slow)
        if self.failure_rate_threshold > 0 and Fraction(failures * 100, calls) >= Fraction(self.failure_rate_threshold):
            return {"failure_rate"}  # wins over the slow-call rate (CB-17)
        if (
            self.timing
            and self.slow_call_rate_threshold > 0
            and Fraction(slow * 100, calls) >= Fraction(self.slow_call_rate_threshold)
        ):
            return {"slow_call_rate"}
        return set()

    def _move(self, to_state: str, triggers: set[str]) -> None:
        self.transitions.append(Transition(self.state, to_state, frozenset(triggers)))
        self.state = to_state
        self.generation += 1
        self.trials_taken = 0
        self.trial_successes = 0

    def _open(self, now: float, wall: float | None, triggers: set[str]) -> None:
        self._move(OPEN, triggers)
        self.opens_since_close += 1  # every open the model makes is automatic
        self.probe_at = now + float(self.duration_of(self.opens_since_close))
        self.opened_wall = wall

    def _close(self) -> None:
        self._move(CLOSED, {"half_open_success"})
        self.probe_at = None
        self.opened_wall = None
        self.opens_since_close = 0
        self.consecutive_failures = 0
        self.outcomes.clear()
