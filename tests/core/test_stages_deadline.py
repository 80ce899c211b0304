"""RS-1, RS-2: the deadline stage, driven by the fake clock (no real waits).

The deadline of a call is the earliest of its ``deadline`` knob and any enclosing
``baldur.deadline(...)``; no retry backoff or cooldown wait runs past it, an attempt that
would start after it is refused with DeadlineExceededError (nothing contacted, not a
failure, not retried, answered by the fallback), and an async attempt still running at it is
cancelled and counts as a failure.
"""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur
from baldur_django import DeadlineExceededError, RateLimitCooldownError, RetryPolicy
from baldur_django.core.config import build_config, validate_overrides
from baldur_django.core.errors import ConfigError
from baldur_django.core.stages.deadline import current, time_left
from baldur_django.core.stages.pipeline import build_pipeline

STEADY = RetryPolicy(max_attempts=5, backoff_initial=1.0, backoff_multiplier=1.0, jitter=0)


class Status:
    """A returned HTTP-like answer (judged by its status)."""

    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        self.status_code = status_code
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}


# ------------------------------------------------------------------ the context manager
def test_rs2_deadline_context_nested_earliest_wins(clock):
    """RS-2: baldur.deadline nests; the earliest deadline wins whichever is entered first."""
    assert current() is None and time_left() is None
    with baldur.deadline(10, clock=clock):
        assert time_left() == pytest.approx(10)
        with baldur.deadline(2, clock=clock):
            assert time_left() == pytest.approx(2)
            with baldur.deadline(5, clock=clock):
                assert time_left() == pytest.approx(2)  # a later one never extends it
        clock.advance(3)
        assert time_left() == pytest.approx(7)
    assert current() is None


def test_rs2_deadline_context_works_in_async_code(clock):
    """RS-2: ``async with baldur.deadline(...)``; the deadline follows into tasks (a context variable)."""

    async def main() -> tuple[float | None, float | None]:
        async with baldur.deadline(4, clock=clock):
            inside = await asyncio.create_task(_left())
        return inside, time_left()

    async def _left() -> float | None:
        return time_left()

    inside, after = asyncio.run(main())
    assert inside == pytest.approx(4) and after is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True, None])
def test_rs8_deadline_context_refuses_bad_seconds(bad):
    """RS-8: baldur.deadline(seconds) takes a number above 0; anything else is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"deadline\(seconds\)"):
        baldur.deadline(bad)


# ------------------------------------------------------------------ refusal before an attempt
def test_rs1_rs2_passed_deadline_refuses_before_contact_and_fallback_answers(clock):
    """RS-1, RS-2: an attempt that would start after the deadline is refused with
    DeadlineExceededError: the function never runs, nothing is recorded, nothing is retried,
    and the fallback answers (it gets the refusal's arguments)."""
    ran: list[int] = []
    seen: list[BaseException] = []

    @baldur.protected("pay", retry=STEADY, fallback=lambda x: f"fallback {x}")
    def pay(x: int) -> int:
        ran.append(x)
        return x

    @baldur.protected("pay")
    def bare(x: int) -> int:
        ran.append(x)
        return x

    with baldur.deadline(1, clock=clock):
        clock.advance(1)
        assert pay(3) == "fallback 3"
        with pytest.raises(DeadlineExceededError) as refused:
            bare(4)
        seen.append(refused.value)
    assert ran == [] and clock.sleeps == []
    assert seen[0].service == "pay" and seen[0].reason == "deadline"
    snap = baldur.get_breaker("pay").snapshot()
    assert snap["consecutive_failures"] == 0 and snap["window_calls"] == 0  # no outcome recorded
    assert snap["state"] == "closed"
    assert pay(5) == 5 and bare(6) == 6  # outside the deadline: unchanged


def test_rs2_deadline_knob_refuses_a_retry_that_would_start_after_it(clock):
    """RS-2: the ``deadline`` knob bounds the whole sequence: with 1 s backoffs and a 2.5 s
    deadline, three attempts are made (t=0, 1, 2) and no backoff runs past 2.5 s; the last
    attempt's failure is the outcome, counted once."""
    attempts: list[float] = []

    @baldur.protected("inventory", retry=STEADY, deadline=2.5)
    def fetch() -> None:
        attempts.append(clock.monotonic())
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        fetch()
    assert len(attempts) == 3
    assert sum(clock.sleeps) <= 2.5
    assert baldur.get_breaker("inventory").snapshot()["consecutive_failures"] == 1


def test_rs2_without_a_deadline_the_retry_sequence_is_unchanged(clock):
    """RS-2: without any deadline, behaviour is unchanged: every attempt of the policy is made."""
    attempts: list[float] = []

    @baldur.protected("inventory", retry=STEADY)
    def fetch() -> None:
        attempts.append(clock.monotonic())
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        fetch()
    assert len(attempts) == 5 and clock.sleeps == [1.0] * 4


def test_rs2_no_cooldown_wait_runs_past_the_deadline(clock):
    """RS-2 (issue 28's 429 case, plain Python): a 429 asking for 20 s under a 5 s deadline
    is not waited out; the call ends within the time it had, refused by the cooldown."""
    answers: list[Status] = []

    @baldur.protected("search", retry=RetryPolicy(max_attempts=3, backoff_initial=0.1))
    def search() -> Status:
        answers.append(Status(429, "20"))
        return answers[-1]

    start = clock.monotonic()
    with baldur.deadline(5, clock=clock), pytest.raises(RateLimitCooldownError):
        search()
    assert len(answers) == 1
    assert clock.monotonic() - start <= 5
    assert sum(clock.sleeps) <= 5


def test_rs2_a_cooldown_that_ends_before_the_deadline_is_waited_out(clock):
    """RS-2: a cooldown shorter than the time left is waited out as before."""
    answers = [Status(429, "2"), Status(200)]

    @baldur.protected("search", retry=RetryPolicy(max_attempts=3, backoff_initial=0.1, jitter=0))
    def search() -> Status:
        return answers.pop(0)

    with baldur.deadline(5, clock=clock):
        assert search().status_code == 200
    assert 1.9 <= sum(clock.sleeps) <= 2.1


# ------------------------------------------------------------------ the knob itself
def test_rs1_no_stage_knob_builds_no_pipeline():
    """RS-1, RS-9: without a stage knob no pipeline is built (the breaker's wrapper runs as before)."""
    assert build_pipeline(build_config("a", {}), "a") is None
    deadline_only = build_pipeline(build_config("a", validate_overrides("a", {"deadline": 2})), "a")
    assert deadline_only is not None and not deadline_only.staged
    # a service stage knob builds one too, with the service's stages inside each attempt
    staged = validate_overrides("a", {"max_concurrent_calls": 3, "retry_budget_ratio": 0.2})
    pipeline = build_pipeline(build_config("a", staged), "a")
    assert pipeline is not None and pipeline.staged and pipeline.deadline is None


def test_rs2_deadline_knob_from_baldur_services(clock, monkeypatch):
    """RS-2, RS-8: ``deadline`` is a BALDUR_SERVICES key too."""
    monkeypatch.setenv("BALDUR_SERVICES", '{"inventory": {"deadline": 1.5}}')
    from baldur_django.core.config import settings

    settings.reset()
    attempts: list[float] = []

    @baldur.protected("inventory", retry=STEADY)
    def fetch() -> None:
        attempts.append(clock.monotonic())
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        fetch()
    assert len(attempts) == 2  # t=0 and t=1; a third at t=2 would start after 1.5 s


def test_rs1_protect_and_aprotect_honour_the_deadline(clock):
    """RS-1: protect()/aprotect() run the same stages: refused after the deadline, answered
    by the fallback, nothing run."""
    ran: list[str] = []

    def call() -> str:
        ran.append("sync")
        return "ok"

    async def factory() -> str:
        ran.append("async")
        return "ok"

    assert baldur.protect("svc", call, deadline=3.0) == "ok"
    with baldur.deadline(1, clock=clock):
        clock.advance(2)
        assert baldur.protect("svc", call, fallback=lambda: "late") == "late"
        with pytest.raises(DeadlineExceededError):
            baldur.protect("svc", call)
        assert asyncio.run(baldur.aprotect("svc", factory, fallback=lambda: "alate")) == "alate"
    assert ran == ["sync"]


# ------------------------------------------------------------------ async cancellation
def test_rs2_async_attempt_running_at_the_deadline_is_cancelled_and_is_a_failure(clock):
    """RS-2: an async attempt still running at the deadline is cancelled; the timeout counts
    as a failure and the fallback answers it."""
    caught: list[BaseException] = []
    cancelled: list[bool] = []

    @baldur.aprotected("slow", deadline=0.05, fallback=lambda: "fallback")
    async def slow() -> None:
        try:
            await asyncio.Event().wait()  # never set: only the deadline ends it
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    @baldur.aprotected("slow2", deadline=0.05)
    async def slow_bare() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        assert await slow() == "fallback"
        try:
            await slow_bare()
        except TimeoutError as exc:
            caught.append(exc)

    asyncio.run(main())
    assert cancelled == [True]
    assert isinstance(caught[0], TimeoutError)
    assert baldur.get_breaker("slow").snapshot()["consecutive_failures"] == 1
    assert baldur.get_breaker("slow2").snapshot()["consecutive_failures"] == 1


def test_rs2_async_refusal_after_the_deadline_contacts_nothing(clock):
    """RS-1, RS-2: the async form refuses after the deadline as the sync one does."""
    ran: list[int] = []

    @baldur.aprotected("svc", retry=STEADY)
    async def call() -> int:
        ran.append(1)
        return 1

    async def main() -> None:
        async with baldur.deadline(1, clock=clock):
            clock.advance(1.5)
            with pytest.raises(DeadlineExceededError):
                await call()

    asyncio.run(main())
    assert ran == []
    assert baldur.get_breaker("svc").snapshot()["window_calls"] == 0


def test_rs2_deadline_refusal_is_published_as_a_rejection(clock, events):
    """RS-2: a call refused by its deadline is published as a CallRejected with reason
    "deadline" (what tracing and the rejection counts read), before anything else happens."""

    @baldur.protected("pay")
    def pay() -> int:
        return 1

    with baldur.deadline(1, clock=clock):
        clock.advance(1)
        with pytest.raises(DeadlineExceededError):
            pay()
    rejected = [e for e in events.events if e.kind == "call_rejected"]
    assert [(e.service, e.reason) for e in rejected] == [("pay", "deadline")]
