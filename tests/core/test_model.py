"""Model-based test of one breaker: CB-1..CB-8, CB-10, CB-11.

A hypothesis state machine drives a real :class:`CircuitBreaker` (fake clock, private
event bus) and the naive :class:`ReferenceBreaker` of ``reference_model.py`` through the
same random operations: calls that succeed, fail, raise an ignored exception or a
``BaseException``, return a status; permits held and completed later (stale outcomes);
clock advances around the recovery timeout; state reads. After each operation the two
must agree on the state, the counts, the trial counters, every rejection (reason and
``retry_after``) and every published transition.

The clock advance is the one step not followed by a snapshot: a snapshot evaluates the
recovery timeout, and we want the *next* operation (an acquire, a state read, a stale
outcome) to be the one that has to apply it lazily (CB-5).

429 is never produced: the cascade is out of scope for this model.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from baldur_django.core.breaker import CircuitBreaker
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
    return {
        "failure_threshold": draw(st.integers(1, 5)),
        "failure_rate_threshold": draw(st.one_of(st.integers(0, 100), st.sampled_from([0, 12.5, 33.3, 66.7, 100]))),
        "sliding_window_size": window,
        "minimum_calls": draw(st.integers(1, window)),
        "recovery_timeout": draw(st.sampled_from([1, 2.5, 10, 30])),
        "half_open_max_calls": draw(st.integers(1, 3)),
    }


class BreakerVersusModel(RuleBasedStateMachine):
    """CB-1..CB-8, CB-10, CB-11: the real breaker behaves like the reference model."""

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
        )
        assert config.minimum_calls == cfg["minimum_calls"]
        assert config.failure_rate_threshold == cfg["failure_rate_threshold"]
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
        assert not permit.dry_run
        return permit, expected

    def settle(self, permit, expected: ModelPermit, how: str) -> None:
        """Report the outcome *how* through the public recording paths, and to the model."""
        b = self.breaker
        if how == "return_value":
            settle_result(b, permit, {"ok": True})
        elif how == "record_success":
            b.record_success(permit)
        elif how.startswith("status_"):
            settle_result(b, permit, Response(int(how[len("status_"):])))
        elif how == "raise_error":
            assert settle_exception(b, permit, RuntimeError("boom")) is True
        elif how == "record_failure":
            b.record_failure(permit)
        elif how == "raise_ignored":
            assert settle_exception(b, permit, IgnoredError()) is False
        elif how == "raise_ignored_child":
            assert settle_exception(b, permit, IgnoredChild()) is False
        elif how == "raise_keyboard_interrupt":
            assert settle_exception(b, permit, KeyboardInterrupt()) is False
        elif how == "record_ignored":
            b.record_ignored(permit)
        else:  # pragma: no cover - a typo in OUTCOMES
            raise AssertionError(how)
        kind = OUTCOMES[how]
        if kind == "success":
            self.model.success(expected, self.now())
        elif kind == "failure":
            self.model.failure(expected, self.now())
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
        }
        want = {
            "state": m.state,
            "consecutive_failures": m.consecutive_failures,
            "window_calls": m.window_calls,
            "window_failures": m.window_failures,
            "half_open_trials": m.trials_taken if m.state == "half_open" else 0,
            "half_open_successes": m.trial_successes if m.state == "half_open" else 0,
        }
        assert got == want
        self.compare_events()

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

    @rule()
    def read_state(self):
        """Reading ``state`` applies the timeout and never takes a trial slot (CB-5)."""
        expected = self.model.read_state(self.now())
        assert self.breaker.state.value == expected
        self.compare()


# Derandomized, bounded: the same few hundred programs every run, in a few seconds.
BreakerVersusModel.TestCase.settings = settings(
    derandomize=True,
    database=None,
    max_examples=400,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBreakerVersusModel = BreakerVersusModel.TestCase
