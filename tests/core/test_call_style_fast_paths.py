"""The fast paths of issue 12 behave exactly like the slow ways they short-cut: FAC-1..FAC-4,
CB-4, CB-8, CB-9, CB-11.

1. ``protect``/``aprotect`` reuse a route per service (``core/hotpath.py``). A seeded
   script of calls (plain and refused callables, bad and good overrides, retry
   arguments, fallbacks, state changes) runs through the real functions and through the
   way they were written before routes existed (every check and a new wrapper per call);
   every return value, exception, snapshot, event and log line must be the same.
2. Race tests with real threads (``sys.setswitchinterval(1e-6)``, start barrier) for the
   new lock-free paths: ``protect``'s inline CLOSED path, the wrappers' inlined OPEN
   rejection, the retry stage's inline first attempt. Each has a meta-test showing the
   race test fails when the protection it relies on is taken away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import functools
import gc
import logging
import random
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import baldur_django as baldur
from baldur_django import CircuitOpenError, ConfigError, RetryPolicy
from baldur_django.core import hotpath, routes
from baldur_django.core.breaker import CircuitBreaker, core_of
from baldur_django.core.calls import BreakerCore
from baldur_django.core.errors import awaitable_refused, is_awaitable
from baldur_django.core.events import bus
from baldur_django.core.registry import registry
from baldur_django.core.retry import coerce_retry
from baldur_django.core.testing import FakeClock, RecordingListener

from .test_concurrency import NoLock, YieldingWindow, cascade_calls, fast_switching, run_threads  # noqa: F401

LOGGER = "baldur.circuit_breaker"


# ------------------------------------------------------------- the slow way, as it was
def protect_without_routes(service, call, *, retry=False, fallback=None, **overrides):
    """``protect`` before issue 12: every check, then a new wrapper around *call*."""
    if routes.is_async(call):
        raise ConfigError(f"protect({service!r}) got a coroutine function; use aprotect() for async calls")
    routes.refuse_generators(call)
    routes.check_fallback(service, fallback)
    routes.refuse_async_fallback(f"protect({service!r})", fallback)
    breaker = routes.breaker_for(service, overrides)

    def attempt():  # a call that hands back an awaitable is refused (FAC-1)
        value = call()
        if is_awaitable(value):
            raise awaitable_refused(f"protect({service!r})'s call", value)
        return value

    return hotpath.sync_wrapper(breaker, attempt, coerce_retry(retry), fallback)()


async def aprotect_without_routes(service, factory, *, retry=False, fallback=None, **overrides):
    """``aprotect`` before issue 12."""
    import inspect

    routes.refuse_generators(factory)
    routes.check_fallback(service, fallback)
    breaker = routes.breaker_for(service, overrides)

    async def call():
        value = factory()
        if not inspect.isawaitable(value):
            raise ConfigError(
                f"aprotect({service!r}) needs a factory of awaitables; it returned {type(value).__name__}"
            )
        return await value

    return await hotpath.async_wrapper(breaker, call, coerce_retry(retry), fallback)()


# ------------------------------------------------------------------------- a script
class Boom(Exception):
    pass


class Response:
    def __init__(self, status_code):
        self.status_code = status_code


class Client:
    def get(self):
        return "method"

    async def aget(self):
        return "amethod"


def ok():
    return 1


def boom():
    raise Boom("down")


async def aok():
    return "async"


async def aboom():
    raise Boom("adown")


def gen():
    yield 1


def gen_needs_arg(x):
    yield x


async def agen():
    yield 1


async def needs_arg(x):
    return x


POLICY = RetryPolicy(max_attempts=2, jitter=0.0, backoff_initial=0.5)

# What a step can pass; most steps pass the common case, so routes get reused.
SYNC_CALLS: list[tuple[str, Callable[[], Any]]] = [
    ("lambda", lambda: lambda: 1),
    ("def", lambda: ok),
    ("lambda-200", lambda: lambda: Response(200)),
    ("lambda-503", lambda: lambda: Response(503)),
    ("lambda-429", lambda: lambda: Response(429)),
    ("failing", lambda: boom),
    ("lambda-key-error", lambda: lambda: {}["missing"]),
    ("lambda-returns-coroutine", lambda: lambda: _closed_coroutine()),
    ("async-def", lambda: aok),
    ("generator", lambda: gen),
    ("generator-needing-an-argument", lambda: gen_needs_arg),
    ("async-generator", lambda: agen),
    ("method", lambda: Client().get),
    ("async-method", lambda: Client().aget),
    ("partial", lambda: functools.partial(ok)),
    ("not-callable", lambda: 42),
]
ASYNC_CALLS: list[tuple[str, Callable[[], Any]]] = [
    ("async-def", lambda: aok),
    ("lambda-coroutine", lambda: lambda: aok()),
    ("failing", lambda: aboom),
    ("lambda-503", lambda: lambda: _resolved(Response(503))),
    ("async-method", lambda: Client().aget),
    ("partial", lambda: functools.partial(aok)),
    ("not-awaitable", lambda: lambda: 7),
    ("generator", lambda: gen),
    ("async-generator", lambda: agen),
    ("generator-needing-an-argument", lambda: gen_needs_arg),
    ("async-def-needing-an-argument", lambda: needs_arg),
    ("not-callable", lambda: 42),
]
RETRIES: list[Callable[[], Any]] = [
    lambda: False,
    lambda: True,
    lambda: POLICY,
    lambda: dataclasses.replace(POLICY),
    lambda: 1,
    lambda: None,
]
FALLBACKS: list[Callable[[], Any]] = [lambda: lambda: "fallback", lambda: 42]
OVERRIDES: list[Callable[[], dict[str, Any]]] = [
    lambda: {"failure_threshold": 3},
    lambda: {"failure_threshold": True},
    lambda: {"failure_threshold": 3.0},
    lambda: {"failure_threshold": decimal.Decimal(3)},
    lambda: {"failure_threshold": 4},
    lambda: {"failure_threshold": None},
    lambda: {"failure_threshold": 3, "recovery_timeout": 5},
    lambda: {"failure_threshold": 3, "recovery_timeout": True},
    lambda: {"ignore_exceptions": (KeyError,)},
    lambda: {"ignore_exceptions": [KeyError]},
    lambda: {"ignore_exceptions": ["not an exception"]},
    lambda: {"nonsense": 1},
    lambda: {"recovery_timeout": 10**400},
    # five knobs (issue 21): equal values of another type, and another value, on a later call
    lambda: {
        "failure_threshold": 3,
        "recovery_timeout": 5,
        "failure_rate_threshold": 50,
        "minimum_calls": 10,
        "sliding_window_size": 20,
    },
    lambda: {
        "failure_threshold": 3,
        "recovery_timeout": 5,
        "failure_rate_threshold": 50,
        "minimum_calls": 10.0,
        "sliding_window_size": 20,
    },
    lambda: {
        "failure_threshold": 3,
        "recovery_timeout": 5,
        "failure_rate_threshold": 50,
        "minimum_calls": True,
        "sliding_window_size": 20,
    },
    lambda: {
        "failure_threshold": 3,
        "recovery_timeout": 5,
        "failure_rate_threshold": 50,
        "minimum_calls": 11,
        "sliding_window_size": 20,
    },
    lambda: {
        "failure_threshold": 3,
        "recovery_timeout": 5,
        "failure_rate_threshold": 50,
        "minimum_calls": 30,
        "sliding_window_size": 20,
    },
]


def _closed_coroutine():
    coro = aok()
    coro.close()
    return coro


async def _resolved(value):
    return value


def script(seed: int, length: int, calls: list[tuple[str, Callable[[], Any]]]) -> list[dict[str, Any]]:
    """A seeded list of steps: ``{"service", "call", "retry", "fallback", "overrides"}``
    (factories, so each run gets its own objects) or an operator action."""
    rng = random.Random(seed)
    failing = next(factory for name, factory in calls if name == "failing")
    # a fixed start: trip "a" with failures (consecutive threshold 5), one rejected call
    steps: list[dict[str, Any]] = [
        {"service": "a", "call": failing, "retry": RETRIES[0], "fallback": None, "overrides": dict} for _ in range(5)
    ]
    steps.append({"service": "a", "call": calls[0][1], "retry": RETRIES[0], "fallback": None, "overrides": dict})
    for _ in range(length):
        roll = rng.random()
        if roll < 0.04:
            steps.append(
                {
                    "action": rng.choice(["advance", "force_open", "force_close", "release", "clear"]),
                    "service": rng.choice(["a", "b"]),
                }
            )
            continue
        step = {
            "service": rng.choice(["a", "a", "b"]),
            "call": calls[0][1],
            "retry": RETRIES[0],
            "fallback": None,
            "overrides": dict,
        }
        if rng.random() < 0.45:
            step["call"] = rng.choice(calls)[1]
        if rng.random() < 0.2:
            step["retry"] = rng.choice(RETRIES)
        if rng.random() < 0.2:
            step["fallback"] = rng.choice(FALLBACKS)
        if rng.random() < 0.35:
            step["overrides"] = rng.choice(OVERRIDES)
        steps.append(step)
    return steps


def outcome_of(run: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        value = run()
    except Exception as exc:  # noqa: BLE001 - compared between the two runs
        return ("raised", type(exc).__name__, str(exc), type(exc.__cause__).__name__)
    if isinstance(value, Response):
        return ("returned", "Response", value.status_code)
    return ("returned", repr(value) if not asyncio.iscoroutine(value) else "coroutine")


def play(steps: list[dict[str, Any]], run_call: Callable[..., Any], caplog) -> dict[str, Any]:
    """Run *steps* on a fresh registry and FakeClock; everything observable, for comparison."""
    registry.clear()
    clock = FakeClock()
    registry.clock = clock
    random.seed(12)  # the retry backoff's jitter
    caplog.clear()
    listener = RecordingListener(bus)
    outcomes = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in steps:
                action = step.get("action")
                if action == "advance":
                    clock.advance(7)
                elif action == "clear":
                    registry.clear()
                elif action in ("force_open", "force_close"):
                    getattr(baldur, f"{action}_circuit")(step["service"], ttl_minutes=0.2)
                elif action == "release":
                    baldur.release_circuit(step["service"])
                else:
                    fallback = None if step["fallback"] is None else step["fallback"]()
                    outcomes.append(
                        outcome_of(
                            lambda: run_call(
                                step["service"],
                                step["call"](),
                                retry=step["retry"](),
                                fallback=fallback,
                                **step["overrides"](),
                            )
                        )
                    )
            gc.collect()
        snapshots = {name: registry.get(name, create=False).snapshot() for name in registry.names()}
    finally:
        bus.unsubscribe(listener)
    return {
        "outcomes": outcomes,
        "snapshots": snapshots,
        "events": [dataclasses.asdict(e) for e in listener.events],
        "logs": [(r.name, r.levelname, r.getMessage()) for r in caplog.records],
        "warnings": [str(w.message) for w in caught],
        "sleeps": clock.sleeps,
    }


@pytest.mark.parametrize("seed", range(6))
def test_fac1_protect_with_routes_does_what_it_did_without(seed, caplog, monkeypatch):
    """FAC-1..FAC-4, CB-11, CFG-3: the same script through ``protect`` and through the
    route-less ``protect`` of before: identical values, errors (type, message, cause),
    breaker snapshots, events, log lines, warnings and sleeps."""
    caplog.set_level(logging.INFO)
    steps = script(seed, 400, SYNC_CALLS)
    misses = _count_misses(monkeypatch, "protect_route")
    routed = play(steps, baldur.protect, caplog)
    monkeypatch.undo()
    reference = play(steps, protect_without_routes, caplog)
    assert routed["outcomes"] == reference["outcomes"]
    assert routed == reference
    # the script exercises what it claims: successes, refusals, rejections, bad options,
    # and most calls took a stored route
    kinds = {o[1] if o[0] == "raised" else "returned" for o in routed["outcomes"]}
    assert {"returned", "ConfigError", "CircuitOpenError", "Boom"} <= kinds
    assert len(routed["outcomes"]) - len(misses) > len(routed["outcomes"]) / 5  # calls that took a route


def _count_misses(monkeypatch, name: str) -> list[int]:
    misses: list[int] = []
    real = getattr(hotpath, name)  # what protect()/aprotect() call on a miss
    monkeypatch.setattr(hotpath, name, lambda *args: misses.append(1) or real(*args))
    return misses


@pytest.mark.parametrize("seed", range(4))
def test_fac1_aprotect_with_routes_does_what_it_did_without(seed, caplog, monkeypatch):
    """FAC-1..FAC-4: the same comparison for ``aprotect`` (each step in its own event loop)."""
    caplog.set_level(logging.INFO)
    steps = script(seed, 400, ASYNC_CALLS)
    misses = _count_misses(monkeypatch, "aprotect_route")

    def routed_call(*args, **kwargs):
        return asyncio.run(baldur.aprotect(*args, **kwargs))

    def reference_call(*args, **kwargs):
        return asyncio.run(aprotect_without_routes(*args, **kwargs))

    routed = play(steps, routed_call, caplog)
    monkeypatch.undo()
    reference = play(steps, reference_call, caplog)
    assert routed["outcomes"] == reference["outcomes"]
    assert routed == reference
    kinds = {o[1] if o[0] == "raised" else "returned" for o in routed["outcomes"]}
    assert {"returned", "ConfigError", "CircuitOpenError", "Boom"} <= kinds
    assert len(routed["outcomes"]) - len(misses) > len(routed["outcomes"]) / 5  # calls that took a route


def test_fac1_protect_checks_once_then_reuses_the_route(clock, monkeypatch):
    """FAC-1: a second call with the same arguments neither validates nor builds anything;
    a refused callable after it is still refused before it runs, and records nothing."""
    baldur.protect("reuse", lambda: 1, failure_threshold=3)
    route = hotpath.knob_routes["reuse"]
    full_way: list[str] = []
    monkeypatch.setattr(hotpath, "protect_route", lambda *a: full_way.append("slow") or route)
    for _ in range(5):
        assert baldur.protect("reuse", lambda: 2, failure_threshold=3) == 2
    assert full_way == []
    before = baldur.get_breaker("reuse").snapshot()
    ran: list[str] = []

    async def coroutine_function():
        ran.append("body")

    def generator_function():
        ran.append("body")
        yield

    monkeypatch.undo()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a coroutine never awaited would warn here
        for refused in (coroutine_function, generator_function):
            with pytest.raises(ConfigError, match=r"coroutine function|generator function"):
                baldur.protect("reuse", refused, failure_threshold=3)
        gc.collect()
    assert ran == [] and [str(w.message) for w in caught] == []
    assert baldur.get_breaker("reuse").snapshot() == before


def test_cb12_bad_names_are_refused_with_routes_around(clock):
    """CB-12: a name that is not a non-empty string is a ConfigError, not a TypeError from
    the route lookup, whatever routes exist."""
    baldur.protect("named", lambda: 1)
    asyncio.run(baldur.aprotect("named", aok))
    for name in (["named"], {}, "", None):
        with pytest.raises(ConfigError, match="breaker name"):
            baldur.protect(name, lambda: 1)
        with pytest.raises(ConfigError, match="breaker name"):
            asyncio.run(baldur.aprotect(name, aok))


def test_fac1_route_of_a_cleared_registry_is_not_used(clock):
    """CB-12: after ``registry.clear()`` protect() uses the new breaker of the name."""
    baldur.protect("cleared", lambda: 1)
    old = baldur.get_breaker("cleared")
    registry.clear()
    with pytest.raises(Boom):
        baldur.protect("cleared", boom)
    new = baldur.get_breaker("cleared")
    assert new is not old
    assert new.snapshot()["window_failures"] == 1 and old.snapshot()["window_failures"] == 0


@pytest.mark.skipif(sys.version_info < (3, 12), reason="inspect.markcoroutinefunction is Python 3.12+")
def test_fac1_protect_refuses_a_marked_coroutine_function_after_a_route(clock):  # pragma: no cover - 3.12+
    """FAC-1: a plain def marked with inspect.markcoroutinefunction is refused, route or not."""
    import inspect

    baldur.protect("marked", lambda: 1)
    ran = []

    def marked():
        ran.append("body")
        return aok()

    inspect.markcoroutinefunction(marked)
    with pytest.raises(ConfigError):
        baldur.protect("marked", marked)
    assert ran == []


def test_cb4_rejection_built_in_c_is_a_circuit_open_error_like_any_other():
    """CB-4, section 0: the hot path's ``new_open_error`` gives what the constructor gives:
    the class itself, its attributes, message, repr, args and pickling."""
    import pickle

    from baldur_django.core.errors import new_open_error

    fast, slow = new_open_error("pay", "open", 1.5), CircuitOpenError("pay", "open", 1.5)
    assert type(fast) is CircuitOpenError
    assert (fast.service, fast.reason, fast.retry_after) == (slow.service, slow.reason, slow.retry_after)
    assert (str(fast), repr(fast), fast.args) == (str(slow), repr(slow), slow.args)
    clone = pickle.loads(pickle.dumps(fast))
    assert (clone.service, clone.reason, clone.retry_after) == ("pay", "open", 1.5)
    fast.retry_after = 2.0  # attributes can still be set, as on any exception
    assert fast.retry_after == 2.0 and "retry in 2.000s" in str(fast)
    with pytest.raises(AttributeError):
        fast.no_such_attribute  # noqa: B018


# -------------------------------------------------------------------- race tests
def _fill(call: Callable[[], Any], size: int) -> None:
    for _ in range(size):
        call()


def scenario_protect_full_window(
    service: str,
    threads: int = 12,
    per_thread: int = 1200,
    failing: int = 6,
    every: int = 16,
    call_style: str = "protect",
) -> list[str]:
    """CB-9 through ``protect()``'s inline path (or a retry wrapper's inline first attempt):
    lock-free healthy successes race locked failures on a full window. Every call must be
    counted once in the cascade; flushing with successes must leave a clean window, and
    with failures a full one (the window, under the lock, never lost an outcome)."""
    breaker = baldur.get_breaker(service)
    size = breaker.config.sliding_window_size
    if call_style == "protect":

        def success() -> Any:
            return baldur.protect(service, ok)

        def failure() -> Any:
            return baldur.protect(service, boom)
    else:
        policy = RetryPolicy(max_attempts=1, jitter=0.0)
        success = baldur.protected(service, retry=policy)(ok)
        failure = baldur.protected(service, retry=policy)(boom)

    before = cascade_calls(breaker)

    def work(i: int) -> None:
        for j in range(per_thread):
            if i < failing and j % every == i:
                try:
                    failure()
                except Boom:
                    pass
            else:
                success()

    run_threads(threads, work)
    problems = []
    total = threads * per_thread
    if cascade_calls(breaker) - before != total:
        problems.append(f"cascade counted {cascade_calls(breaker) - before} calls, expected {total}")
    _fill(success, size)
    snap = breaker.snapshot()
    if (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) != (0, size, 0):
        problems.append(f"after {size} successes: {snap}")
    for _ in range(size):
        try:
            failure()
        except Boom:
            pass
    snap = breaker.snapshot()
    if (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) != (size, size, size):
        problems.append(f"after {size} failures: {snap}")
    if snap["state"] != "closed":
        problems.append(f"breaker moved: {snap['state']}")
    return problems


QUIET = dict(failure_threshold=10**9, failure_rate_threshold=0, sliding_window_size=16, minimum_calls=1)


def _quiet_breaker(service: str, *, unprotected: bool = False, always_healthy: bool = False) -> CircuitBreaker:
    """Register *service* with thresholds no scenario reaches and a full, clean window.

    *unprotected* swaps in :class:`NoLock` and :class:`YieldingWindow` (meta-tests);
    *always_healthy* makes every success look healthy to the lock-free paths, as if their
    ``healthy_permit`` test were gone (meta-tests).
    """
    breaker = registry.get(service, dict(QUIET))
    core = core_of(breaker)
    if unprotected:
        core.lock = NoLock()  # type: ignore[assignment]
        core.window = YieldingWindow(breaker.config.sliding_window_size)
    if always_healthy:
        core.__class__ = AlwaysHealthy
    for _ in range(QUIET["sliding_window_size"]):
        breaker.record_success(breaker.acquire())
    assert core.healthy_permit is not None
    return breaker


class AlwaysHealthy(BreakerCore):
    """A breaker core whose lock-free success test always passes (meta-tests only)."""

    @property  # type: ignore[override]
    def healthy_permit(self):
        return self.closed_permit

    @healthy_permit.setter
    def healthy_permit(self, value):
        pass


@pytest.mark.parametrize("call_style", ["protect", "retry"])
def test_cb9_inline_successes_race_failures_without_loss(clock, call_style):
    """CB-8, CB-9: protect()'s inline CLOSED path, and the retry stage's inline first
    attempt, under 12 threads racing failures: nothing lost, nothing counted twice."""
    _quiet_breaker("race-inline")
    assert scenario_protect_full_window("race-inline", call_style=call_style) == []


@pytest.mark.parametrize("call_style", ["protect", "retry"])
def test_meta_inline_race_shows_a_missing_lock(clock, call_style):
    """Meta (CB-9): the same race on a breaker without its lock (and with switch points
    inside its counters) goes wrong within a few attempts."""
    for attempt in range(20):
        service = f"race-unlocked-{attempt}"
        _quiet_breaker(service, unprotected=True)
        try:
            problems = scenario_protect_full_window(service, call_style=call_style)
        except Exception as exc:  # noqa: BLE001 - a corrupted breaker may also raise
            problems = [repr(exc)]
        if problems:
            return
    pytest.fail("the race test did not notice a missing lock")


@pytest.mark.parametrize("call_style", ["protect", "retry"])
def test_meta_inline_race_shows_a_missing_healthy_test(clock, call_style):
    """Meta (CB-9): if the lock-free success did not check the healthy permit (a success
    after a failure would skip the window), the race test fails."""
    _quiet_breaker("race-always-healthy", always_healthy=True)
    assert scenario_protect_full_window("race-always-healthy", call_style=call_style) != []


def scenario_no_stale_rejection(
    breaker: CircuitBreaker, call: Callable[[], Any], rounds: int = 40, threads: int = 6
) -> list[str]:
    """CB-4, CB-8: callers hammer a wrapper while the main thread forces the breaker open
    and closed. A call that starts and ends inside one closed phase (the close completed
    before it began, the next open had not started when it ended) must not be rejected:
    the inlined lock-free rejection must never outlive the OPEN state it stood for."""
    phase = [0]  # odd: opening or open; even: closed (bumped before an open, after a close)
    stop = threading.Event()
    problems: list[str] = []
    calls = [0]

    def caller(i: int) -> None:
        while not stop.is_set():
            before = phase[0]
            try:
                call()
            except CircuitOpenError:
                if before % 2 == 0 and phase[0] == before:
                    problems.append(f"rejected in closed phase {before}")
            calls[0] += 1

    def controller(i: int) -> None:
        if i:
            caller(i)
            return
        try:
            for _ in range(rounds):
                phase[0] += 1
                breaker.force_open(ttl_minutes=60)
                _wait_calls(calls, 50)
                breaker.force_close(ttl_minutes=60)
                phase[0] += 1
                _wait_calls(calls, 50)
                breaker.release()
        finally:
            stop.set()

    run_threads(threads + 1, controller)
    return problems[:5]


def _wait_calls(calls: list[int], count: int) -> None:
    target = calls[0] + count
    while calls[0] < target:
        threading.Event().wait(0)  # let the callers run (no sleep as synchronisation)


@pytest.mark.parametrize("style", ["decorator", "protect"])
def test_cb4_inline_open_rejection_never_outlives_open(clock, style):
    """CB-4, CB-8: the wrappers' inlined OPEN rejection (and protect's, through its route)
    stops as soon as the breaker closes, under 6 racing callers."""
    breaker = registry.get("race-open")
    call = (
        baldur.circuit_breaker("race-open")(ok)
        if style == "decorator"
        else functools.partial(baldur.protect, "race-open", ok)
    )
    assert scenario_no_stale_rejection(breaker, call) == []


class ForgetsTheDeadline(BreakerCore):
    """A breaker core whose transitions leave the lock-free OPEN deadline behind (meta-tests only)."""

    def invalidate(self) -> None:
        self.healthy_permit = None  # but not self.reject_until


def test_meta_stale_rejections_show_without_the_invalidation(clock):
    """Meta (CB-4, CB-8): if a transition did not clear ``reject_until`` first, callers of
    the inlined rejection would be refused while CLOSED; the race test sees it."""
    breaker = registry.get("race-stale")
    core_of(breaker).__class__ = ForgetsTheDeadline
    call = baldur.circuit_breaker("race-stale")(ok)
    assert scenario_no_stale_rejection(breaker, call, rounds=5) != []
