"""The public facade: protected / aprotected / protect / aprotect / circuit_breaker.

FAC-1 (call styles, metadata, generators refused), per-call overrides and precedence,
first registration wins, FAC-2 (breaker outside retry), FAC-3 (retry), FAC-4 (fallback),
CB-6 (a trial is never retried) and the attributes of CircuitOpenError. Async forms run
under ``asyncio.run``; every wait goes through the FakeClock (``clock.sleeps``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging

import pytest

import baldur_django as baldur
from baldur_django import CircuitOpenError, CircuitState, ConfigError, RateLimitCooldownError, RetryPolicy
from baldur_django.core import runner
from baldur_django.core.config import settings
from baldur_django.core.registry import registry

CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN
LOGGER = "baldur.circuit_breaker"

NO_JITTER = dict(jitter=0.0, backoff_initial=0.1, backoff_multiplier=2.0, backoff_max=2.0)


class Response:
    def __init__(self, status_code):
        self.status_code = status_code


class Flaky:
    """A callable that raises/returns the scripted outcomes in order, counting calls."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        outcome = self.outcomes[min(self.calls, len(self.outcomes)) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def snap(name):
    return baldur.get_breaker(name).snapshot()


# --------------------------------------------------------------------------- FAC-1


def test_fac1_protected_sync_keeps_metadata(clock):
    """FAC-1: protected on a def returns a plain function with functools.wraps metadata."""

    def charge(order_id: int, *, amount: float = 1.0) -> str:
        """Charge an order."""
        return f"charged {order_id} {amount}"

    charge.custom = "kept"
    wrapped = baldur.protected("meta")(charge)
    assert wrapped.__name__ == "charge"
    assert wrapped.__qualname__ == charge.__qualname__
    assert wrapped.__doc__ == "Charge an order."
    assert wrapped.__module__ == charge.__module__
    assert wrapped.__wrapped__ is charge
    assert wrapped.custom == "kept"
    assert inspect.signature(wrapped) == inspect.signature(charge)
    assert not inspect.iscoroutinefunction(wrapped)
    assert wrapped(7, amount=2.5) == "charged 7 2.5"


@pytest.mark.parametrize("decorator", ["protected", "circuit_breaker", "aprotected"])
def test_fac1_async_def_stays_a_coroutine_function(clock, decorator):
    """FAC-1: a decorated async def is a coroutine function (inspect.iscoroutinefunction) with its metadata."""

    async def fetch(x):
        """Fetch x."""
        await asyncio.sleep(0)
        return x + 1

    wrapped = getattr(baldur, decorator)(f"async-{decorator}")(fetch)
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "fetch" and wrapped.__doc__ == "Fetch x." and wrapped.__wrapped__ is fetch
    assert asyncio.run(wrapped(41)) == 42


def test_fac1_circuit_breaker_on_def_is_sync(clock):
    """FAC-1: circuit_breaker on a def returns a sync function."""

    @baldur.circuit_breaker("cb-sync")
    def f():
        return "sync"

    assert not inspect.iscoroutinefunction(f)
    assert f() == "sync"


def test_fac1_partial_of_async_def_is_detected(clock):
    """FAC-1: a functools.partial of an async def is detected as async."""

    async def add(a, b):
        return a + b

    wrapped = baldur.protected("partial-async")(functools.partial(add, 1))
    assert inspect.iscoroutinefunction(wrapped)
    assert asyncio.run(wrapped(2)) == 3


def test_fac1_aprotected_refuses_a_plain_def(clock):
    """FAC-1: aprotected is the explicit async form; a plain def is a ConfigError naming it."""

    def not_async():
        return 1

    with pytest.raises(ConfigError, match="not_async"):
        baldur.aprotected("explicit")(not_async)


def gen_function():
    yield 1


async def agen_function():
    yield 1


@pytest.mark.parametrize("func", [gen_function, agen_function], ids=["generator", "async-generator"])
@pytest.mark.parametrize("decorator", ["protected", "circuit_breaker", "aprotected"])
def test_fac1_generators_are_refused_at_decoration(clock, decorator, func):
    """FAC-1: decorating a generator or async-generator function is a ConfigError at
    decoration time, naming the function."""
    with pytest.raises(ConfigError) as info:
        getattr(baldur, decorator)("gen")(func)
    assert func.__name__ in str(info.value)


def test_fac1_protect_refuses_generators_and_coroutine_functions(clock):
    """FAC-1: protect() wants a plain callable: generators and async defs are ConfigErrors."""

    async def coro():
        return 1

    with pytest.raises(ConfigError, match="gen_function"):
        baldur.protect("p", gen_function)
    with pytest.raises(ConfigError, match="aprotect"):
        baldur.protect("p", coro)


def test_fac1_protect_runs_the_call_once_and_returns_its_value(clock):
    """FAC-1: protect(service, call) runs call() once under the breaker."""
    call = Flaky("value")
    assert baldur.protect("protect", call) == "value"
    assert call.calls == 1
    assert snap("protect")["window_calls"] == 1


def test_fac1_aprotect_awaits_a_factory(clock):
    """FAC-1: aprotect awaits factory(); a fresh awaitable per attempt makes retry work."""
    attempts = []

    async def fetch():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("flaky")
        return "fetched"

    result = asyncio.run(baldur.aprotect("aprotect", fetch, retry=RetryPolicy(max_attempts=3, **NO_JITTER)))
    assert result == "fetched"
    assert len(attempts) == 3
    assert clock.sleeps == pytest.approx([0.1, 0.2])


def test_fac1_aprotect_factory_must_produce_awaitables(clock):
    """FAC-1: a factory returning a plain value is a ConfigError naming the service."""
    with pytest.raises(ConfigError, match="factory-check"):
        asyncio.run(baldur.aprotect("factory-check", lambda: 42))


# ------------------------------------------------------------ overrides/precedence


ALL_OVERRIDES = dict(
    failure_threshold=4,
    failure_rate_threshold=25.0,
    sliding_window_size=20,
    minimum_calls=8,
    recovery_timeout=1.5,
    half_open_max_calls=2,
    ignore_exceptions=(KeyError,),
)


@pytest.mark.parametrize("form", ["protected", "aprotected", "circuit_breaker", "protect", "aprotect"])
def test_fac_every_form_accepts_every_override(clock, form):
    """Section 0: all seven per-call overrides are accepted by every facade form and applied."""
    name = f"overrides-{form}"
    if form == "protect":
        baldur.protect(name, lambda: None, **ALL_OVERRIDES)
    elif form == "aprotect":

        async def noop():
            return None

        asyncio.run(baldur.aprotect(name, noop, **ALL_OVERRIDES))
    else:
        getattr(baldur, form)(name, **ALL_OVERRIDES)
    config = baldur.get_breaker(name).config
    for key, value in ALL_OVERRIDES.items():
        assert getattr(config, key) == value, key


def test_fac_precedence_per_call_over_services_over_global(clock, monkeypatch):
    """Section 0/CFG-1: per-call override > BALDUR_SERVICES[service] > global setting, end to end."""
    monkeypatch.setenv("BALDUR_CB_FAILURE_THRESHOLD", "7")
    monkeypatch.setenv(
        "BALDUR_SERVICES",
        '{"svc-a": {"failure_threshold": 3, "recovery_timeout": 2.5}, "svc-c": {"failure_threshold": 3}}',
    )
    settings.reset()

    @baldur.circuit_breaker("svc-a")
    def a():
        raise ConnectionError()

    @baldur.circuit_breaker("svc-b")
    def b():
        raise ConnectionError()

    @baldur.circuit_breaker("svc-c", failure_threshold=2)
    def c():
        raise ConnectionError()

    def failures_to_open(func, name):
        n = 0
        while baldur.get_breaker(name).state is CLOSED:
            with pytest.raises(ConnectionError):
                func()
            n += 1
        return n

    assert failures_to_open(a, "svc-a") == 3
    assert failures_to_open(b, "svc-b") == 7
    assert failures_to_open(c, "svc-c") == 2
    assert baldur.get_breaker("svc-a").config.recovery_timeout == 2.5
    assert baldur.get_breaker("svc-b").config.recovery_timeout == 60


def test_fac_first_registration_wins_and_conflict_is_logged_once(clock, caplog):
    """Section 0: the first registration's overrides win; a later different one logs
    circuit_breaker.config_conflict once (a warning), however many follow."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    baldur.circuit_breaker("first", failure_threshold=2)
    baldur.circuit_breaker("first", failure_threshold=2)  # identical: no conflict
    assert [r for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.config_conflict"] == []
    baldur.protected("first", failure_threshold=5)
    baldur.circuit_breaker("first", failure_threshold=9, recovery_timeout=3)
    conflicts = [r for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.config_conflict"]
    assert len(conflicts) == 1
    record = conflicts[0]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("circuit_breaker.config_conflict")
    assert record.service == "first"
    assert baldur.get_breaker("first").config.failure_threshold == 2


def test_fac_decorator_adopts_overrides_after_plain_get_breaker(clock, caplog):
    """Section 0: a breaker first created by get_breaker() (no overrides) takes the first
    decorator's overrides without a conflict warning."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    baldur.get_breaker("adopt")
    baldur.circuit_breaker("adopt", failure_threshold=2)
    assert baldur.get_breaker("adopt").config.failure_threshold == 2
    assert not [r for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.config_conflict"]


def test_fac_registration_without_overrides_is_not_a_conflict(clock, caplog):
    """Section 0: using a breaker by name with no overrides of one's own is not a conflict."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    baldur.circuit_breaker("quiet", failure_threshold=3)
    baldur.protect("quiet", lambda: "ok")
    assert not [r for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.config_conflict"]


# --------------------------------------------------------------------------- FAC-2


def test_fac2_breaker_sees_only_the_final_outcome_of_a_retried_call(clock):
    """FAC-2: two failed attempts then a success record a single success."""
    call = Flaky(ConnectionError("1"), ConnectionError("2"), "ok")
    result = baldur.protect("fac2", call, retry=RetryPolicy(max_attempts=3, **NO_JITTER), failure_threshold=2)
    assert result == "ok" and call.calls == 3
    s = snap("fac2")
    assert (s["state"], s["consecutive_failures"], s["window_calls"], s["window_failures"]) == ("closed", 0, 1, 0)


def test_fac2_an_all_failed_sequence_counts_once(clock):
    """FAC-2: a sequence of three failed attempts is one failure for the count and the rate."""
    policy = RetryPolicy(max_attempts=3, **NO_JITTER)

    @baldur.protected("fac2-fail", retry=policy, failure_threshold=2)
    def call():
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        call()
    s = snap("fac2-fail")
    assert (s["state"], s["consecutive_failures"], s["window_calls"], s["window_failures"]) == ("closed", 1, 1, 1)
    with pytest.raises(ConnectionError):
        call()
    assert snap("fac2-fail")["state"] == "open"


def test_fac2_async_breaker_sees_only_the_final_outcome(clock):
    """FAC-2: the same for an async protected call."""
    attempts = []

    @baldur.protected("fac2-async", retry=RetryPolicy(max_attempts=3, **NO_JITTER), failure_threshold=2)
    async def call():
        attempts.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        asyncio.run(call())
    assert len(attempts) == 3
    assert snap("fac2-async")["consecutive_failures"] == 1


# --------------------------------------------------------------------------- FAC-3


def test_fac3_attempts_are_bounded_and_the_last_error_is_raised(clock):
    """FAC-3: max_attempts bounds the attempts; the last attempt's exception propagates."""
    errors = [ConnectionError(str(i)) for i in range(4)]
    call = Flaky(*errors)
    with pytest.raises(ConnectionError) as info:
        baldur.protect("bounded", call, retry=RetryPolicy(max_attempts=4, **NO_JITTER))
    assert call.calls == 4
    assert info.value is errors[3]


def test_fac3_exponential_backoff_is_capped(clock):
    """FAC-3: backoff grows by the multiplier from backoff_initial, capped at backoff_max (seconds)."""
    policy = RetryPolicy(max_attempts=5, backoff_initial=0.1, backoff_multiplier=3.0, backoff_max=0.5, jitter=0.0)
    with pytest.raises(ConnectionError):
        baldur.protect("backoff", Flaky(ConnectionError()), retry=policy)
    assert clock.sleeps == pytest.approx([0.1, 0.3, 0.5, 0.5])


def test_fac3_jitter_stays_within_its_fraction():
    """FAC-3: jitter moves each backoff by at most +-jitter of it."""
    policy = RetryPolicy(backoff_initial=1.0, backoff_multiplier=2.0, backoff_max=10.0, jitter=0.25)
    assert policy.backoff(1, rand=lambda: 0.0) == pytest.approx(0.75)
    assert policy.backoff(1, rand=lambda: 1.0) == pytest.approx(1.25)
    assert policy.backoff(2, rand=lambda: 0.5) == pytest.approx(2.0)
    for _ in range(200):
        assert 1.5 <= policy.backoff(2) <= 2.5


def test_fac3_default_policy_from_retry_true(clock):
    """FAC-3/section 0: retry=True means RetryPolicy(): 3 attempts, about 0.1 s then 0.2 s apart."""
    call = Flaky(ConnectionError())
    with pytest.raises(ConnectionError):
        baldur.protect("retry-true", call, retry=True)
    assert call.calls == 3
    assert len(clock.sleeps) == 2
    assert 0.09 <= clock.sleeps[0] <= 0.11 and 0.18 <= clock.sleeps[1] <= 0.22


def test_fac3_no_retry_by_default(clock):
    """Section 0: retry defaults to False: one attempt."""
    call = Flaky(ConnectionError())
    with pytest.raises(ConnectionError):
        baldur.protect("no-retry", call)
    assert call.calls == 1 and clock.sleeps == []


def test_fac3_budget_bounds_the_whole_sequence(clock):
    """FAC-3: budget_seconds stops the sequence when the next wait would overrun it."""
    policy = RetryPolicy(max_attempts=10, budget_seconds=0.25, **NO_JITTER)
    call = Flaky(ConnectionError())
    with pytest.raises(ConnectionError):
        baldur.protect("budget", call, retry=policy)
    assert call.calls == 2
    assert clock.sleeps == pytest.approx([0.1])


def test_fac3_budget_counts_time_spent_in_attempts(clock):
    """FAC-3: slow attempts eat the budget too."""

    def slow():
        clock.advance(1.0)
        raise ConnectionError()

    policy = RetryPolicy(max_attempts=10, budget_seconds=2.5, **NO_JITTER)
    with pytest.raises(ConnectionError):
        baldur.protect("slow-budget", slow, retry=policy)
    assert clock.sleeps == pytest.approx([0.1, 0.2])  # third attempt ends at 3.3 s > 2.5 s


class Ignored(Exception):
    pass


def test_fac3_ignored_exceptions_are_never_retried(clock):
    """FAC-3/CB-10: an ignored exception ends the sequence at once, uncounted."""
    call = Flaky(Ignored("x"))
    with pytest.raises(Ignored):
        baldur.protect(
            "retry-ignored", call, retry=RetryPolicy(max_attempts=5, **NO_JITTER), ignore_exceptions=(Ignored,)
        )
    assert call.calls == 1 and clock.sleeps == []
    s = snap("retry-ignored")
    assert (s["consecutive_failures"], s["window_calls"]) == (0, 0)


@pytest.mark.parametrize(
    "error",
    [CircuitOpenError("inner", "open", 5.0), RateLimitCooldownError("inner", 5.0)],
    ids=["CircuitOpenError", "RateLimitCooldownError"],
)
def test_fac3_breaker_and_cooldown_refusals_are_never_retried(clock, error):
    """FAC-3: a CircuitOpenError or RateLimitCooldownError raised inside the call is not retried."""
    call = Flaky(error)
    with pytest.raises(type(error)) as info:
        baldur.protect("retry-refusal", call, retry=RetryPolicy(max_attempts=5, **NO_JITTER))
    assert info.value is error
    assert call.calls == 1 and clock.sleeps == []


def test_fac3_retry_on_limits_the_retried_types(clock):
    """FAC-3: only exceptions of retry_on types are retried; others still count as failures."""
    call = Flaky(ValueError("bad data"))
    policy = RetryPolicy(max_attempts=4, retry_on=(ConnectionError,), **NO_JITTER)
    with pytest.raises(ValueError):
        baldur.protect("retry-on", call, retry=policy)
    assert call.calls == 1
    assert snap("retry-on")["consecutive_failures"] == 1


def test_fac3_returned_failure_responses_are_retried_and_the_last_returned_unchanged(clock):
    """FAC-3/CB-11: returned failure responses are retried; the last one comes back unchanged,
    recorded as one failure, without the fallback."""
    answers = [Response(503), Response(502), Response(500)]
    fallback_calls = []
    call = Flaky(*answers)
    result = baldur.protect(
        "retry-returned",
        call,
        retry=RetryPolicy(max_attempts=3, **NO_JITTER),
        fallback=lambda: fallback_calls.append(1),
    )
    assert result is answers[2]
    assert call.calls == 3
    assert fallback_calls == []
    s = snap("retry-returned")
    assert (s["consecutive_failures"], s["window_failures"]) == (1, 1)


def test_fac3_a_good_response_after_bad_ones_is_a_success(clock):
    """FAC-3: 503 then 200: the 200 is returned and the breaker records a success."""
    ok = Response(200)
    result = baldur.protect("retry-recovered", Flaky(Response(503), ok), retry=RetryPolicy(max_attempts=3, **NO_JITTER))
    assert result is ok
    assert snap("retry-recovered")["window_failures"] == 0


def test_fac3_retry_stops_when_the_breaker_changes_state_mid_sequence(clock):
    """FAC-3/CB-8: once the breaker has been forced open during the sequence, no further attempt is made."""
    calls = []

    def call():
        calls.append(1)
        baldur.force_open_circuit("mid-trip", ttl_minutes=1)
        raise ConnectionError()

    with pytest.raises(ConnectionError):
        baldur.protect("mid-trip", call, retry=RetryPolicy(max_attempts=5, **NO_JITTER))
    assert calls == [1]


def test_fac3_async_waits_use_asyncio_sleep_not_the_blocking_sleep(clock, monkeypatch):
    """FAC-3: the async retry stage waits with asyncio.sleep (never the clock's blocking sleep)."""

    class AsyncOnlyClock:
        def __init__(self):
            self.now = 0.0

        def monotonic(self):
            return self.now

        def wall(self):
            return 1_700_000_000.0 + self.now

        def sleep(self, seconds):
            raise AssertionError("blocking sleep used in the async path")

    registry.clock = AsyncOnlyClock()
    waits = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds, *args, **kwargs):
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(runner.asyncio, "sleep", fake_sleep)

    @baldur.aprotected("async-waits", retry=RetryPolicy(max_attempts=3, **NO_JITTER))
    async def call():
        raise ConnectionError()

    with pytest.raises(ConnectionError):
        asyncio.run(call())
    assert waits == pytest.approx([0.1, 0.2])


def test_fac3_async_retry_other_coroutines_keep_running(clock):
    """FAC-3: while the async retry stage waits, other coroutines on the loop make progress."""
    progress = []

    @baldur.aprotected("async-progress", retry=RetryPolicy(max_attempts=3, **NO_JITTER))
    async def call():
        progress.append("attempt")
        raise ConnectionError()

    async def other():
        for _ in range(2):
            progress.append("other")
            await asyncio.sleep(0)

    async def main():
        results = await asyncio.gather(call(), other(), return_exceptions=True)
        return results

    results = asyncio.run(main())
    assert isinstance(results[0], ConnectionError)
    assert progress.count("attempt") == 3
    assert progress[:2] == ["attempt", "other"]  # the other coroutine ran during the first backoff


# ------------------------------------------------------------------------ CB-6 via facade


@pytest.mark.parametrize("style", ["sync", "async"])
def test_cb6_a_trial_is_never_retried(clock, events, style):
    """CB-6: in HALF_OPEN the retry stage makes exactly one attempt; its failure reopens."""
    attempts = []
    policy = RetryPolicy(max_attempts=5, **NO_JITTER)
    name = f"trial-{style}"
    if style == "sync":

        @baldur.protected(name, retry=policy, failure_threshold=1, recovery_timeout=1)
        def call():
            attempts.append(1)
            raise ConnectionError()

        run = call
    else:

        @baldur.protected(name, retry=policy, failure_threshold=1, recovery_timeout=1)
        async def acall():
            attempts.append(1)
            raise ConnectionError()

        def run():
            return asyncio.run(acall())

    with pytest.raises(ConnectionError):
        run()
    assert len(attempts) == 5  # CLOSED: retried
    clock.advance(1)
    attempts.clear()
    sleeps_before = len(clock.sleeps)
    with pytest.raises(ConnectionError):
        run()
    assert attempts == [1]
    assert len(clock.sleeps) == sleeps_before
    assert events.transitions()[-1] == ("half_open", "open", "half_open_failure")


# --------------------------------------------------------------------------- FAC-4


def test_fac4_fallback_on_rejection_gets_the_call_arguments(clock):
    """FAC-4: when the breaker rejects, the fallback runs with the call's own arguments; the
    protected function is not invoked."""
    called = []

    @baldur.protected("fb-reject", failure_threshold=1, fallback=lambda *a, **k: ("fallback", a, k))
    def charge(order_id, *, amount):
        called.append(order_id)
        raise ConnectionError()

    assert charge(1, amount=5) == ("fallback", (1,), {"amount": 5})  # final counted exception
    assert charge(2, amount=6) == ("fallback", (2,), {"amount": 6})  # rejection
    assert called == [1]


def test_fac4_fallback_after_the_final_counted_exception_only(clock):
    """FAC-4: with retry, the fallback runs once, after the last attempt."""
    fallback_calls = []
    call = Flaky(ConnectionError())
    result = baldur.protect(
        "fb-final",
        call,
        retry=RetryPolicy(max_attempts=3, **NO_JITTER),
        fallback=lambda: fallback_calls.append(1) or "queued",
    )
    assert result == "queued"
    assert call.calls == 3 and fallback_calls == [1]


def test_fac4_no_fallback_for_ignored_exceptions_or_base_exceptions(clock):
    """FAC-4: an ignored exception or a KeyboardInterrupt propagates; the fallback stays out."""
    fallback_calls = []

    @baldur.protected("fb-ignored", ignore_exceptions=(Ignored,), fallback=lambda *a: fallback_calls.append(a))
    def call(exc):
        raise exc

    with pytest.raises(Ignored):
        call(Ignored())
    with pytest.raises(KeyboardInterrupt):
        call(KeyboardInterrupt())
    assert fallback_calls == []


def test_fac4_fallback_error_is_chained_from_the_original(clock):
    """FAC-4: the fallback's own exception propagates with __cause__ set to the original error."""
    original = ConnectionError("down")

    def broken_fallback(*args):
        raise LookupError("cache miss")

    @baldur.protected("fb-chain", failure_threshold=1, fallback=broken_fallback)
    def call():
        raise original

    with pytest.raises(LookupError) as info:
        call()
    assert info.value.__cause__ is original
    with pytest.raises(LookupError) as info:
        call()  # now rejected
    assert isinstance(info.value.__cause__, CircuitOpenError)
    assert info.value.__cause__.reason == "open"


def test_fac4_without_fallback_the_error_propagates(clock):
    """FAC-4: no fallback: the rejection propagates as CircuitOpenError."""

    @baldur.protected("fb-none", failure_threshold=1)
    def call():
        raise ConnectionError()

    with pytest.raises(ConnectionError):
        call()
    with pytest.raises(CircuitOpenError):
        call()


def test_fac4_fallback_when_the_cooldown_refuses(clock):
    """FAC-4: a RateLimitCooldownError from the retry stage goes to the fallback; the dependency is not called."""
    baldur.record_rate_limit("fb-cool", retry_after=3600)
    calls = []

    @baldur.protected("fb-cool", retry=True, fallback=lambda *a: "later")
    def call():
        calls.append(1)
        return "now"

    assert call() == "later"
    assert calls == []


@pytest.mark.parametrize("form", ["protected", "aprotected", "aprotect"])
def test_fac4_coroutine_fallback_is_awaited_in_async_forms(clock, form):
    """FAC-4: a coroutine-function fallback is awaited by the async forms, on failure and rejection."""

    async def fallback(*args, **kwargs):
        await asyncio.sleep(0)
        return ("fallback", args)

    async def failing(*args):
        raise ConnectionError()

    name = f"afb-{form}"
    if form == "aprotect":

        def run(*args):
            return asyncio.run(baldur.aprotect(name, failing, fallback=fallback, failure_threshold=1))
    else:
        wrapped = getattr(baldur, form)(name, fallback=fallback, failure_threshold=1)(failing)

        def run(*args):
            return asyncio.run(wrapped(*args))

    expected_args = () if form == "aprotect" else (7,)
    assert run(7) == ("fallback", expected_args)
    assert baldur.get_breaker(name).state is OPEN
    assert run(7) == ("fallback", expected_args)


def test_fac4_sync_fallback_in_async_form(clock):
    """FAC-4: a plain-function fallback works in the async forms too."""

    @baldur.aprotected("afb-sync", fallback=lambda *a: "plain")
    async def call():
        raise ConnectionError()

    assert asyncio.run(call()) == "plain"


def test_fac4_async_fallback_error_is_chained(clock):
    """FAC-4: in the async form, the fallback's exception is chained from the original."""
    original = ConnectionError("down")

    async def fallback():
        raise LookupError("nope")

    async def failing():
        raise original

    with pytest.raises(LookupError) as info:
        asyncio.run(baldur.aprotect("afb-chain", failing, fallback=fallback))
    assert info.value.__cause__ is original


def test_fac4_no_fallback_for_a_returned_response_in_async(clock):
    """FAC-4/CB-11: a returned 503 is returned unchanged by the async form, no fallback."""
    answer = Response(503)

    async def call():
        return answer

    result = asyncio.run(baldur.aprotect("afb-resp", call, fallback=lambda: "fallback"))
    assert result is answer


# ---------------------------------------------------------------- CircuitOpenError


def test_circuit_open_error_retry_after_open_and_forced(clock):
    """Section 0: retry_after is the time until a probe (OPEN) or until the force lapses (forced open)."""

    @baldur.protected("retry-after", failure_threshold=1, recovery_timeout=40)
    def call():
        raise ConnectionError()

    with pytest.raises(ConnectionError):
        call()
    clock.advance(15)
    with pytest.raises(CircuitOpenError) as info:
        call()
    assert (info.value.service, info.value.reason) == ("retry-after", "open")
    assert info.value.retry_after == pytest.approx(25)
    baldur.force_open_circuit("retry-after", ttl_minutes=2)
    with pytest.raises(CircuitOpenError) as info:
        call()
    assert info.value.retry_after == pytest.approx(120)


def test_circuit_open_error_half_open_full_has_no_retry_after(clock):
    """Section 0: reason half_open_full comes with retry_after None."""
    breaker = registry.get("full", {"failure_threshold": 1, "recovery_timeout": 1, "half_open_max_calls": 1})
    breaker.record_failure(breaker.acquire())
    clock.advance(1)
    breaker.acquire()

    @baldur.circuit_breaker("full")
    def call():
        return 1

    with pytest.raises(CircuitOpenError) as info:
        call()
    assert (info.value.reason, info.value.retry_after) == ("half_open_full", None)
