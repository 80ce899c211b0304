"""CB-18: predicates cost nothing on a call that returns normally unless result_predicate is set.

Proven on the code, never with a timer (speed is measured in ``./dev bench``, see
docs/performance.md, "Call overhead", and docs/performance-history.md, "Predicates"):

1. ``sys.setprofile`` records every function entered (Python and C) by one steady CLOSED
   success through each call style. With ``ignore_exceptions`` callables and a
   ``failure_predicate`` set, the list is the very list of a breaker without predicates,
   and nothing of the classifier runs; with a ``result_predicate`` the classifier is
   entered (the meta-check that the recording sees it).
2. The tracing breaker of ``tests/test_hot_path.py``: with predicates set, the real
   wrapper still takes exactly the steps of the profiling ladder's full replica.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import pytest

import baldur_django as baldur
from baldur_django.core import hotpath
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.testing import FakeClock
from tests.test_hot_path import Tally, TracingCascade, TracingCore


def never(exc: BaseException) -> bool:
    raise AssertionError("a predicate ran on a success")


EXCEPTION_PREDICATES = {"ignore_exceptions": (KeyError, never), "failure_predicate": never}
# The same number of overrides without a predicate: protect() matches its route by the
# overrides given, so the baseline passes as many (the route check is not predicate work).
BASELINE = {"ignore_exceptions": (KeyError,), "minimum_calls": 10}


def target() -> int:
    return 1


async def atarget() -> int:
    return 1


def entered(run: Callable[[], Any]) -> list[str]:
    """The functions *run* enters, in order: Python code by module and name, C functions by name."""
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")
        elif event == "c_call":
            seen.append(f"C {getattr(arg, '__qualname__', arg)}")

    gc.collect()
    gc.disable()  # a collection would run GC callbacks (hypothesis installs one) in the middle of the call
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return [name for name in seen if not name.startswith("C setprofile")]


def drive(coroutine: Any) -> Any:
    """Run a coroutine that never suspends, without an event loop (nothing else is entered)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


def call_style(style: str, service: str, options: dict[str, Any]) -> Callable[[], Any]:
    """One CLOSED success through *style*, after warming its breaker to the steady state."""
    if style == "circuit_breaker":
        func = baldur.circuit_breaker(service, **options)(target)
        run = func
    elif style == "protected":
        func = baldur.protected(service, **options)(target)
        run = func
    elif style == "circuit_breaker-async":
        afunc = baldur.circuit_breaker(service, **options)(atarget)

        def run():
            return drive(afunc())
    elif style == "protect":

        def run():
            return baldur.protect(service, target, **options)
    else:

        def run():
            return drive(baldur.aprotect(service, atarget, **options))

    for _ in range(baldur.get_breaker(service).config.sliding_window_size + 2):
        assert run() == 1  # full window, healthy lane, routes stored
    return run


STYLES = ["circuit_breaker", "protected", "circuit_breaker-async", "protect", "aprotect"]


@pytest.mark.parametrize("style", STYLES)
def test_cb18_exception_predicates_add_nothing_to_a_closed_success(clock, style):
    """CB-18: with ignore_exceptions callables and failure_predicate set, a CLOSED success enters
    exactly the functions it enters without them (as many overrides, none a predicate): no
    classifier, no predicate."""
    plain = entered(call_style(style, f"{style}-plain", dict(BASELINE)))
    judged = entered(call_style(style, f"{style}-judged", dict(EXCEPTION_PREDICATES)))
    assert judged == plain
    assert not [name for name in judged if "classify" in name or "never" in name]


@pytest.mark.parametrize("style", STYLES)
def test_cb18_meta_result_predicate_is_seen_by_the_recording(clock, style):
    """CB-18 (meta): with a result_predicate the same recording shows the classifier and the
    predicate being entered, so the test above would notice predicate work."""
    asked: list[Any] = []

    def judge(value: Any) -> bool:
        asked.append(value)
        return False

    names = entered(call_style(style, f"{style}-result", {"result_predicate": judge}))
    assert any(name.endswith("classify.result") for name in names)
    assert any(name.endswith(".judge") for name in names)
    assert asked


def _traced(tally: Tally, clock: FakeClock, overrides: dict[str, Any]) -> tuple[Any, Any]:
    from benchmarks.profiling import ladder

    config = build_config("ladder-cb18", overrides, SettingsSource(environ={}), clock)
    breaker = CircuitBreaker("ladder-cb18", config, clock=clock, bus=EventBus())
    core = breaker._core = TracingCore("ladder-cb18", config, clock, EventBus())
    object.__setattr__(core, "tally", tally)
    for _ in range(config.sliding_window_size + 1):
        breaker.record_success(breaker.acquire())
    inner_mono = clock.monotonic

    def mono() -> float:
        tally.steps.append("monotonic()")
        return inner_mono()

    object.__setattr__(core, "mono", mono)
    object.__setattr__(core, "cascade", TracingCascade(tally, object.__getattribute__(core, "cascade")))

    def traced_target() -> int:
        tally.steps.append("call")
        return 1

    real = hotpath.sync_wrapper(breaker, traced_target, None, None)
    real.breaker = breaker  # type: ignore[attr-defined]
    real.__wrapped__ = traced_target  # type: ignore[attr-defined]
    steps = dict(ladder(real))
    return steps["+ next(cascade.counter) (full replica)"], real


def test_cb18_the_wrapper_with_predicates_takes_the_ladders_steps():
    """CB-18: a breaker with exception predicates: the real CLOSED wrapper reads the same
    attributes, the clock and the cascade counter as the ladder's replica (no extra step)."""
    tally = Tally()
    replica, real = _traced(tally, FakeClock(), dict(EXCEPTION_PREDICATES))

    def trace(func: Any) -> list[str]:
        tally.steps.clear()
        assert func() == 1
        return list(tally.steps)

    real_steps = trace(real)
    assert "next(counter)" in real_steps
    assert trace(replica) == real_steps


def test_cb18_bench_predicates_runs_every_variant(clock):
    """CB-18: `./dev bench --predicates` measures each variant for a plain value and a response
    (a smoke run: one round, a few calls; the figures themselves are not judged here)."""
    from benchmarks.predicates import VARIANTS, measure

    figures = measure(rounds=1, calls=20)
    assert set(figures) == {"plain value", "response 200"}
    assert all(set(row) == set(VARIANTS) for row in figures.values())
