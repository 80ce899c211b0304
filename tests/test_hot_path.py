"""CB-8, CB-9: the lock-free hot path's invariants, checked on the code itself.

1. Every path that records a failure or changes a breaker's state clears the hot-path
   permits first (``Machine.invalidate``): a tracing core asserts, at each such
   mutation, that ``healthy_permit`` is already None, while a seeded random workload
   (successes, failures, ignored outcomes, 429s, forces, releases, recovery timeouts,
   reconfiguration, shared-store adoption) runs through it.
2. The profiling ladder's full replica (``benchmarks/profiling.py``) takes exactly the
   steps of the real wrapper (``core/wrappers.py``): both run on a tracing core that logs
   every attribute read, clock read and counter step, and the logs must be equal.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from baldur_django.core import hotpath
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.calls import BreakerCore
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import EventBus
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock

WATCHED = ("state", "generation", "forced", "consecutive")


class CheckedCore(BreakerCore):
    """Fails the test when a watched attribute changes while the healthy permit is set."""

    violations: list[str]

    def __setattr__(self, name: str, value: Any) -> None:
        # read through getattr, not self.__dict__: the core's fields are slots
        if name in WATCHED and getattr(self, "violations", None) is not None:
            old = getattr(self, name, None)
            grows = name != "consecutive" or (isinstance(value, int) and value > (old or 0))
            if value is not old and value != old and grows and getattr(self, "healthy_permit", None) is not None:
                self.violations.append(f"{name}: {old!r} -> {value!r}")
        super().__setattr__(name, value)


class CheckedWindow:
    """Wraps the count window; a failure added while the healthy permit is set is a violation."""

    def __init__(self, inner: Any, breaker: CheckedCore) -> None:
        self.__dict__["_inner"] = inner
        self.__dict__["_breaker"] = breaker

    def add(self, failed: bool, slow: bool = False, now: float = 0.0) -> None:
        if (failed or slow) and self._breaker.healthy_permit is not None:
            self._breaker.violations.append("window failure while healthy")
        self._inner.add(failed, slow, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


def _checked(shared: bool, clock: FakeClock) -> tuple[CircuitBreaker, CheckedCore]:
    config = build_config(
        "inv",
        {
            "failure_threshold": 3,
            "sliding_window_size": 4,
            "minimum_calls": 2,
            "recovery_timeout": 2,
            "half_open_max_calls": 2,
        },
        SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": "1"}),
    )
    breaker = CircuitBreaker("inv", config, clock=clock, bus=EventBus())
    core = breaker._core = CheckedCore("inv", config, clock, EventBus())
    core.violations = []
    core.window = CheckedWindow(core.window, core)
    if shared:
        store = MemoryStore(now=clock.wall)
        breaker.use_store(StoreGuard(store, lambda: 60.0, lambda e: None, clock.monotonic, clock.wall))
    return breaker, core


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "shared"])
@pytest.mark.parametrize("seed", range(6))
def test_cb9_every_mutation_clears_the_healthy_permit_first(shared, seed):
    """CB-8, CB-9: no failure is recorded and no state, generation, force or consecutive
    count changes while the lock-free healthy permit is still handed out."""
    rng = random.Random(seed)
    clock = FakeClock()
    breaker, core = _checked(shared, clock)
    healthy_seen = 0
    for _ in range(3000):
        op = rng.random()
        try:
            permit = breaker.acquire()
        except CircuitOpenError:
            permit = None
        if permit is not None:
            if op < 0.80:
                breaker.record_success(permit)
            elif op < 0.90:
                breaker.record_failure(permit)
            elif op < 0.93:
                breaker.record_ignored(permit)
            else:
                breaker.record_failure(permit, rate_limited=True, retry_after=0)
        healthy_seen += core.healthy_permit is not None
        roll = rng.random()
        if roll < 0.05:
            clock.advance(rng.choice([0.5, 1.0, 2.5]))
        elif roll < 0.06:
            breaker.force_open(ttl_minutes=0.05)
        elif roll < 0.07:
            breaker.force_close(ttl_minutes=0.05)
        elif roll < 0.08:
            breaker.release()
        elif roll < 0.085:
            breaker.reconfigure(breaker.config)
        elif roll < 0.09:
            breaker.report_rate_limit(0)
    assert healthy_seen > 100, "the workload must reach the healthy state often"
    assert core.violations == []


def test_cb9_checker_catches_a_mutation_that_skips_invalidate():
    """Meta-test: a failure path that forgot ``invalidate()`` is reported by the checker."""
    clock = FakeClock()
    breaker, core = _checked(False, clock)
    for _ in range(4):
        breaker.record_success(breaker.acquire())
    assert core.healthy_permit is not None
    with core.lock:  # what a mutating path without invalidate() would do
        core.consecutive += 1
        core.window.add(True)
    assert len(core.violations) == 2


class Tally:
    """Logs the hot path's steps: attribute reads of the breaker, clock reads, counter steps."""

    def __init__(self) -> None:
        self.steps: list[str] = []


class TracingCore(BreakerCore):
    tally: Tally

    def __getattribute__(self, name: str) -> Any:
        if name in HOT:
            tally = object.__getattribute__(self, "__dict__").get("tally")
            if tally is not None:  # None while __init__ runs
                tally.steps.append(f"read {name}")
        return object.__getattribute__(self, name)


HOT = {"fast_permit", "quiet_permit", "timed", "sync_due", "healthy_permit", "reject_until", "cascade", "mono"}


class TracingCounter:
    def __init__(self, tally: Tally, inner: Any) -> None:
        self.tally, self.inner = tally, inner

    def __next__(self) -> int:
        self.tally.steps.append("next(counter)")
        return next(self.inner)


class TracingCascade:
    def __init__(self, tally: Tally, inner: Any) -> None:
        self.__dict__.update(tally=tally, inner=inner)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name == "counter":
            return TracingCounter(self.tally, value)
        if name == "bucket_end":
            self.tally.steps.append("read bucket_end")
        return value


def _traced_wrapper(tally: Tally, clock: FakeClock) -> Any:
    from benchmarks.profiling import ladder

    config = build_config("ladder", {}, SettingsSource(environ={}))
    breaker = CircuitBreaker("ladder", config, clock=clock, bus=EventBus())
    core = breaker._core = TracingCore("ladder", config, clock, EventBus())
    object.__setattr__(core, "tally", tally)
    for _ in range(config.sliding_window_size + 1):
        breaker.record_success(breaker.acquire())  # steady state: window full, healthy
    inner_mono = clock.monotonic

    def mono() -> float:
        tally.steps.append("monotonic()")
        return inner_mono()

    object.__setattr__(core, "mono", mono)
    object.__setattr__(core, "cascade", TracingCascade(tally, object.__getattribute__(core, "cascade")))

    def target() -> int:
        tally.steps.append("call")
        return 1

    real = hotpath.sync_wrapper(breaker, target, None, None)
    real.breaker = breaker  # type: ignore[attr-defined]
    real.__wrapped__ = target  # type: ignore[attr-defined]
    return dict(ladder(real))


def test_profiling_ladder_takes_the_real_wrappers_steps():
    """The ladder's full replica and the real CLOSED wrapper read the same attributes, the
    clock and the cascade counter in the same order, call by call."""
    tally = Tally()
    steps = _traced_wrapper(tally, FakeClock())
    replica = steps["+ next(cascade.counter) (full replica)"]
    real = steps["the real circuit_breaker wrapper"]

    def trace(func: Any) -> list[str]:
        tally.steps.clear()
        assert func() == 1
        return list(tally.steps)

    real_steps = trace(real)
    assert "next(counter)" in real_steps and "call" in real_steps
    assert trace(replica) == real_steps
