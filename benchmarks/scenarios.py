"""The four measured scenarios and the contenders in each.

Contenders: baldur_django's ``circuit_breaker`` and ``protected`` (default configuration:
consecutive and failure-rate triggers on, window of 100 calls, thread-safe; no retry, no
fallback), ``pybreaker.CircuitBreaker`` and ``circuitbreaker.circuit``. Every figure is
paired with a bare call of the same shape measured in the same round (see ``harness``).

Scenarios:
    closed  - a successful call in CLOSED state (ns over a bare call)
    open    - a rejected call in OPEN state, rejection exception caught (ns over a bare call)
    async   - an awaited successful ``async def`` call in CLOSED state (ns over a bare await)
    threads - calls/second with 8 threads hammering one breaker (successful calls)

Besides the four contenders, extra rows measure the other call styles (each has a goal
in ``report.GOALS``): ``protected(retry=True)`` on a call that succeeds first time
(:data:`RETRY_ROW`, closed and async), a function returning a response object
(:data:`RESPONSE_ROW`, closed), and the inline forms ``protect(name, fn)`` /
``aprotect(name, factory)``, with and without a per-call knob passed on every call
(:data:`PROTECT_ROW`, :data:`PROTECT_KNOB_ROW`, closed and threads; :data:`APROTECT_ROW`,
:data:`APROTECT_KNOB_ROW`, async).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import circuitbreaker
import pybreaker

import baldur_django as baldur
from baldur_django.core.config import build_config
from baldur_django.core.config import settings as baldur_settings

from .harness import (
    Sample,
    ainterleave,
    aloop_calls,
    aloop_protect,
    aloop_protect_knob,
    interleave,
    interleave_threads,
    loop_calls,
    loop_protect,
    loop_protect_knob,
    loop_protect_knobs3,
    loop_protect_knobs5,
    loop_rejections,
    now_ns,
)

__all__ = [
    "BARE",
    "CIRCUIT_BREAKER",
    "PROTECTED",
    "PYBREAKER",
    "CIRCUITBREAKER",
    "CONTENDERS",
    "RESPONSE_ROW",
    "RETRY_ROW",
    "PROTECT_ROW",
    "PROTECT_KNOB_ROW",
    "APROTECT_ROW",
    "APROTECT_KNOB_ROW",
    "PROTECT_KNOBS3_ROW",
    "PROTECT_KNOBS5_ROW",
    "CREATE_PROTECT_ROW",
    "BenchSettings",
    "DEFAULT",
    "QUICK",
    "ScenarioResult",
    "bench_closed",
    "bench_open",
    "bench_async",
    "bench_threads",
    "bench_create",
    "bench_memory",
    "run_all",
]

BARE = "bare"
CIRCUIT_BREAKER = "circuit_breaker"
PROTECTED = "protected"
PYBREAKER = "pybreaker"
CIRCUITBREAKER = "circuitbreaker"
CONTENDERS = (CIRCUIT_BREAKER, PROTECTED, PYBREAKER, CIRCUITBREAKER)
#: Informational row of the CLOSED scenario: circuit_breaker around a call returning a
#: response object (status_code 200), which takes the status-classifying path.
RESPONSE_ROW = "circuit_breaker, returns a response"
#: Informational row of the CLOSED and async scenarios: ``protected(retry=True)`` around a
#: call that succeeds first time (the retry stage's happy path; compare with ``protected``).
RETRY_ROW = "protected(retry=True), succeeds first time"
#: Rows of the CLOSED and thread scenarios: ``baldur.protect(name, fn)`` written inline, the
#: way a view calls it (one call per protected call, nothing decorated beforehand).
PROTECT_ROW = "protect(name, fn)"
#: The same with a per-call knob passed on every call (``failure_threshold=3``).
PROTECT_KNOB_ROW = "protect(name, fn, failure_threshold=3)"
#: Rows of the async scenario: ``await baldur.aprotect(name, factory)``, with and without a knob.
APROTECT_ROW = "aprotect(name, factory)"
APROTECT_KNOB_ROW = "aprotect(name, factory, failure_threshold=3)"
#: The knob-count rows of the CLOSED scenario: ``protect`` with three and with five knobs
#: passed literally on every call (the one-knob row is :data:`PROTECT_KNOB_ROW`).
PROTECT_KNOBS3_ROW = "protect(name, fn, retry=False, failure_threshold=5, recovery_timeout=3600)"
PROTECT_KNOBS5_ROW = "protect(name, fn, <those 3>, failure_rate_threshold=50, minimum_calls=10)"
#: Row of the create scenario: a new breaker made by its first inline ``protect(name, fn)``.
CREATE_PROTECT_ROW = "protect(new name, fn)"

# Long enough that no breaker leaves OPEN while it is measured.
_OPEN_FOR_SECONDS = 3600


@dataclass(frozen=True)
class BenchSettings:
    """How much to measure.

    Attributes:
        rounds: measured rounds of the closed/open/async scenarios.
        calls: calls per contender per round in the closed scenario.
        reject_calls: rejected calls per contender per round (open scenario).
        async_calls: awaited calls per contender per round (async scenario).
        thread_rounds: measured rounds of the thread scenario.
        threads: threads hammering one breaker.
        per_thread: calls per thread per round.
        warmup: calls made through every breaker before measuring; raised to at least
            twice baldur's window size so its steady-state path is what gets measured.
        seed: seeds the per-round shuffle of the contenders.
        create_rounds: measured rounds of the create scenario.
        create_calls: breakers each contender creates (and calls once) per round.
        memory_breakers: breakers per library whose memory is traced (memory scenario).
    """

    rounds: int = 160
    calls: int = 10_000
    reject_calls: int = 2_000
    async_calls: int = 5_000
    thread_rounds: int = 21
    threads: int = 8
    per_thread: int = 20_000
    warmup: int = 1_000
    seed: int = 1
    create_rounds: int = 41
    create_calls: int = 100
    memory_breakers: int = 1_000


DEFAULT = BenchSettings()
QUICK = BenchSettings(
    rounds=25,
    calls=5_000,
    reject_calls=1_000,
    async_calls=3_000,
    thread_rounds=5,
    per_thread=6_000,
    create_rounds=11,
    create_calls=50,
    memory_breakers=300,
)


@dataclass
class ScenarioResult:
    """What one scenario measured.

    Attributes:
        key: ``"closed"``, ``"open"``, ``"async"`` or ``"threads"``.
        title: a one-line description.
        throughput: True when figures are calls/second (higher is better), False when
            they are nanoseconds over the bare call (lower is better).
        bare: the median bare figure (ns per call, or calls/second).
        samples: contender -> :class:`Sample`.
        missing: contender -> why it could not be measured (shown as n/a).
        extra: rows of the other call styles (not contenders; the goals compare some of
            them with a contender) -> :class:`Sample`.
        unit: ``"ns"`` (time over the bare call) or ``"B"`` (bytes, the memory scenario).
    """

    key: str
    title: str
    throughput: bool
    bare: float
    samples: dict[str, Sample]
    missing: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Sample] = field(default_factory=dict)
    unit: str = "ns"

    def value(self, contender: str) -> float | None:
        """The headline figure: median ns over bare, or median calls/second; None when n/a."""
        sample = self.samples.get(contender) or self.extra.get(contender)
        if sample is None:
            return None
        return sample.median if self.throughput else sample.overhead


# --------------------------------------------------------------------------- targets
def _target() -> int:
    return 1


async def _atarget() -> int:
    return 1


class _Response:
    """Stands in for an HTTP client's response: a 200 status, nothing else."""

    status_code = 200


_RESPONSE = _Response()


def _target_response() -> _Response:
    return _RESPONSE


class _Down(Exception):
    """The failure used to trip breakers in the open scenario."""


def _down() -> int:
    raise _Down("dependency down")


_ids = itertools.count()


def _service(scenario: str, kind: str) -> str:
    # unique per process: a repeated scenario never reuses a breaker left in another state
    return f"bench.{scenario}.{kind}.{next(_ids)}"


def _warm_up_baldur(func: Callable[[], Any], warmup: int) -> None:
    """Fill baldur's window with successes so the steady-state path is what we measure."""
    breaker = func.breaker  # type: ignore[attr-defined]
    size = breaker.config.sliding_window_size
    for _ in range(max(warmup, 2 * size + 10)):
        func()
    snap = breaker.snapshot()
    if snap["state"] != "closed" or snap["window_calls"] != size or snap["window_failures"]:
        raise RuntimeError(f"{breaker.name}: warm-up did not reach the steady CLOSED state: {snap}")


async def _awarm_up_baldur(func: Callable[[], Any], warmup: int) -> None:
    breaker = func.breaker  # type: ignore[attr-defined]
    size = breaker.config.sliding_window_size
    for _ in range(max(warmup, 2 * size + 10)):
        await func()
    snap = breaker.snapshot()
    if snap["state"] != "closed" or snap["window_calls"] != size or snap["window_failures"]:
        raise RuntimeError(f"{breaker.name}: warm-up did not reach the steady CLOSED state: {snap}")


def _check_steady(service: str) -> None:
    breaker = baldur.get_breaker(service)
    snap = breaker.snapshot()
    if (
        snap["state"] != "closed"
        or snap["window_calls"] != breaker.config.sliding_window_size
        or snap["window_failures"]
    ):
        raise RuntimeError(f"{service}: warm-up did not reach the steady CLOSED state: {snap}")


def _protect_services(scenario: str, warmup: int) -> tuple[str, str]:
    """Two services used through ``protect`` (without and with ``failure_threshold=3``),
    warmed up to the steady CLOSED state through the same calls that get measured."""
    plain, knob = _service(scenario, "protect"), _service(scenario, "protect_knob")
    loop_protect(baldur.protect, plain, _target, max(warmup, 210))
    loop_protect_knob(baldur.protect, knob, _target, max(warmup, 210))
    _check_steady(plain)
    _check_steady(knob)
    return plain, knob


def _closed_contenders(scenario: str, target: Callable[[], Any], warmup: int) -> dict[str, Callable[[], Any]]:
    funcs: dict[str, Callable[[], Any]] = {
        CIRCUIT_BREAKER: baldur.circuit_breaker(_service(scenario, "circuit_breaker"))(target),
        PROTECTED: baldur.protected(_service(scenario, "protected"))(target),
        PYBREAKER: pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60, name=_service(scenario, "pybreaker"))(target),
        CIRCUITBREAKER: circuitbreaker.circuit(
            failure_threshold=5, recovery_timeout=60, name=_service(scenario, "circuitbreaker")
        )(target),
    }
    _warm_up_baldur(funcs[CIRCUIT_BREAKER], warmup)
    _warm_up_baldur(funcs[PROTECTED], warmup)
    for name in (PYBREAKER, CIRCUITBREAKER):
        loop_calls(funcs[name], warmup)
    return funcs


# ------------------------------------------------------------------------- scenarios
def bench_closed(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(a) A successful call in CLOSED state: median ns per call over a bare call."""
    funcs = _closed_contenders("closed", _target, settings.warmup)
    response = baldur.circuit_breaker(_service("closed", "response"))(_target_response)
    _warm_up_baldur(response, settings.warmup)
    retried = baldur.protected(_service("closed", "retry"), retry=True)(_target)
    _warm_up_baldur(retried, settings.warmup)
    plain, knob = _protect_services("closed", settings.warmup)
    knobs3, knobs5 = _service("closed", "protect_knobs3"), _service("closed", "protect_knobs5")
    loop_protect_knobs3(baldur.protect, knobs3, _target, max(settings.warmup, 210))
    loop_protect_knobs5(baldur.protect, knobs5, _target, max(settings.warmup, 210))
    _check_steady(knobs3)
    _check_steady(knobs5)
    protect = baldur.protect
    runners: dict[str, Callable[[int], int]] = {BARE: lambda n: loop_calls(_target, n)}
    for name, func in funcs.items():
        runners[name] = lambda n, f=func: loop_calls(f, n)
    runners[RESPONSE_ROW] = lambda n: loop_calls(response, n)
    runners[RETRY_ROW] = lambda n: loop_calls(retried, n)
    runners[PROTECT_ROW] = lambda n: loop_protect(protect, plain, _target, n)
    runners[PROTECT_KNOB_ROW] = lambda n: loop_protect_knob(protect, knob, _target, n)
    runners[PROTECT_KNOBS3_ROW] = lambda n: loop_protect_knobs3(protect, knobs3, _target, n)
    runners[PROTECT_KNOBS5_ROW] = lambda n: loop_protect_knobs5(protect, knobs5, _target, n)
    samples = interleave(runners, baseline=BARE, rounds=settings.rounds, n=settings.calls, seed=settings.seed)
    for service in (plain, knob, knobs3, knobs5):
        _check_steady(service)
    bare = samples.pop(BARE)
    rows = (RESPONSE_ROW, RETRY_ROW, PROTECT_ROW, PROTECT_KNOB_ROW, PROTECT_KNOBS3_ROW, PROTECT_KNOBS5_ROW)
    extra = {row: samples.pop(row) for row in rows}
    return ScenarioResult("closed", "CLOSED, successful call", False, bare.median, samples, extra=extra)


def _trip(func: Callable[[], Any], rejection: type[BaseException]) -> None:
    """Fail calls through *func* until it rejects; raise if it never does."""
    for _ in range(1_000):
        try:
            func()
        except rejection:
            return
        except _Down:
            continue
    raise RuntimeError(f"{func!r} never opened")


def bench_open(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(b) A rejected call in OPEN state, rejection caught: median ns over a bare call."""
    funcs = {
        CIRCUIT_BREAKER: baldur.circuit_breaker(
            _service("open", "circuit_breaker"), recovery_timeout=_OPEN_FOR_SECONDS
        )(_down),
        PROTECTED: baldur.protected(_service("open", "protected"), recovery_timeout=_OPEN_FOR_SECONDS)(_down),
        PYBREAKER: pybreaker.CircuitBreaker(
            fail_max=5, reset_timeout=_OPEN_FOR_SECONDS, name=_service("open", "pybreaker")
        )(_down),
        CIRCUITBREAKER: circuitbreaker.circuit(
            failure_threshold=5, recovery_timeout=_OPEN_FOR_SECONDS, name=_service("open", "circuitbreaker")
        )(_down),
    }
    rejections: dict[str, type[BaseException]] = {
        CIRCUIT_BREAKER: baldur.CircuitOpenError,
        PROTECTED: baldur.CircuitOpenError,
        PYBREAKER: pybreaker.CircuitBreakerError,
        CIRCUITBREAKER: circuitbreaker.CircuitBreakerError,
    }
    for name, func in funcs.items():
        _trip(func, rejections[name])
    for name in (CIRCUIT_BREAKER, PROTECTED):
        state = funcs[name].breaker.state  # type: ignore[attr-defined]
        if state is not baldur.CircuitState.OPEN:
            raise RuntimeError(f"baldur {name} breaker is {state}, expected OPEN")
    runners: dict[str, Callable[[int], int]] = {BARE: lambda n: loop_rejections(_target, n, _Down)}
    for name, func in funcs.items():
        runners[name] = lambda n, f=func, exc=rejections[name]: loop_rejections(f, n, exc)
    samples = interleave(runners, baseline=BARE, rounds=settings.rounds, n=settings.reject_calls, seed=settings.seed)
    for name, func in funcs.items():  # still open: every measured call was a rejection
        try:
            func()
        except rejections[name]:
            continue
        except _Down:
            pass
        raise RuntimeError(f"{name} left OPEN during the measurement: the figures are not rejections")
    bare = samples.pop(BARE)
    return ScenarioResult("open", "OPEN, rejected call (exception caught)", False, bare.median, samples)


def _pybreaker_async_reason() -> str:
    if getattr(pybreaker, "HAS_TORNADO_SUPPORT", False):
        return "call_async is Tornado-only"
    return "call_async needs Tornado (not installed)"


def bench_async(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(c) An awaited successful ``async def`` call in CLOSED state, in one running event
    loop: median ns over a bare awaited coroutine."""
    funcs: dict[str, Callable[[], Any]] = {
        CIRCUIT_BREAKER: baldur.circuit_breaker(_service("async", "circuit_breaker"))(_atarget),
        PROTECTED: baldur.protected(_service("async", "protected"))(_atarget),
        CIRCUITBREAKER: circuitbreaker.circuit(
            failure_threshold=5, recovery_timeout=60, name=_service("async", "circuitbreaker")
        )(_atarget),
        RETRY_ROW: baldur.protected(_service("async", "retry"), retry=True)(_atarget),
    }

    plain, knob = _service("async", "aprotect"), _service("async", "aprotect_knob")
    aprotect = baldur.aprotect

    async def main() -> dict[str, Sample]:
        await _awarm_up_baldur(funcs[CIRCUIT_BREAKER], settings.warmup)
        await _awarm_up_baldur(funcs[PROTECTED], settings.warmup)
        await _awarm_up_baldur(funcs[RETRY_ROW], settings.warmup)
        await aloop_calls(funcs[CIRCUITBREAKER], settings.warmup)
        await aloop_protect(aprotect, plain, _atarget, max(settings.warmup, 210))
        await aloop_protect_knob(aprotect, knob, _atarget, max(settings.warmup, 210))
        _check_steady(plain)
        _check_steady(knob)
        runners = {BARE: lambda n: aloop_calls(_atarget, n)}
        for name, func in funcs.items():
            runners[name] = lambda n, f=func: aloop_calls(f, n)
        runners[APROTECT_ROW] = lambda n: aloop_protect(aprotect, plain, _atarget, n)
        runners[APROTECT_KNOB_ROW] = lambda n: aloop_protect_knob(aprotect, knob, _atarget, n)
        return await ainterleave(
            runners, baseline=BARE, rounds=settings.rounds, n=settings.async_calls, seed=settings.seed
        )

    samples = asyncio.run(main())
    bare = samples.pop(BARE)
    extra = {row: samples.pop(row) for row in (RETRY_ROW, APROTECT_ROW, APROTECT_KNOB_ROW)}
    return ScenarioResult(
        "async",
        "async def, awaited successful call, CLOSED",
        False,
        bare.median,
        samples,
        missing={PYBREAKER: _pybreaker_async_reason()},
        extra=extra,
    )


def bench_threads(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(d) Calls/second with ``settings.threads`` threads hammering one breaker."""
    funcs = _closed_contenders("threads", _target, settings.warmup)
    plain, knob = _protect_services("threads", settings.warmup)
    runners: dict[str, Callable[[], Any]] = {BARE: _target, **funcs}
    protect = baldur.protect
    loops: dict[str, Callable[[int], Any]] = {  # each thread writes protect(...) inline, as in bench_closed
        PROTECT_ROW: lambda n: loop_protect(protect, plain, _target, n),
        PROTECT_KNOB_ROW: lambda n: loop_protect_knob(protect, knob, _target, n),
    }
    samples = interleave_threads(
        runners,
        baseline=BARE,
        rounds=settings.thread_rounds,
        threads=settings.threads,
        per_thread=settings.per_thread,
        seed=settings.seed,
        loops=loops,
    )
    for name in (CIRCUIT_BREAKER, PROTECTED):
        snap = funcs[name].breaker.snapshot()  # type: ignore[attr-defined]
        if snap["state"] != "closed" or snap["window_failures"]:
            raise RuntimeError(f"{name}: the thread run disturbed the breaker: {snap}")
    for service in (plain, knob):
        _check_steady(service)
    bare = samples.pop(BARE)
    extra = {row: samples.pop(row) for row in (PROTECT_ROW, PROTECT_KNOB_ROW)}
    return ScenarioResult(
        "threads", f"{settings.threads} threads, one breaker, successful calls", True, bare.median, samples, extra=extra
    )


def _creators(settings: BenchSettings) -> dict[str, Callable[[str], Any]]:
    """contender -> ``make(name)``: build a breaker of the default configuration around
    ``_target`` and make its first (successful) call; returns what keeps the breaker alive."""

    def make_baldur(name: str) -> Any:
        func = baldur.circuit_breaker(name)(_target)
        func()
        return func

    def make_pybreaker(name: str) -> Any:
        func = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60, name=name)(_target)
        func()
        return func

    def make_circuitbreaker(name: str) -> Any:
        func = circuitbreaker.circuit(failure_threshold=5, recovery_timeout=60, name=name)(_target)
        func()
        return func

    return {CIRCUIT_BREAKER: make_baldur, PYBREAKER: make_pybreaker, CIRCUITBREAKER: make_circuitbreaker}


def bench_create(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(e) Creating a breaker (default configuration) and making its first call: median ns
    per breaker over a bare call. Every creation uses a name never used before (made up
    front, outside the timed loop); baldur's breakers go into its registry as in an app.
    The extra row makes the breaker through its first inline ``protect(new name, fn)``."""
    makers = _creators(settings)
    protect = baldur.protect
    per_round = settings.create_calls
    pools: dict[str, list[list[str]]] = {}

    def names_for(kind: str) -> list[list[str]]:
        return [[_service("create", kind) for _ in range(per_round)] for _ in range(settings.create_rounds + 1)]

    def timed(kind: str, make: Callable[[str], Any]) -> Callable[[int], int]:
        pools[kind] = names_for(kind)
        keep: list[Any] = []

        def runner(n: int) -> int:
            batch = pools[kind].pop()
            start = now_ns()
            for name in batch:
                keep.append(make(name))
            return now_ns() - start

        return runner

    def bare(name: str) -> Any:
        return _target()

    runners: dict[str, Callable[[int], int]] = {BARE: timed(BARE, bare)}
    for name, make in makers.items():
        runners[name] = timed(name, make)
    runners[CREATE_PROTECT_ROW] = timed(CREATE_PROTECT_ROW, lambda name: protect(name, _target))
    samples = interleave(runners, baseline=BARE, rounds=settings.create_rounds, n=per_round, seed=settings.seed)
    bare_sample = samples.pop(BARE)
    extra = {CREATE_PROTECT_ROW: samples.pop(CREATE_PROTECT_ROW)}
    return ScenarioResult(
        "create",
        "a new breaker and its first call",
        False,
        bare_sample.median,
        samples,
        missing={PROTECTED: "same as circuit_breaker"},
        extra=extra,
    )


def traced_bytes_per_breaker(make: Callable[[str], Any], names: list[str]) -> float:
    """Bytes tracemalloc sees allocated, and still alive, per ``make(name)`` over *names*
    (garbage collected before and after; what *make* returns is kept until the end)."""
    import gc
    import tracemalloc

    keep: list[Any] = [None] * len(names)
    make(names[0] + ".warm")  # first-use costs (imports, caches, interned strings) stay out
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, name in enumerate(names):
            keep[i] = make(name)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / len(names)


def bench_memory(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(f) Memory per breaker at the default configuration (baldur: count window of 100),
    decorated around a function and called once: bytes per breaker, traced with
    ``tracemalloc`` over ``settings.memory_breakers`` breakers of each library."""
    from baldur_django.core.registry import registry

    # Every run starts from an empty registry, so each measures the same growth: a registry
    # already holding the other scenarios' breakers put a resize of its tables (300 to 700 B
    # per breaker) into some runs and not others.
    registry.clear()
    samples: dict[str, Sample] = {}
    for name, make in _creators(settings).items():
        names = [_service("memory", name) for _ in range(settings.memory_breakers)]
        size = traced_bytes_per_breaker(make, names)
        samples[name] = Sample([size], [size])
    return ScenarioResult(
        "memory",
        "memory per breaker (bytes, tracemalloc)",
        False,
        0.0,
        samples,
        missing={PROTECTED: "same as circuit_breaker"},
        unit="B",
    )


def bench_stages(settings: BenchSettings = DEFAULT) -> ScenarioResult:
    """(g) The CLOSED success with one outbound stage on (:mod:`.stage_rows`)."""
    from .stage_rows import bench_stages as run

    result: ScenarioResult = run(settings)
    return result


SCENARIOS = {
    "closed": bench_closed,
    "open": bench_open,
    "async": bench_async,
    "threads": bench_threads,
    "create": bench_create,
    "memory": bench_memory,
    "stages": bench_stages,
}


def run_all(
    settings: BenchSettings = DEFAULT, only: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, ScenarioResult]:
    """Run the scenarios (all, or those named in *only*) in order; return key -> result.

    Raises:
        ValueError: an unknown scenario name in *only*.
    """
    keys = list(SCENARIOS) if not only else list(only)
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    results = {}
    for key in keys:
        if progress:
            progress(key)
        results[key] = SCENARIOS[key](settings)
    return results


def environment() -> dict[str, Any]:
    """Facts about the machine and the libraries, printed with every run."""
    import os
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        usable = os.cpu_count() or 0
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover
        load = (float("nan"),) * 3
    from .harness import clock_name

    cfg = build_config("bench.closed", {})  # what a new breaker gets; registers nothing
    backend = baldur_settings.get("BALDUR_STATE_BACKEND")
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "loadavg": load,
        "switchinterval": sys.getswitchinterval(),
        "clock": clock_name(),
        "baldur_django": baldur.__version__,
        "pybreaker": version("pybreaker"),
        "circuitbreaker": version("circuitbreaker"),
        "baldur_window": cfg.sliding_window_size,
        "baldur_rate_threshold": cfg.failure_rate_threshold,
        "baldur_failure_threshold": cfg.failure_threshold,
        "baldur_store": backend,
        "git": _git_revision(),
    }


def _git_revision() -> str:
    """``<short HEAD>`` plus ``+modified`` when the core has uncommitted changes; ``?`` without git."""
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "baldur_django/core"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    if head.returncode != 0:
        return "?"
    return head.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")
