"""What the Prometheus metrics cost: ``python -m benchmarks --metrics [--quick] [--json FILE]``.

The CLOSED success and the OPEN rejection of ``circuit_breaker`` (and the CLOSED success of
``protected``), each as the median overhead over a bare call with the interleaved harness,
measured three times, each in a fresh process:

* ``off``: ``baldur_django.contrib.prometheus`` never imported;
* ``installed``: ``prometheus.install()`` called (one process, the default registry);
* ``multiprocess``: ``install()`` with ``PROMETHEUS_MULTIPROC_DIR`` set, so the flusher
  thread writes the counts to the directory every ``FLUSH_SECONDS`` while the loops run;
* ``otel``: no Prometheus, but ``baldur_django.contrib.otel.install()`` on an OpenTelemetry
  SDK (a ``MeterProvider`` with an in-memory reader, a ``TracerProvider``, both set as the
  global providers; per-call spans off), with the loops running inside a recording span,
  so the span-event listener is live. Its goal: the CLOSED success within noise of ``off``.

Besides, with 100 breakers that have counts: what one scrape of the default registry costs
(``installed``), and one flush pass and one scrape of the directory (``multiprocess``). Those
run off the hot path (a scrape, the flusher thread) and are given for sizing; in ``otel``
mode, one collection of the in-memory reader (``collect_ms``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

MODES = ("off", "installed", "multiprocess", "otel")
PROMETHEUS_MODES = ("installed", "multiprocess")
BREAKERS = 100  # breakers with counts for the scrape and flush figures


@dataclass(frozen=True)
class MetricsSettings:
    """How much to measure (per mode)."""

    rounds: int = 120
    calls: int = 10_000
    reject_calls: int = 2_000
    passes: int = 30  # scrapes / flush passes timed


DEFAULT = MetricsSettings()
QUICK = MetricsSettings(rounds=20, calls=4_000, reject_calls=1_000, passes=10)


def _median_ms(run: Any, passes: int) -> float:
    times = []
    for _ in range(passes):
        start = time.perf_counter_ns()
        run()
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def measure(mode: str, settings: MetricsSettings) -> dict[str, Any]:
    """Measure in this process (the parent starts one per mode, with the environment the
    mode needs). Returns the figures as a dict."""
    import circuitbreaker

    import baldur_django as baldur

    from .harness import interleave, loop_calls, loop_rejections
    from .scenarios import _Down, _down, _target, _trip, _warm_up_baldur

    if mode in PROMETHEUS_MODES:
        from baldur_django.contrib import prometheus

        prometheus.install()
    reader = _install_otel() if mode == "otel" else None
    closed_cb = baldur.circuit_breaker("bench.metrics.closed.cb")(_target)
    closed_pr = baldur.protected("bench.metrics.closed.protected")(_target)
    for func in (closed_cb, closed_pr):
        _warm_up_baldur(func, 1_000)
    opened = baldur.circuit_breaker("bench.metrics.open.cb", recovery_timeout=3600)(_down)
    _trip(opened, baldur.CircuitOpenError)
    # circuitbreaker, measured in the same rounds: the ratios to it compare across processes
    peer = circuitbreaker.circuit(failure_threshold=5, recovery_timeout=60, name="bench.metrics.peer")(_target)
    loop_calls(peer, 1_000)
    peer_open = circuitbreaker.circuit(failure_threshold=5, recovery_timeout=3600, name="bench.metrics.peer.open")(
        _down
    )
    _trip(peer_open, circuitbreaker.CircuitBreakerError)
    closed = interleave(
        {
            "bare": lambda n: loop_calls(_target, n),
            "circuit_breaker": lambda n: loop_calls(closed_cb, n),
            "protected": lambda n: loop_calls(closed_pr, n),
            "circuitbreaker": lambda n: loop_calls(peer, n),
        },
        baseline="bare",
        rounds=settings.rounds,
        n=settings.calls,
        seed=1,
    )
    rejected = interleave(
        {
            "bare": lambda n: loop_rejections(_target, n, _Down),
            "circuit_breaker": lambda n: loop_rejections(opened, n, baldur.CircuitOpenError),
            "circuitbreaker": lambda n: loop_rejections(peer_open, n, circuitbreaker.CircuitBreakerError),
        },
        baseline="bare",
        rounds=settings.rounds,
        n=settings.reject_calls,
        seed=1,
    )
    if opened.breaker.state is not baldur.CircuitState.OPEN:  # type: ignore[attr-defined]
        raise RuntimeError("the OPEN breaker left OPEN during the measurement")
    figures: dict[str, Any] = {
        "mode": mode,
        "closed_bare": closed["bare"].median,
        "closed_circuit_breaker": closed["circuit_breaker"].overhead,
        "closed_protected": closed["protected"].overhead,
        "open_bare": rejected["bare"].median,
        "open_circuit_breaker": rejected["circuit_breaker"].overhead,
        "closed_peer": closed["circuitbreaker"].overhead,
        "open_peer": rejected["circuitbreaker"].overhead,
        "load": os.getloadavg()[0],
    }
    if reader is not None:
        funcs = [baldur.circuit_breaker(f"bench.metrics.many.{i}")(_target) for i in range(BREAKERS)]
        for func in funcs:
            func()
        figures["collect_ms"] = _median_ms(reader.get_metrics_data, settings.passes)
    if mode in PROMETHEUS_MODES:
        from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        from baldur_django.contrib import prometheus

        funcs = [baldur.circuit_breaker(f"bench.metrics.many.{i}")(_target) for i in range(BREAKERS)]

        def touch() -> None:
            for func in funcs:
                func()

        touch()
        figures["scrape_ms"] = _median_ms(lambda: generate_latest(REGISTRY), settings.passes)
        if mode == "multiprocess":
            prometheus.flush()

            def flush_pass() -> None:
                touch()  # every breaker has one more call to write
                prometheus.flush()

            figures["flush_ms"] = _median_ms(flush_pass, settings.passes) - _median_ms(touch, settings.passes)

            def scrape_dir() -> None:
                target = CollectorRegistry()
                MultiProcessCollector(target)
                generate_latest(target)

            figures["scrape_ms"] = _median_ms(scrape_dir, settings.passes)
    return figures


def _install_otel() -> Any:
    """The ``otel`` mode's setup: an SDK on the global providers, contrib.otel installed,
    and a recording span made current for the rest of the process. Returns the reader."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from baldur_django.contrib import otel

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    trace.set_tracer_provider(TracerProvider())
    otel.install(spans=False)
    span = trace.get_tracer("bench").start_span("bench.metrics")
    trace.use_span(span).__enter__()  # the loops run inside it (never ended: the process exits)
    return reader


def run_modes(settings: MetricsSettings, progress: Any = None) -> list[dict[str, Any]]:
    """One fresh process per mode, in order; returns their figures."""
    results = []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for mode in MODES:
        if progress:
            progress(mode)
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        with tempfile.TemporaryDirectory(prefix="baldur-bench-metrics-") as directory:
            if mode == "multiprocess":
                env["PROMETHEUS_MULTIPROC_DIR"] = directory
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.metrics",
                    "--child",
                    mode,
                    "--settings",
                    json.dumps(asdict(settings)),
                ],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
        if done.returncode != 0:
            raise RuntimeError(f"the {mode} run failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def format_results(results: list[dict[str, Any]], settings: MetricsSettings) -> str:
    """The figures as a table (ns over a bare call; ms for scrapes and flushes)."""
    lines = [
        f"Metrics (Prometheus EM-7, OpenTelemetry OT-2): {settings.rounds} interleaved rounds per mode, each mode in a fresh process",
        "median overhead over a bare call (lower is better), with its ratio to circuitbreaker's in the same",
        f"rounds (compare those across modes); scrape (otel: collection) and flush: median ms with {BREAKERS} breakers",
        "",
        f"{'mode':<13} {'load':>5} {'CLOSED circuit_breaker':>24} {'CLOSED protected':>12}"
        f" {'OPEN circuit_breaker':>24} {'scrape':>9} {'flush pass':>11}",
    ]
    for row in results:
        scrape = f"{row['scrape_ms']:.2f} ms" if "scrape_ms" in row else "-"
        if "collect_ms" in row:
            scrape = f"{row['collect_ms']:.2f} ms"  # the otel mode: one collection of the reader
        flush = f"{row['flush_ms']:.2f} ms" if "flush_ms" in row else "-"
        closed = (
            f"{row['closed_circuit_breaker']:+.0f} ns ({_ratio(row['closed_circuit_breaker'], row['closed_peer'])})"
        )
        open_ = f"{row['open_circuit_breaker']:+.0f} ns ({_ratio(row['open_circuit_breaker'], row['open_peer'])})"
        lines.append(
            f"{row['mode']:<13} {row['load']:>5.1f} {closed:>24} {row['closed_protected']:>+9.0f} ns"
            f" {open_:>24} {scrape:>9} {flush:>11}"
        )
    return "\n".join(lines)


def _ratio(value: float, peer: float) -> str:
    return f"{value / peer:.2f}x" if peer > 0 else "n/a"


def main(argv: list[str] | None = None, *, quick: bool | None = None, json_file: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks --metrics", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one mode, in this process: JSON on the last line of stdout
        settings = MetricsSettings(**json.loads(args.settings)) if args.settings else DEFAULT
        print(json.dumps(measure(args.child, settings)))
        return 0
    settings = QUICK if (args.quick if quick is None else quick) else DEFAULT
    results = run_modes(settings, progress=lambda mode: print(f"measuring {mode} ...", file=sys.stderr, flush=True))
    print(format_results(results, settings))
    path = json_file or args.json
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"settings": asdict(settings), "results": results}, handle, indent=2)
    return 0


__all__ = [
    "MODES",
    "PROMETHEUS_MODES",
    "MetricsSettings",
    "DEFAULT",
    "QUICK",
    "measure",
    "run_modes",
    "format_results",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())
