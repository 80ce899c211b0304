"""Model-based test of one breaker: CB-1..CB-8, CB-10, CB-11, CB-15..CB-17.

A hypothesis state machine drives a real :class:`CircuitBreaker` (fake clock, private
event bus) and the naive :class:`ReferenceBreaker` of ``reference_model.py`` through the
same random operations: calls that succeed, fail, raise an ignored exception or a
``BaseException``, return a status; calls that take time (the clock moves between the
admission and the outcome, so slow outcomes happen, CB-17); permits held and completed
later (stale outcomes); clock advances around the recovery timeout, by whole and half
seconds and onto the next whole second (the time window's buckets, CB-15); state reads.
Configurations cover both window types, the recovery backoff on and off (CB-16) and the
slow-call trigger on and off. After each operation the two must agree on the state, the
counts (slow calls included), the trial counters, the open duration, its end and the
number of consecutive opens, every rejection (reason and ``retry_after``) and every
published transition with its trigger.

The clock advance is the one step not followed by a snapshot: a snapshot evaluates the
recovery timeout, and we want the *next* operation (an acquire, a state read, a stale
outcome) to be the one that has to apply it lazily (CB-5).

429 is never produced: the cascade is out of scope for this model.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.runner import settle_exception, settle_result
from baldur_django.core.testing import FakeClock, RecordingListener

from .reference_model import ModelPermit, ReferenceBreaker, Rejection


class IgnoredError(Exception):
    """Configured in ``ignore_exceptions``: neither success nor failure (CB-10)."""


class IgnoredChild(IgnoredError):
    """Subclasses of an ignored type are ignored too (CB-10)."""


class Response:
    """The smallest object carrying an HTTP status (CB-11)."""

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


# How a finished call is reported, and what the model must count it as.
OUTCOMES = {
    "return_value": "success",  # a plain value: success
    "record_success": "success",  # the low-level API
    "status_200": "success",
    "status_404": "success",  # on neither list: a success (CB-3)
    "status_500": "failure",
    "status_503": "failure",
    "raise_error": "failure",  # a counted exception
    "record_failure": "failure",
    "raise_ignored": "ignored",
    "raise_ignored_child": "ignored",
    "raise_keyboard_interrupt": "ignored",  # BaseException, never a failure (CB-10)
    "record_ignored": "ignored",
}


@st.composite
def configs(draw):
    window = draw(st.integers(1, 10))
    timed_window = draw(st.booleans())
    recovery_timeout = draw(st.sampled_from([1, 2.5, 10, 30]))
    cfg = {
        "failure_threshold": draw(st.integers(1, 5)),
        "failure_rate_threshold": draw(st.one_of(st.integers(0, 100), st.sampled_from([0, 12.5, 33.3, 66.7, 100]))),
        "sliding_window_size": window,
        # a time window counts minimum_calls over its seconds: not bounded by the size (CB-15)
        "minimum_calls": draw(st.integers(1, 8 if timed_window else window)),
        "recovery_timeout": recovery_timeout,
        "half_open_max_calls": draw(st.integers(1, 3)),
    }
    if timed_window:  # CB-15
        cfg["sliding_window_type"] = "time"
        cfg["sliding_window_seconds"] = draw(st.sampled_from([1, 2, 3, 5, 10]))
    factor = draw(st.sampled_from([None, 1.0, 1.5, 2.0, 3.0, 1000.0]))  # CB-16; None: the default (off)
    if factor is not None:
        cfg["recovery_backoff_factor"] = factor
        # powers of these factors times these timeouts are exact floats: the model's
        # exact durations and the breaker's float ones are the same numbers
        cap = draw(st.sampled_from([None, 1, 2, 3.5, 8]))  # x recovery_timeout; None: the default 600 s
        if cap is not None:
            cfg["recovery_timeout_max"] = recovery_timeout * cap
    slow = draw(st.sampled_from([0, 0, 0.25, 1, 2.5]))  # CB-17; 0 = off
    if slow:
        cfg["slow_call_duration"] = slow
        cfg["slow_call_rate_threshold"] = draw(st.one_of(st.integers(0, 100), st.sampled_from([0, 33.3, 50, 100])))
    return cfg


class BreakerVersusModel(RuleBasedStateMachine):
    """CB-1..CB-8, CB-10, CB-11, CB-15..CB-17: the real breaker behaves like the reference model."""

    @initialize(cfg=configs())
    def build(self, cfg):
        overrides = dict(cfg, ignore_exceptions=(IgnoredError,))
        config = build_config("model", overrides, SettingsSource(environ={}))
        self.clock = FakeClock()
        self.bus = EventBus()
        self.listener = RecordingListener(self.bus)
        self.breaker = CircuitBreaker("model", config, clock=self.clock, bus=self.bus)
        self.model = ReferenceBreaker(
            failure_threshold=config.failure_threshold,
            failure_rate_threshold=config.failure_rate_threshold,
            sliding_window_size=config.sliding_window_size,
            minimum_calls=config.minimum_calls,
            recovery_timeout=config.recovery_timeout,
            half_open_max_calls=config.half_open_max_calls,
            sliding_window_type=config.sliding_window_type,
            sliding_window_seconds=config.sliding_window_seconds,
            recovery_backoff_factor=config.recovery_backoff_factor,
            recovery_timeout_max=config.recovery_timeout_max,
            slow_call_duration=config.slow_call_duration,
            slow_call_rate_threshold=config.slow_call_rate_threshold,
        )
        # the drawn knobs reach the configuration unchanged (no silent adjustment)
        for key, value in cfg.items():
            assert getattr(config, key) == value, (key, getattr(config, key), value)
        if "recovery_timeout_max" not in cfg:
            assert config.recovery_timeout_max == 600
        self.held: list[tuple[object, ModelPermit]] = []
        self.compare()

    # --------------------------------------------------------------- plumbing
    def now(self) -> float:
        return self.clock.monotonic()

    def acquire_both(self):
        """Acquire from both; check they agree on admission. Returns (permit, model_permit) or None."""
        expected = self.model.acquire(self.now())
        try:
            permit = self.breaker.acquire()
        except CircuitOpenError as rejection:
            assert isinstance(expected, Rejection), f"breaker rejected ({rejection.reason}), model admitted {expected}"
            assert rejection.reason == expected.reason
            assert rejection.retry_after == expected.retry_after
            assert rejection.service == "model"
            return None
        assert not isinstance(expected, Rejection), f"breaker admitted {permit!r}, model expected {expected}"
        assert permit.trial == expected.trial
        assert permit.started == expected.started  # stamped only while the slow-call trigger is on (CB-17)
        assert not permit.dry_run
        return permit, expected

    def settle(self, permit, expected: ModelPermit, how: str) -> None:
        """Report the outcome *how* through the public recording paths, and to the model."""
        b = self.breaker
        if how == "return_value":
            settle_result(core_of(b), permit, {"ok": True})
        elif how == "record_success":
            b.record_success(permit)
        elif how.startswith("status_"):
            settle_result(core_of(b), permit, Response(int(how[len("status_") :])))
        elif how == "raise_error":
            assert settle_exception(core_of(b), permit, RuntimeError("boom")) is True
        elif how == "record_failure":
            b.record_failure(permit)
        elif how == "raise_ignored":
            assert settle_exception(core_of(b), permit, IgnoredError()) is False
        elif how == "raise_ignored_child":
            assert settle_exception(core_of(b), permit, IgnoredChild()) is False
        elif how == "raise_keyboard_interrupt":
            assert settle_exception(core_of(b), permit, KeyboardInterrupt()) is False
        elif how == "record_ignored":
            b.record_ignored(permit)
        else:  # pragma: no cover - a typo in OUTCOMES
            raise AssertionError(how)
        kind = OUTCOMES[how]
        if kind == "success":
            self.model.success(expected, self.now(), self.clock.wall())
        elif kind == "failure":
            self.model.failure(expected, self.now(), self.clock.wall())
        else:
            self.model.ignored(expected)

    def compare(self) -> None:
        snap = self.breaker.snapshot()
        m = self.model
        m.tick(self.now())  # the snapshot evaluated the recovery timeout: so does the model
        got = {
            "state": snap["state"],
            "consecutive_failures": snap["consecutive_failures"],
            "window_calls": snap["window_calls"],
            "window_failures": snap["window_failures"],
            "half_open_trials": snap["half_open_trials"],
            "half_open_successes": snap["half_open_successes"],
            "window_slow_calls": snap["window_slow_calls"],
            "open_duration": snap["open_duration"],
            "open_until": snap["open_until"],
            "consecutive_opens": snap["consecutive_opens"],
        }
        want = {
            "state": m.state,
            "consecutive_failures": m.consecutive_failures,
            "window_calls": m.window_calls,
            "window_failures": m.window_failures,
            "half_open_trials": m.trials_taken if m.state == "half_open" else 0,
            "half_open_successes": m.trial_successes if m.state == "half_open" else 0,
            "window_slow_calls": m.window_slow_calls,
            "open_duration": m.open_duration,
            # Unix seconds: the breaker converts its monotonic deadline (to the microsecond),
            # the model adds wall times, so the two agree to within a microsecond
            "open_until": m.open_until if m.open_until is None else pytest.approx(m.open_until, abs=1e-6),
            "consecutive_opens": m.consecutive_opens,
        }
        assert got == want
        self.compare_events()
        published = self.listener.transitions()
        assert snap["last_trigger"] == (published[-1][2] if published else None)

    def compare_events(self) -> None:
        m = self.model
        published = self.listener.transitions()
        assert len(published) == len(m.transitions), (published, m.transitions)
        for (from_state, to_state, trigger), expected in zip(published, m.transitions, strict=True):
            assert (from_state, to_state) == (expected.from_state, expected.to_state), (published, m.transitions)
            assert trigger in expected.triggers, (trigger, expected)
        assert self.listener.kinds().count("call_rejected") == m.rejections
        assert set(self.listener.kinds()) <= {"state_changed", "call_rejected"}

    # ------------------------------------------------------------------ rules
    @rule(how=st.sampled_from(sorted(OUTCOMES)))
    def call(self, how):
        """One call: acquire, then report its outcome at once."""
        admitted = self.acquire_both()
        if admitted is not None:
            self.settle(*admitted, how)
        self.compare()

    @rule(how=st.sampled_from(sorted(OUTCOMES)), takes=st.sampled_from([0.5, 0.999, 1.0, 1.001, 1.5, 4.0]))
    def timed_call(self, how, takes):
        """One call that lasts *takes* times the slow-call duration (1 s when the trigger is
        off): the clock moves between admission and outcome, so it may be slow (CB-17) and
        may complete in a later second than it started (CB-15)."""
        admitted = self.acquire_both()
        if admitted is not None:
            self.clock.advance(takes * (self.model.slow_call_duration or 1.0))
            self.settle(*admitted, how)
        self.compare()

    @rule()
    def hold(self):
        """Acquire a permit and keep it: the call is still running (CB-8 later)."""
        admitted = self.acquire_both()
        if admitted is not None:
            self.held.append(admitted)
        self.compare()

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(sorted(OUTCOMES)))
    def finish_held(self, data, how):
        """A held call finishes now, possibly after the breaker changed state (stale)."""
        index = data.draw(st.integers(0, len(self.held) - 1), label="held index")
        permit, expected = self.held.pop(index)
        self.settle(permit, expected, how)
        self.compare()

    @rule(fraction=st.sampled_from([0.1, 0.5, 0.999, 1.0, 1.001, 2.0]))
    def advance(self, fraction):
        """Move the clock by a fraction of the recovery timeout. No snapshot: the next
        operation must apply the timeout lazily by itself (CB-5)."""
        self.clock.advance(self.model.recovery_timeout * fraction)
        self.compare_events()  # a clock move alone publishes nothing

    @precondition(lambda self: self.model.probe_at is not None and self.model.state == "open")
    @rule()
    def advance_to_probe_time(self):
        """Land exactly on the recovery deadline: HALF_OPEN starts at the deadline (CB-5)."""
        self.clock.advance(self.model.probe_at - self.now())

    @rule(seconds=st.sampled_from([0.5, 1, 2, 5, 11]))
    def advance_seconds(self, seconds):
        """Move the clock by whole or half seconds: a time window's old seconds age out
        (CB-15). No snapshot, as for ``advance``."""
        self.clock.advance(seconds)
        self.compare_events()

    @rule()
    def advance_to_next_second(self):
        """Land exactly on the next whole second of the monotonic clock: a time window's
        oldest second leaves it at that instant (CB-15)."""
        now = self.now()
        self.clock.advance(math.floor(now) + 1 - now)
        assert self.now() == math.floor(now) + 1
        self.compare_events()

    @rule()
    def read_state(self):
        """Reading ``state`` applies the timeout and never takes a trial slot (CB-5)."""
        expected = self.model.read_state(self.now())
        assert self.breaker.state.value == expected
        self.compare()


# Derandomized, bounded: the same few hundred programs every run, in a few seconds. 600
# rather than 400 since CB-15..CB-17 widened the configurations drawn (about 1.6 times the
# CPU time of the 400 programs before them).
BreakerVersusModel.TestCase.settings = settings(
    derandomize=True,
    database=None,
    max_examples=600,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBreakerVersusModel = BreakerVersusModel.TestCase
# a stateful machine's TestCase gets no marker from hypothesis' plugin: name its budget group
pytestmark = pytest.mark.hypothesis
