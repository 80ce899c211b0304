"""CB-10, FAC-1, FAC-4: a misused call is refused with ConfigError and records nothing.

A misuse is the caller's mistake, not the dependency's answer: an ``aprotect()`` factory
that returns no awaitable, a synchronous ``protect()`` call (or fallback) that hands back
an awaitable, an ``async def`` fallback for a ``def``. Each is refused with the package's
ConfigError; the breaker counts no failure and no success, a trial gives its slot back,
and a refused coroutine is closed (no "never awaited" warning).
"""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

import baldur_django as baldur
from baldur_django import CircuitState, ConfigError, RetryPolicy

OPTS = {"failure_threshold": 2, "failure_rate_threshold": 0, "recovery_timeout": 5, "half_open_max_calls": 1}
ONCE = RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)


async def fetch():
    return "fetched"


def counts(name):
    breaker = baldur.get_breaker(name)
    return breaker.state, breaker.metrics()["calls"]["failure"], breaker.snapshot()["consecutive_failures"]


def open_then_due(name, clock):
    """Open breaker *name* with two real failures, then let its recovery timeout pass."""
    for _ in range(2):
        with pytest.raises(OSError):
            baldur.protect(name, _fail, **OPTS)
    assert baldur.get_breaker(name).state is CircuitState.OPEN
    clock.advance(5)


def _fail():
    raise OSError("down")


@pytest.fixture
def no_unawaited_warning():
    """Fail when a coroutine made during the test was never awaited (the RuntimeWarning
    comes when it is collected: collected here, before the check)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


# --------------------------------------------------------------- aprotect's factory
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"retry": ONCE}, {"fallback": lambda: "fallback"}],
    ids=["plain", "retry", "fallback"],
)
def test_cb10_aprotect_factory_of_no_awaitable_records_nothing(clock, kwargs):
    """CB-10: aprotect() whose factory returns a plain value raises ConfigError each time,
    and three such calls neither open the breaker nor count a failure (the plain inline
    path, the retry stage and the fallback route alike; the fallback does not answer it)."""

    async def main():
        for _ in range(3):
            with pytest.raises(ConfigError, match="needs a factory of awaitables"):
                await baldur.aprotect("mis-a", lambda: 42, **OPTS, **kwargs)
        return await baldur.aprotect("mis-a", fetch, **OPTS, **kwargs)

    assert asyncio.run(main()) == "fetched"
    assert counts("mis-a") == (CircuitState.CLOSED, 0, 0)


def test_cb10_aprotect_misuse_in_a_trial_gives_the_slot_back(clock):
    """CB-10: in HALF_OPEN a misused aprotect() call hands its trial slot back: the next
    real call is admitted as the trial and closes the breaker."""
    open_then_due("mis-b", clock)

    async def main():
        with pytest.raises(ConfigError):
            await baldur.aprotect("mis-b", lambda: 42, **OPTS)
        return await baldur.aprotect("mis-b", fetch, **OPTS)

    assert asyncio.run(main()) == "fetched"
    assert baldur.get_breaker("mis-b").state is CircuitState.CLOSED


# ------------------------------------------------- protect() handed an awaitable
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"retry": ONCE}, {"fallback": lambda: "fallback"}],
    ids=["plain", "retry", "fallback"],
)
def test_fac1_protect_refuses_a_call_that_returns_a_coroutine(clock, no_unawaited_warning, kwargs):
    """FAC-1: protect(name, lambda: fetch()) raises ConfigError naming aprotect(), closes the
    coroutine (no "never awaited" warning) and records no success and no failure; the
    fallback does not answer it."""
    for _ in range(3):
        with pytest.raises(ConfigError, match=r"returned an awaitable.*aprotect"):
            baldur.protect("mis-c", lambda: fetch(), **OPTS, **kwargs)
    assert baldur.get_breaker("mis-c").metrics()["calls"]["success"] == 0
    assert counts("mis-c") == (CircuitState.CLOSED, 0, 0)


def test_fac1_protect_refuses_a_future_too(clock):
    """FAC-1: any awaitable, not only a coroutine, is refused for a synchronous call."""

    async def main():
        future = asyncio.get_running_loop().create_future()
        with pytest.raises(ConfigError, match="returned an awaitable"):
            baldur.protect("mis-d", lambda: future, **OPTS)

    asyncio.run(main())
    assert counts("mis-d") == (CircuitState.CLOSED, 0, 0)


def test_fac1_protect_coroutine_in_a_trial_gives_the_slot_back(clock, no_unawaited_warning):
    """FAC-1, CB-10: in HALF_OPEN the refused call hands its trial slot back."""
    open_then_due("mis-e", clock)
    with pytest.raises(ConfigError):
        baldur.protect("mis-e", lambda: fetch(), **OPTS)
    assert baldur.protect("mis-e", lambda: "ok", **OPTS) == "ok"
    assert baldur.get_breaker("mis-e").state is CircuitState.CLOSED


# ---------------------------------------------------------- async fallback of a def
def test_fac4_async_fallback_for_a_def_is_refused_when_decorating():
    """FAC-4: @protected on a def with an async def fallback is a ConfigError at once."""

    async def later(*args, **kwargs):
        return "fallback"

    with pytest.raises(ConfigError, match=r"fallback .*later.* is an async def"):

        @baldur.protected("mis-f", fallback=later)
        def call():
            return "ok"


def test_fac4_async_fallback_of_an_async_def_is_accepted():
    """FAC-4: an async def with an async fallback stays fine."""

    async def later(*args, **kwargs):
        return "fallback"

    @baldur.protected("mis-g", fallback=later)
    async def call():
        raise OSError("down")

    assert asyncio.run(call()) == "fallback"


def test_fac4_protect_with_an_async_fallback_is_refused(clock):
    """FAC-4: protect() with an async def fallback raises ConfigError, whether or not its
    route was built by an earlier call, and records nothing."""

    async def later():
        return "fallback"

    baldur.protect("mis-h", lambda: "ok", **OPTS, fallback=lambda: "fallback")  # the route exists
    for _ in range(3):
        with pytest.raises(ConfigError, match="is an async def"):
            baldur.protect("mis-h", _fail, **OPTS, fallback=later)
    assert counts("mis-h") == (CircuitState.CLOSED, 0, 0)


def test_fac4_fallback_returning_a_coroutine_is_refused_at_call_time(clock, no_unawaited_warning):
    """FAC-4: a def's fallback that the decorator cannot see as async (a lambda around an
    async def) raises ConfigError when it hands back a coroutine, chained from the call's
    own error, and the coroutine is closed."""

    @baldur.protected("mis-i", fallback=lambda: fetch(), **OPTS)
    def call():
        raise OSError("down")

    with pytest.raises(ConfigError, match="returned an awaitable") as caught:
        call()
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(ConfigError, match="returned an awaitable"):
        baldur.protect("mis-j", _fail, fallback=lambda: fetch(), **OPTS)
