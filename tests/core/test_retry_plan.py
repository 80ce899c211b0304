"""The retry engine on its own: ``retry_plan`` driven by hand, and its two interpreters.

The plan is a generator of steps (ATTEMPT, Sleep, Refuse, Done) that receives each
attempt's outcome; these tests drive it step by step against a real breaker on a
FakeClock and assert the exact sequence of steps and what the breaker recorded. The last
part runs ``run_sync`` and ``run_async`` on the same outcome scripts and checks they carry
out the same steps, and that their inline first attempt decides nothing the plan would
not. Covers FAC-2, FAC-3, FAC-4 (which end a fallback may replace), RL-2, RL-5, RL-6,
CB-6, CB-8, CB-10 and OP-5.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest

from baldur_django.core import runner
from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.config import BreakerConfig
from baldur_django.core.errors import CircuitOpenError, RateLimitCooldownError
from baldur_django.core.events import EventBus
from baldur_django.core.retry import (
    ATTEMPT,
    Done,
    Raised,
    Refuse,
    RetryPolicy,
    Returned,
    Sleep,
    retry_plan,
)
from baldur_django.core.testing import FakeClock

NO_JITTER = dict(jitter=0.0, backoff_initial=0.1, backoff_multiplier=2.0, backoff_max=2.0)
POLICY = RetryPolicy(max_attempts=3, **NO_JITTER)


class Response:
    """A returned HTTP response: a status and, optionally, a Retry-After header."""

    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        self.status_code = status_code
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}

    def __repr__(self) -> str:
        return f"<Response {self.status_code}>"


class TooManyRequests(Exception):
    """A raised 429 (RL-1 by its name) carrying a Retry-After in seconds."""

    def __init__(self, retry_after: str) -> None:
        super().__init__(f"429, retry after {retry_after}")
        self.retry_after = retry_after


class Ignored(Exception):
    pass


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(clock: FakeClock, **config: Any) -> CircuitBreaker:
    """A breaker of its own (private event bus) on *clock*."""
    return CircuitBreaker("plan", BreakerConfig(**config), clock=clock, bus=EventBus())


def counts(breaker: CircuitBreaker) -> tuple[int, int, int]:
    snap = breaker.snapshot()
    return snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]


def cascade(breaker: CircuitBreaker) -> tuple[int, int]:
    """``(calls, sightings)`` in the cascade window (a private reading: RL-5 counts attempts)."""
    return core_of(breaker).cascade.totals(core_of(breaker).mono())


def start(breaker: CircuitBreaker, policy: RetryPolicy = POLICY, first: Any = None, permit: Any = None):
    permit = breaker.acquire() if permit is None else permit
    return retry_plan(core_of(breaker), permit, policy, core_of(breaker).clock.monotonic(), first)


def drive(plan, clock: FakeClock, script: list[Any]) -> list[Any]:
    """Carry the plan out by hand: each ATTEMPT takes the next outcome of *script* (a
    callable is called first, for attempts with side effects), each Sleep sleeps on the
    FakeClock (which only advances it). Returns every step, the final Refuse or Done included."""
    outcomes = iter(script)
    steps = []
    step = next(plan)
    while True:
        steps.append(step)
        if step is ATTEMPT:
            outcome = next(outcomes)
            step = plan.send(outcome() if callable(outcome) else outcome)
        elif isinstance(step, Sleep):
            clock.sleep(step.seconds)  # a FakeClock's sleep: advances it and logs the wait
            step = next(plan)
        else:
            assert next(outcomes, None) is None, "the plan ended before the script"
            return steps


# ------------------------------------------------------------------ backoff, FAC-2/3
def test_fac3_failures_back_off_exponentially_and_the_last_one_is_final(clock):
    """FAC-3, FAC-2, RL-5: three failed attempts: attempt, sleep 0.1, attempt, sleep 0.2,
    attempt, done with the last exception (a fallback may replace it); the breaker records
    one failure, the cascade counts three attempts."""
    breaker = make(clock)
    errors = [ConnectionError(str(i)) for i in range(3)]
    plan = start(breaker)
    assert next(plan) is ATTEMPT
    assert plan.send(Raised(errors[0])) == Sleep(0.1)
    assert counts(breaker) == (0, 0, 0)  # nothing final yet
    clock.advance(0.1)
    assert next(plan) is ATTEMPT
    assert plan.send(Raised(errors[1])) == Sleep(0.2)
    clock.advance(0.2)
    assert next(plan) is ATTEMPT
    assert plan.send(Raised(errors[2])) == Done(error=errors[2], fallback=True)
    assert counts(breaker) == (1, 1, 1)
    assert cascade(breaker) == (3, 0)


def test_fac3_backoff_is_capped_at_backoff_max(clock):
    """FAC-3: waits grow by the multiplier from backoff_initial and stop at backoff_max."""
    policy = RetryPolicy(max_attempts=5, backoff_initial=0.1, backoff_multiplier=3.0, backoff_max=0.5, jitter=0.0)
    steps = drive(start(make(clock), policy), clock, [Raised(ConnectionError())] * 5)
    assert [s.seconds for s in steps if isinstance(s, Sleep)] == pytest.approx([0.1, 0.3, 0.5, 0.5])


def test_fac2_a_success_after_failures_is_the_one_recorded_outcome(clock):
    """FAC-2, RL-5: failure, failure response, success: done with the value; one success
    recorded, three attempts in the cascade."""
    breaker = make(clock)
    steps = drive(start(breaker), clock, [Raised(ConnectionError()), Returned(Response(503)), Returned("ok")])
    assert steps == [ATTEMPT, Sleep(0.1), ATTEMPT, Sleep(0.2), ATTEMPT, Done(value="ok")]
    assert counts(breaker) == (0, 1, 0)
    assert cascade(breaker) == (3, 0)


def test_fac3_failure_responses_are_retried_and_the_last_returned_unchanged(clock):
    """FAC-3, FAC-4: all attempts return failure responses: done with the last response as
    the value (never a fallback), recorded as one failure."""
    breaker = make(clock)
    answers = [Response(503), Response(502), Response(500)]
    steps = drive(start(breaker), clock, [Returned(a) for a in answers])
    assert steps[-1] == Done(value=answers[2])
    assert steps[-1].error is None
    assert counts(breaker) == (1, 1, 1)


def test_cb10_an_ignored_exception_ends_the_sequence_unrecorded(clock):
    """CB-10, FAC-3, RL-7: an ignored exception is never retried, never recorded, never
    counted in the cascade, and no fallback replaces it."""
    breaker = make(clock, ignore_exceptions=(Ignored,))
    error = Ignored()
    plan = start(breaker)
    assert next(plan) is ATTEMPT
    assert plan.send(Raised(error)) == Done(error=error, fallback=False)
    assert counts(breaker) == (0, 0, 0)
    assert cascade(breaker) == (0, 0)


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), asyncio.CancelledError()], ids=["KeyboardInterrupt", "CancelledError"]
)
def test_cb10_base_exceptions_end_the_sequence_unrecorded(clock, error):
    """CB-10: a BaseException that is not an Exception is neither success nor failure."""
    breaker = make(clock)
    assert drive(start(breaker), clock, [Raised(error)]) == [ATTEMPT, Done(error=error, fallback=False)]
    assert counts(breaker) == (0, 0, 0)


@pytest.mark.parametrize(
    "error",
    [CircuitOpenError("inner", "open", 5.0), RateLimitCooldownError("inner", 5.0), ValueError("not retried")],
    ids=["CircuitOpenError", "RateLimitCooldownError", "outside-retry_on"],
)
def test_fac3_refusals_and_types_outside_retry_on_are_not_retried(clock, error):
    """FAC-3: CircuitOpenError, RateLimitCooldownError and types outside retry_on end the
    sequence after one attempt; they still count as a failure."""
    policy = RetryPolicy(
        max_attempts=5, retry_on=(ConnectionError, CircuitOpenError, RateLimitCooldownError), **NO_JITTER
    )
    breaker = make(clock)
    assert drive(start(breaker, policy), clock, [Raised(error)]) == [ATTEMPT, Done(error=error, fallback=True)]
    assert counts(breaker) == (1, 1, 1)


def test_fac3_the_budget_stops_the_sequence_before_an_overrunning_wait(clock):
    """FAC-3: with a 0.25-s budget the second backoff (0.2 s at 0.1 s in) would overrun it:
    two attempts, one sleep."""
    policy = RetryPolicy(max_attempts=10, budget_seconds=0.25, **NO_JITTER)
    error = ConnectionError()
    steps = drive(start(make(clock), policy), clock, [Raised(error)] * 2)
    assert steps == [ATTEMPT, Sleep(0.1), ATTEMPT, Done(error=error, fallback=True)]


def test_fac3_the_budget_counts_time_spent_in_attempts(clock):
    """FAC-3: slow attempts eat the budget: the third attempt ends at 3.3 s of a 2.5-s budget."""
    policy = RetryPolicy(max_attempts=10, budget_seconds=2.5, **NO_JITTER)
    error = ConnectionError()

    def slow():
        clock.advance(1.0)
        return Raised(error)

    steps = drive(start(make(clock), policy), clock, [slow] * 3)
    assert steps == [ATTEMPT, Sleep(0.1), ATTEMPT, Sleep(0.2), ATTEMPT, Done(error=error, fallback=True)]


# ----------------------------------------------------------------------- CB-6, CB-8
def test_cb6_a_trial_is_one_attempt_whatever_the_policy(clock):
    """CB-6: a HALF_OPEN trial gets one attempt even with max_attempts=5; its failure reopens."""
    breaker = make(clock, failure_threshold=1, recovery_timeout=1.0)
    breaker.record_failure(breaker.acquire())
    clock.advance(1.0)
    permit = breaker.acquire()
    assert permit.trial
    error = ConnectionError()
    steps = drive(start(breaker, RetryPolicy(max_attempts=5, **NO_JITTER), permit=permit), clock, [Raised(error)])
    assert steps == [ATTEMPT, Done(error=error, fallback=True)]
    assert breaker.state.value == "open"


def test_cb8_no_backoff_once_the_breaker_changed_state_during_the_attempt(clock):
    """FAC-3, CB-8: the breaker was forced open while the attempt ran: no sleep, no further
    attempt; the outcome is recorded once (dropped as stale by the breaker)."""
    breaker = make(clock)
    error = ConnectionError()

    def tripping():
        breaker.force_open(ttl_minutes=1)
        return Raised(error)

    assert drive(start(breaker), clock, [tripping]) == [ATTEMPT, Done(error=error, fallback=True)]
    assert counts(breaker) == (0, 0, 0)


def test_cb8_no_further_attempt_when_the_breaker_trips_during_a_wait(clock):
    """FAC-3, CB-8: a trip during the backoff ends the sequence before the next attempt."""
    breaker = make(clock)
    error = ConnectionError()
    plan = start(breaker)
    assert next(plan) is ATTEMPT
    assert plan.send(Raised(error)) == Sleep(0.1)
    breaker.force_open(ttl_minutes=1)
    assert next(plan) == Done(error=error, fallback=True)


# --------------------------------------------------------------------------- RL-6
def test_rl6_the_first_attempt_waits_out_the_cooldown(clock):
    """RL-6: a cooldown of 5 s is waited out before the first attempt."""
    breaker = make(clock)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=5)
    plan = start(breaker)
    assert next(plan) == Sleep(5.0)
    clock.advance(5.0)
    assert next(plan) is ATTEMPT
    assert plan.send(Returned("ok")) == Done(value="ok")


def test_rl6_backoff_and_cooldown_cost_their_max_not_their_sum(clock):
    """RL-6, RL-2: a 429 with Retry-After 4 and a 1-s backoff: sleep 1, then the 3 s left of
    the cooldown (4 s in all), then the next attempt."""
    policy = RetryPolicy(max_attempts=3, backoff_initial=1.0, backoff_multiplier=1.0, jitter=0.0)
    steps = drive(start(make(clock), policy), clock, [Raised(TooManyRequests("4")), Returned("ok")])
    assert steps == [ATTEMPT, Sleep(1.0), Sleep(3.0), ATTEMPT, Done(value="ok")]


def test_rl6_a_backoff_longer_than_the_cooldown_is_not_extended(clock):
    """RL-6: a 1-s cooldown under a 2-s backoff adds no wait."""
    policy = RetryPolicy(max_attempts=3, backoff_initial=2.0, backoff_multiplier=1.0, jitter=0.0)
    steps = drive(start(make(clock), policy), clock, [Raised(TooManyRequests("1")), Returned("ok")])
    assert steps == [ATTEMPT, Sleep(2.0), ATTEMPT, Done(value="ok")]


def test_rl6_the_gate_is_read_again_after_every_wait(clock):
    """RL-6: a cooldown extended during the wait (another caller met a 429 with Retry-After
    10) is waited out too."""
    breaker = make(clock)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=5)
    plan = start(breaker)
    assert next(plan) == Sleep(5.0)
    clock.advance(5.0)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=10)
    assert next(plan) == Sleep(10.0)
    clock.advance(10.0)
    assert next(plan) is ATTEMPT


def test_rl6_refused_before_any_attempt_records_nothing(clock):
    """RL-6, FAC-4: a 120-s cooldown outlasts the 60-s allowed wait: the first step is a
    refusal, unchained, and nothing is recorded."""
    breaker = make(clock)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=120)
    before = cascade(breaker)
    steps = drive(start(breaker), clock, [])
    assert len(steps) == 1 and isinstance(steps[0], Refuse)
    refusal = steps[0].error
    assert (refusal.service, refusal.remaining, refusal.__cause__) == ("plan", 120.0, None)
    assert counts(breaker) == (0, 0, 0)
    assert cascade(breaker) == before


def test_rl6_refused_trial_gives_its_slot_back(clock):
    """RL-6, CB-10: a trial refused by the cooldown never reached the dependency: its slot
    comes back."""
    breaker = make(clock, failure_threshold=1, recovery_timeout=1.0, half_open_max_calls=1)
    breaker.record_failure(breaker.acquire())
    clock.advance(1.0)
    permit = breaker.acquire()
    core_of(breaker).note_attempt(rate_limited=True, retry_after=120)
    assert breaker.snapshot()["half_open_trials"] == 1
    steps = drive(start(breaker, permit=permit), clock, [])
    assert isinstance(steps[0], Refuse)
    assert breaker.snapshot()["half_open_trials"] == 0


def test_rl6_refused_after_attempts_records_the_last_and_chains_it(clock):
    """RL-6, RL-5: a 429 (2 s) waited out, then a 429 whose 120-s cooldown is refused: the
    last attempt is the recorded failure and the refusal's cause; the cascade saw both."""
    policy = RetryPolicy(max_attempts=3, backoff_initial=0.0, jitter=0.0)
    breaker = make(clock)
    second = TooManyRequests("120")
    steps = drive(start(breaker, policy), clock, [Raised(TooManyRequests("2")), Raised(second)])
    assert steps[:3] == [ATTEMPT, Sleep(2.0), ATTEMPT]
    assert len(steps) == 4 and isinstance(steps[3], Refuse)
    assert steps[3].error.remaining == pytest.approx(120.0)
    assert steps[3].error.__cause__ is second
    assert counts(breaker) == (1, 1, 1)
    assert cascade(breaker) == (2, 2)


def test_rl6_refused_after_a_returned_429_is_not_chained(clock):
    """RL-6: when the last attempt returned its 429, the refusal has no cause; the response
    is still the recorded failure."""
    policy = RetryPolicy(max_attempts=3, backoff_initial=0.0, jitter=0.0)
    breaker = make(clock)
    steps = drive(start(breaker, policy), clock, [Returned(Response(429, "120"))])
    assert steps[0] is ATTEMPT and isinstance(steps[1], Refuse)
    assert steps[1].error.__cause__ is None
    assert counts(breaker) == (1, 1, 1)


@pytest.mark.parametrize("cooldown, refused", [(8, False), (20, True)])
def test_rl6_the_budget_left_is_the_allowed_wait(clock, cooldown, refused):
    """RL-6: with a 10-s budget, an 8-s cooldown is waited out and a 20-s one refused."""
    policy = RetryPolicy(max_attempts=3, backoff_initial=0.0, jitter=0.0, budget_seconds=10)
    breaker = make(clock)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=cooldown)
    first = next(start(breaker, policy))
    if refused:
        assert isinstance(first, Refuse) and first.error.remaining == pytest.approx(20.0)
    else:
        assert first == Sleep(8.0)


@pytest.mark.parametrize("cooldown, refused", [(3.0, False), (3.5, True)])
def test_rl6_max_cooldown_wait_comes_from_the_config(clock, cooldown, refused):
    """RL-6: max_cooldown_wait bounds the wait without a budget (3 s waited, 3.5 s refused)."""
    breaker = make(clock, max_cooldown_wait=3.0)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=cooldown)
    step = next(start(breaker))
    if refused:
        assert isinstance(step, Refuse) and step.error.remaining == pytest.approx(3.5)
    else:
        assert step == Sleep(3.0)


def test_op5_dry_run_counts_the_refusal_and_attempts_anyway(clock):
    """OP-5: in dry-run a cooldown that would refuse is counted in dry_run_rejections and the
    attempt goes ahead without waiting."""
    breaker = make(clock, dry_run=True)
    core_of(breaker).note_attempt(rate_limited=True, retry_after=120)
    assert drive(start(breaker), clock, [Returned("ok")]) == [ATTEMPT, Done(value="ok")]
    assert core_of(breaker).dry_run_rejections == 1


# ------------------------------------------------------------- driving protocol
def test_fac3_a_plan_started_with_a_first_outcome_goes_on_from_it(clock):
    """FAC-3: the runners make the first attempt inline and hand its failure to the plan:
    the plan starts at that attempt's backoff, not with another attempt."""
    breaker = make(clock)
    error = ConnectionError()
    plan = start(breaker, first=Raised(error))
    assert next(plan) == Sleep(0.1)
    clock.advance(0.1)
    assert next(plan) is ATTEMPT
    assert plan.send(Returned("ok")) == Done(value="ok")
    assert cascade(breaker) == (2, 0)


def test_the_plan_needs_an_outcome_after_an_attempt(clock):
    """FAC-3 (the driving protocol): resuming after ATTEMPT without an outcome is a clear error."""
    plan = start(make(clock))
    assert next(plan) is ATTEMPT
    with pytest.raises(TypeError, match="outcome"):
        next(plan)


# ------------------------------------------------------------------ interpreters
def recording(log: list[Any]) -> Callable[..., Any]:
    """A stand-in for ``runner.retry_plan`` that logs the outcome it starts from, every step
    it yields and every outcome it is sent, then delegates to the real plan."""

    def plan(breaker, permit, policy, begun, first=None, budget=None):
        inner = retry_plan(breaker, permit, policy, begun, first, budget)
        log.append(("first", first))
        step = next(inner)
        while True:
            log.append(normal(step))
            if isinstance(step, (Refuse, Done)):
                yield step
                return
            sent = yield step
            log.append(("sent", sent))
            step = inner.send(sent)

    return plan


def normal(step: Any) -> Any:
    """A step made comparable across runs (each refusal is a new exception object)."""
    if isinstance(step, Refuse):
        return ("refuse", step.error.remaining, step.error.__cause__)
    return step


class Script:
    """The dependency: each call raises or returns the next scripted outcome."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self) -> Any:
        outcome = self.outcomes[self.calls]
        self.calls += 1
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def acall(self) -> Any:
        await asyncio.sleep(0)
        return self()


LIMITED = TooManyRequests("2")
REFUSING = TooManyRequests("120")
DOWN = ConnectionError("down")
IGNORED = Ignored("not ours")
SCRIPTS = {
    "recovers": [DOWN, Response(503), "ok"],
    "all-fail": [DOWN, DOWN, DOWN, DOWN],
    "429-then-refused": [LIMITED, REFUSING],
    "failure-responses": [Response(503), Response(429, "3"), Response(502), Response(500)],
    "ignored": [IGNORED],
    "first-time": ["ok"],
}


def run(style: str, script: list[Any], *, cooldown: float = 0.0, fallback: Any = None):
    """Run *script* through ``run_sync`` or ``run_async`` on a fresh breaker and FakeClock;
    returns what an observer sees: the result, the waits, the breaker's counts and cascade."""
    clock = FakeClock()
    breaker = make(clock, ignore_exceptions=(Ignored,))
    if cooldown:
        core_of(breaker).note_attempt(rate_limited=True, retry_after=cooldown)
    policy = RetryPolicy(max_attempts=4, **NO_JITTER)
    dependency = Script(script)
    permit = breaker.acquire()
    try:
        if style == "sync":
            value = runner.run_sync(core_of(breaker), permit, policy, dependency, (), {}, fallback)
        else:
            value = asyncio.run(runner.run_async(core_of(breaker), permit, policy, dependency.acall, (), {}, fallback))
        result: Any = ("returned", value)
    except RateLimitCooldownError as refusal:
        result = ("refused", refusal.remaining, refusal.__cause__)
    except BaseException as error:
        result = ("raised", error)
    return result, dependency.calls, clock.sleeps, breaker.snapshot(), cascade(breaker)


@pytest.mark.parametrize("cooldown", [0.0, 5.0], ids=["no-cooldown", "cooldown-5s"])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_fac3_sync_and_async_interpreters_take_the_same_steps(monkeypatch, name, cooldown):
    """FAC-3, RL-6, FAC-2: for the same outcome script, run_sync and run_async start the plan
    from the same outcome, carry out the same steps, send the same outcomes, and end with the
    same result, waits, breaker counts and cascade."""
    seen = {}
    for style in ("sync", "async"):
        log: list[Any] = []
        monkeypatch.setattr(runner, "retry_plan", recording(log))
        seen[style] = (log, run(style, SCRIPTS[name], cooldown=cooldown))
    assert seen["sync"] == seen["async"]
    log, (result, calls, _sleeps, _, _) = seen["sync"]
    if name == "first-time" and not cooldown:
        assert log == [] and result == ("returned", "ok")  # a success first time builds no plan
        return
    if cooldown:
        # under a cooldown the plan makes the first attempt itself, after the wait
        assert log[:4] == [("first", None), Sleep(5.0), ("sent", None), ATTEMPT]
    else:
        # the first attempt ran inline; the plan starts from its outcome
        first = SCRIPTS[name][0]
        assert log[0] == ("first", Raised(first) if isinstance(first, BaseException) else Returned(first))
    assert isinstance(log[-1], Done) or log[-1][0] == "refuse"
    assert calls == len(SCRIPTS[name])


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_fac3_the_inline_first_attempt_decides_nothing_the_plan_would_not(name):
    """FAC-2, FAC-3, RL-5: the runners' inline first attempt ends in the same state as the
    plan making that attempt itself: same steps after it, same result, same records."""
    log: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "retry_plan", recording(log))
        result, calls, sleeps, snapshot, totals = run("sync", SCRIPTS[name])

    clock = FakeClock()
    breaker = make(clock, ignore_exceptions=(Ignored,))
    dependency = Script(SCRIPTS[name])
    outcomes = [functools.partial(_outcome_of, dependency)] * len(SCRIPTS[name])
    by_hand = drive(start(breaker, RetryPolicy(max_attempts=4, **NO_JITTER)), clock, outcomes)
    assert by_hand[0] is ATTEMPT
    steps = [entry for entry in log if not isinstance(entry, tuple) or entry[0] == "refuse"]
    if not log:  # the inline attempt succeeded: the plan would have ended right there
        steps = [Done(value=result[1])]
    assert [normal(s) for s in by_hand[1:]] == steps
    assert (dependency.calls, clock.sleeps, breaker.snapshot(), cascade(breaker)) == (calls, sleeps, snapshot, totals)
    final = by_hand[-1]
    if isinstance(final, Done) and final.error is None:
        assert result == ("returned", final.value)
    elif isinstance(final, Done):
        assert result == ("raised", final.error)
    else:
        assert result == ("refused", final.error.remaining, final.error.__cause__)


def _outcome_of(dependency: Script) -> Any:
    try:
        return Returned(dependency())
    except BaseException as error:
        return Raised(error)


@pytest.mark.parametrize("style", ["sync", "async"])
def test_fac3_the_happy_path_builds_no_plan(monkeypatch, style):
    """FAC-3 (issue 12): a call that succeeds first time, with no cooldown, never builds the
    plan; its success is recorded once and its attempt counted (FAC-2, RL-5)."""

    def no_plan(*args, **kwargs):
        raise AssertionError("the plan was built on the happy path")

    monkeypatch.setattr(runner, "retry_plan", no_plan)
    for value in ("ok", Response(200)):
        result, calls, sleeps, snapshot, totals = run(style, [value])
        assert result == ("returned", value) and calls == 1 and sleeps == []
        assert (snapshot["consecutive_failures"], snapshot["window_calls"], snapshot["window_failures"]) == (0, 1, 0)
        assert totals == (1, 0)


@pytest.mark.parametrize("style", ["sync", "async"])
def test_fac4_interpreters_hand_refusals_and_counted_errors_to_the_fallback_only(style):
    """FAC-4, CB-10: the fallback replaces a refusal and a final counted exception, never an
    ignored exception nor a returned failure response; it gets the refusal as the cause."""

    def fallback():
        return "fallback"

    assert run(style, [DOWN] * 4, fallback=fallback)[0] == ("returned", "fallback")
    assert run(style, [LIMITED, REFUSING], fallback=fallback)[0] == ("returned", "fallback")
    assert run(style, [IGNORED], fallback=fallback)[0] == ("raised", IGNORED)
    last = Response(500)
    assert run(style, [Response(503)] * 3 + [last], fallback=fallback)[0] == ("returned", last)
