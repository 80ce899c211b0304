"""RS-1, RS-3, RS-4, RS-5, RS-6, RS-8: the service stages wired into protected calls, end to
end, on a fake clock: the decorators, ``protect`` / ``aprotect`` and the HTTP adapters.

Every refusal contacts nothing, is no failure (the breaker's counts do not move), is not
retried and is answered by the fallback; the stages run in the order gate, throttle,
bulkhead, inside the retry stage and its budget.
"""

from __future__ import annotations

import asyncio
import io
import threading

import httpx
import pytest
import requests
from requests.adapters import BaseAdapter
from requests.models import Response

import baldur_django as baldur
from baldur_django import (
    BulkheadFullError,
    RateLimitCooldownError,
    RetryPolicy,
    ThrottledError,
)
from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport
from baldur_django.contrib.requests import BreakerAdapter
from baldur_django.core.stages.service import stages_of

ONCE_MORE = RetryPolicy(max_attempts=3, backoff_initial=0.1, backoff_multiplier=1.0, jitter=0)


class Status:
    """A returned HTTP-like answer (judged by its status)."""

    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        self.status_code = status_code
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}


class Unavailable(Exception):
    """A raised 503 carrying Retry-After, as an HTTP client's error would."""

    def __init__(self, retry_after: str) -> None:
        super().__init__("503")
        self.status_code = 503
        self.response = Status(503, retry_after)


def counts(name: str) -> tuple[int, int]:
    snap = baldur.get_breaker(name).snapshot()
    return snap["window_calls"], snap["window_failures"]


# ------------------------------------------------------------------ the Retry-After gate
def test_rs3_a_returned_429_closes_the_gate_until_its_retry_after(clock):
    """RS-3: a returned 429 with Retry-After: 20 refuses every call for 20 s with
    RateLimitCooldownError(reason="retry_after"), answered by the fallback; nothing is
    contacted, the refusals are no outcome; after 20 s calls go through again."""
    answers = [Status(429, "20"), Status(200), Status(200)]

    @baldur.protected("api", honor_retry_after=True, fallback=lambda: "later")
    def api() -> Status:
        return answers.pop(0)

    assert api().status_code == 429
    before = counts("api")
    clock.advance(19.5)
    assert api() == "later" and len(answers) == 2
    assert counts("api") == before  # no failure, no call counted
    clock.advance(0.6)
    assert api().status_code == 200 and len(answers) == 1


def test_rs3_the_refusal_names_its_reason_and_the_seconds_left(clock):
    """RS-3: without a fallback the refusal is raised: reason "retry_after", retry_after = seconds left."""

    @baldur.protected("api", honor_retry_after=True)
    def api() -> Status:
        return Status(503, "30")

    api()
    clock.advance(10)
    with pytest.raises(RateLimitCooldownError) as caught:
        api()
    assert caught.value.reason == "retry_after" and caught.value.retry_after == pytest.approx(20)


def test_rs3_a_raised_503_closes_the_gate_for_async_def_too(clock):
    """RS-3: a raised 503 with Retry-After (async def): the attempt fails once, then every
    call is refused until the end; a later, shorter Retry-After does not reopen it early."""
    made: list[int] = []

    @baldur.protected("api", honor_retry_after=True, fallback=lambda seconds: "quiet")
    async def api(seconds: str) -> str:
        made.append(1)
        raise Unavailable(seconds)

    async def main() -> list[str]:
        first = await api("30")  # the failure itself: the fallback answers it too
        clock.advance(5)
        return [first, await api("1")]

    assert asyncio.run(main()) == ["quiet", "quiet"] and len(made) == 1
    gate = stages_of(baldur.get_breaker("api")).gate
    assert gate.remaining() == pytest.approx(25)


def test_rs3_a_force_closed_breaker_ignores_the_gate(clock):
    """RS-3: an operator's force-close lets calls through a closed gate."""
    answers = [Status(429, "60"), Status(200)]

    @baldur.protected("api", honor_retry_after=True)
    def api() -> Status:
        return answers.pop(0)

    api()
    baldur.force_close_circuit("api", ttl_minutes=5, reason="test")
    assert api().status_code == 200


def test_rs3_without_the_knob_a_retry_after_closes_nothing(clock):
    """RS-3, RS-8: honor_retry_after is off by default: a 503 with Retry-After refuses nothing."""
    made: list[int] = []

    @baldur.protected("api")
    def api() -> Status:
        made.append(1)
        return Status(503, "60")

    api()
    api()
    assert len(made) == 2 and stages_of(baldur.get_breaker("api")) is None


# ------------------------------------------------------------------ the bulkhead
def test_rs4_a_call_past_the_limit_is_refused_and_the_slot_comes_back(clock):
    """RS-4, RS-1: with one slot, a call made while another is in flight is refused with
    BulkheadFullError (fallback answers, no failure); the slot is given back on return and
    on an exception."""
    inside, release = threading.Event(), threading.Event()

    @baldur.protected("db", max_concurrent_calls=1, fallback=lambda hold=False: "busy")
    def db(hold: bool = False) -> str:
        if hold:
            inside.set()
            release.wait(30)
        return "ok"

    holder = threading.Thread(target=db, args=(True,))
    holder.start()
    assert inside.wait(30)
    before = counts("db")
    assert db() == "busy"
    assert counts("db") == before
    release.set()
    holder.join(30)
    assert db() == "ok" and stages_of(baldur.get_breaker("db")).bulkhead.in_flight() == 0


def test_rs4_the_bulkhead_is_shared_by_every_call_site_of_the_service(clock):
    """RS-4: two functions protected by one breaker share its N slots (one holder per service)."""

    @baldur.protected("db", max_concurrent_calls=1)
    def outer() -> str:
        return inner()

    @baldur.protected("db")
    def inner() -> str:
        return "ok"

    with pytest.raises(BulkheadFullError):
        outer()
    assert stages_of(baldur.get_breaker("db")).bulkhead.in_flight() == 0


def test_rs4_aprotect_waits_without_blocking_the_loop_and_gives_the_slot_back(clock):
    """RS-4: aprotect with a bulkhead: a second task is refused while the first holds the
    only slot (max_wait 0); a cancelled task gives its slot back."""

    async def main() -> tuple[str, str, int]:
        gate = asyncio.Event()

        async def slow() -> str:
            await gate.wait()
            return "slow"

        first = asyncio.create_task(baldur.aprotect("db", slow, max_concurrent_calls=1))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        try:
            await baldur.aprotect("db", slow, max_concurrent_calls=1)
            second = "ran"
        except BulkheadFullError:
            second = "refused"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        bulkhead = stages_of(baldur.get_breaker("db")).bulkhead
        gate.set()
        third = await baldur.aprotect("db", slow, max_concurrent_calls=1)
        return second, third, bulkhead.in_flight()

    assert asyncio.run(main()) == ("refused", "slow", 0)


# ------------------------------------------------------------------ the RS-1 order
def test_rs1_a_gate_closed_call_never_touches_the_bulkhead(clock):
    """RS-1: the gate refuses before the bulkhead: with the only slot held and a long
    max_wait, a call while the gate is closed is refused at once by the gate (reason
    "retry_after"), never waiting for, nor refused by, the bulkhead."""
    inside, release = threading.Event(), threading.Event()
    answers = [Status(429, "10")]

    @baldur.protected("api", honor_retry_after=True, max_concurrent_calls=1, max_wait=300)
    def api(hold: bool = False) -> Status:
        if hold:
            inside.set()
            release.wait(30)
            return Status(200)
        return answers.pop(0)

    api()  # the 429: the gate closes for 10 s
    clock.advance(10.5)
    holder = threading.Thread(target=api, args=(True,))
    holder.start()
    assert inside.wait(30)
    try:
        stages = stages_of(baldur.get_breaker("api"))
        stages.gate.close_for(10)
        with pytest.raises(RateLimitCooldownError) as caught:
            api()
        assert caught.value.reason == "retry_after" and stages.bulkhead.waiting() == 0
    finally:
        release.set()
        holder.join(30)


def test_rs1_the_gate_refuses_before_the_breaker_s_state_check_takes_a_trial_slot(clock, events):
    """RS-1: the Retry-After gate comes before the breaker's state check. An OPEN breaker
    whose recovery time has passed, with its gate closed, refuses with the gate's reason
    ("retry_after", not the breaker's) and moves nothing: no call is admitted as a
    HALF_OPEN trial (no transition to half_open) and nothing is contacted; once the gate
    reopens the trial runs and closes the breaker."""
    made: list[str] = []
    outcome = ["down"]

    @baldur.protected("api", honor_retry_after=True, failure_threshold=1, recovery_timeout=5, half_open_max_calls=1)
    def api() -> str:
        made.append(outcome[0])
        if outcome[0] == "down":
            raise ConnectionError("down")
        return "ok"

    with pytest.raises(ConnectionError):
        api()
    breaker = baldur.get_breaker("api")
    assert breaker.snapshot()["state"] == "open"
    clock.advance(6)  # the next admitted call would be the trial
    stages_of(breaker).gate.close_for(20)
    outcome[0] = "up"
    for _ in range(3):
        with pytest.raises(RateLimitCooldownError) as caught:
            api()
        assert caught.value.reason == "retry_after"
    assert made == ["down"] and [t[1] for t in events.transitions()] == ["open"]
    clock.advance(21)
    assert api() == "ok" and [t[1] for t in events.transitions()] == ["open", "half_open", "closed"]


def test_rs1_the_gate_refuses_an_async_call_before_the_state_check_too(clock, events):
    """RS-1: as for a def, an async def refused by the closed gate is admitted as no
    trial (the breaker makes no transition to half_open)."""

    @baldur.protected("aapi", honor_retry_after=True, failure_threshold=1, recovery_timeout=5, half_open_max_calls=1)
    async def aapi(fail: bool) -> str:
        if fail:
            raise ConnectionError("down")
        return "ok"

    async def main() -> str:
        with pytest.raises(ConnectionError):
            await aapi(True)
        clock.advance(6)
        stages_of(baldur.get_breaker("aapi")).gate.close_for(20)
        with pytest.raises(RateLimitCooldownError):
            await aapi(False)
        return [t[1] for t in events.transitions()]

    assert asyncio.run(main()) == ["open"]


def test_rs1_rs6_a_throttled_call_holds_no_slot_and_is_no_failure(clock):
    """RS-1, RS-6: a call refused by adaptive throttling never reaches the bulkhead and
    moves none of the breaker's counts."""
    made: list[int] = []

    @baldur.protected(
        "api",
        adaptive_throttling_k=1,
        max_concurrent_calls=1,
        ignore_exceptions=[ValueError],
        fallback=lambda: "shed",
    )
    def api() -> str:
        made.append(1)
        raise ValueError("no")  # ignored by the breaker: never an accept, never a failure

    answers = []
    for _ in range(200):
        try:
            answers.append(api())
        except ValueError:
            answers.append("made")
    refused = answers.count("shed")
    assert refused > 150 and len(made) == 200 - refused  # about 194 expected
    assert stages_of(baldur.get_breaker("api")).bulkhead.in_flight() == 0
    assert counts("api") == (0, 0)


def test_rs6_a_healthy_service_is_never_throttled(clock):
    """RS-6: calls that succeed keep the refusal probability at 0."""

    @baldur.protected("api", adaptive_throttling_k=2)
    def api() -> str:
        return "ok"

    assert all(api() == "ok" for _ in range(300))
    assert stages_of(baldur.get_breaker("api")).throttle.probability() == 0


def test_rs6_throttled_calls_raise_throttled_error_without_fallback(clock):
    """RS-6: a throttled call without a fallback raises ThrottledError (reason "throttled")."""

    @baldur.protected("api", adaptive_throttling_k=1, ignore_exceptions=[ValueError])
    def api() -> str:
        raise ValueError("no")

    kinds = set()
    for _ in range(50):
        try:
            api()
        except (ValueError, ThrottledError) as exc:
            kinds.add(type(exc))
    assert ThrottledError in kinds


# ------------------------------------------------------------------ the retry budget
def test_rs5_an_empty_budget_stops_the_retry_and_the_outcome_counts_once(clock):
    """RS-5, RS-1: with no retry left in the budget the first attempt's failure is final:
    one attempt, one failure recorded, the fallback answers."""
    made: list[int] = []

    @baldur.protected(
        "api", retry=ONCE_MORE, retry_budget_ratio=0, retry_budget_min_per_second=0, fallback=lambda: "fb"
    )
    def api() -> str:
        made.append(1)
        raise ConnectionError("down")

    assert api() == "fb"
    assert len(made) == 1 and counts("api") == (1, 1)
    assert stages_of(baldur.get_breaker("api")).budget.exhausted >= 1


def test_rs5_the_budget_allows_retries_within_its_ratio(clock):
    """RS-5: ratio 0.5 and no floor: over 10 calls that fail once then succeed, at most
    5 retries are made (the rest end on their first failure)."""
    made: list[int] = []

    @baldur.protected(
        "api",
        retry=ONCE_MORE,
        retry_budget_ratio=0.5,
        retry_budget_min_per_second=0,
        failure_threshold=1000,
        minimum_calls=100,
        fallback=lambda: "fb",
    )
    def api() -> str:
        made.append(1)
        if fresh:
            fresh.clear()
            raise ConnectionError("a call's first attempt fails")
        return "ok"

    fresh: list[bool] = []
    results = []
    for _ in range(10):
        fresh.append(True)
        results.append(api())
    retries = len(made) - 10
    assert 1 <= retries <= 5 and results.count("ok") == retries


def test_rs5_protect_counts_calls_and_spends_the_budget(clock):
    """RS-5: protect() with a retry policy and an empty budget: one attempt."""
    made: list[int] = []

    def down() -> str:
        made.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        baldur.protect("api", down, retry=ONCE_MORE, retry_budget_ratio=0, retry_budget_min_per_second=0)
    assert len(made) == 1


# ------------------------------------------------------------------ reconfiguration
def test_rs8_the_holder_is_rebuilt_when_the_configuration_changes(clock):
    """RS-8: reconfiguring the breaker gives fresh stages with the new limits."""

    @baldur.protected("db", max_concurrent_calls=1)
    def db() -> str:
        return "ok"

    db()
    breaker = baldur.get_breaker("db")
    first = stages_of(breaker)
    assert first.bulkhead.limit == 1
    import dataclasses

    breaker.reconfigure(dataclasses.replace(breaker.config, max_concurrent_calls=3))
    assert stages_of(breaker) is None  # not built again until a call needs it
    db()
    assert stages_of(breaker).bulkhead.limit == 3


# ------------------------------------------------------------------ the HTTP adapters
class FakeAdapter(BaseAdapter):
    """A requests transport answering from a list of (status, headers); counts what it was sent."""

    def __init__(self, answers: list[tuple[int, dict[str, str]]]) -> None:
        super().__init__()
        self.answers = answers
        self.sent = 0

    def send(self, request, **kwargs):
        self.sent += 1
        status, headers = self.answers.pop(0)
        response = Response()
        response.status_code = status
        response.headers.update(headers)
        response.request = request
        response.url = request.url
        response.raw = io.BytesIO(b"")
        return response

    def close(self) -> None:
        pass


def test_rs3_requests_adapter_gate_sees_the_returned_429(clock):
    """RS-3, RS-1: BreakerAdapter(honor_retry_after=True): a 429 with Retry-After refuses
    the next request before it is sent."""
    inner = FakeAdapter([(429, {"Retry-After": "20"}), (200, {})])
    session = requests.Session()
    session.mount("http://", BreakerAdapter("api", adapter=inner, honor_retry_after=True))
    assert session.get("http://api.test/x").status_code == 429
    with pytest.raises(RateLimitCooldownError):
        session.get("http://api.test/x")
    assert inner.sent == 1
    clock.advance(21)
    assert session.get("http://api.test/x").status_code == 200


def test_rs3_rs4_httpx_transports_gate_and_bulkhead(clock):
    """RS-3, RS-4: BreakerTransport and AsyncBreakerTransport: a 503 with Retry-After closes
    the gate; the next request is refused without being sent."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(503, headers={"Retry-After": "15"})

    with httpx.Client(
        transport=BreakerTransport("sync-api", transport=httpx.MockTransport(handler), honor_retry_after=True)
    ) as client:
        assert client.get("http://a.test/").status_code == 503
        with pytest.raises(RateLimitCooldownError):
            client.get("http://a.test/")

    async def main() -> None:
        transport = AsyncBreakerTransport(
            "async-api", transport=httpx.MockTransport(handler), honor_retry_after=True, max_concurrent_calls=2
        )
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get("http://b.test/")).status_code == 503
            with pytest.raises(RateLimitCooldownError):
                await client.get("http://b.test/")

    asyncio.run(main())
    assert len(sent) == 2
    assert stages_of(baldur.get_breaker("async-api")).bulkhead.in_flight() == 0


def test_rs3_the_adapters_keep_the_gates_reason_retry_after(clock):
    """RS-3, section 0: a refusal by the Retry-After gate reaches the caller of the HTTP
    adapters with reason "retry_after" (the retry stage's own cooldown says "cooldown"), as
    the adapters' requests/httpx error types, with the seconds left."""
    inner = FakeAdapter([(429, {"Retry-After": "20"})])
    session = requests.Session()
    session.mount("http://", BreakerAdapter("gate-r", adapter=inner, honor_retry_after=True))
    session.get("http://api.test/x")
    with pytest.raises(requests.ConnectionError) as caught:
        session.get("http://api.test/x")
    assert isinstance(caught.value, RateLimitCooldownError)
    assert (caught.value.reason, round(caught.value.retry_after)) == ("retry_after", 20)
    assert "Retry-After" in str(caught.value)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "15"})

    transport = BreakerTransport("gate-x", transport=httpx.MockTransport(handler), honor_retry_after=True)
    with httpx.Client(transport=transport) as client:
        client.get("http://a.test/")
        with pytest.raises(httpx.TransportError) as refused:
            client.get("http://a.test/")
    assert isinstance(refused.value, RateLimitCooldownError)
    assert (refused.value.reason, round(refused.value.retry_after)) == ("retry_after", 15)
