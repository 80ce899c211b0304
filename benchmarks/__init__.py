"""Benchmarks of baldur_django against pybreaker and circuitbreaker (``./dev bench``).

``python -m benchmarks`` measures, in one process with the contenders interleaved round by
round, the median overhead over a bare call of: a CLOSED success, an OPEN rejection, an
awaited async CLOSED success, and the calls/second of 8 threads on one breaker, plus rows for
the other call styles (a response object, ``protected(retry=True)``, ``protect`` and
``aprotect`` with and without a per-call knob); then prints the goal verdicts. ``--quick``
runs a short version, ``--cpu-time`` times the latency loops with the thread's CPU time,
``--profile`` breaks the CLOSED hot path down. Results and method: ``docs/performance.md``.
"""

from .report import GOALS, evaluate, evaluate_runs, format_report, to_json
from .scenarios import (
    CONTENDERS,
    DEFAULT,
    QUICK,
    BenchSettings,
    ScenarioResult,
    bench_async,
    bench_closed,
    bench_open,
    bench_threads,
    run_all,
)

__all__ = [
    "BenchSettings",
    "CONTENDERS",
    "DEFAULT",
    "GOALS",
    "QUICK",
    "ScenarioResult",
    "bench_async",
    "bench_closed",
    "bench_open",
    "bench_threads",
    "evaluate",
    "evaluate_runs",
    "format_report",
    "run_all",
    "to_json",
]
