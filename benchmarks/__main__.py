"""Command line: ``python -m benchmarks [--quick] [--profile] [--only closed,open] [--rounds N] [--runs N] [--cpu-time] [--json FILE] [--stores] [--scale [--counts N,M]] [--memory] [--inbound] [--propagation] [--metrics] [--predicates] [--http] [--incident [SCENARIO ...]]``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time

from .harness import use_cpu_time
from .profiling import format_ladder, measure_ladder, profile_closed
from .report import format_report, to_json
from .scenarios import DEFAULT, QUICK, SCENARIOS, environment, run_all


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (a few seconds; noisier figures)")
    parser.add_argument("--profile", action="store_true", help="profile circuit_breaker's CLOSED hot path instead")
    parser.add_argument("--only", default="", help=f"comma-separated scenarios to run ({', '.join(SCENARIOS)})")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="override the rounds of the closed/open/async scenarios (and the profile ladder)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="separate interleaved runs of the scenarios; each goal is decided by the median of its "
        "figure over the runs, and every run's figure is shown (default 3)",
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="also write every figure as JSON to FILE")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the closed/open/async scenarios with the thread's CPU time instead of wall time "
        "(steadier on a busy machine; the thread scenario stays on wall time)",
    )
    # --- shared-store benchmark hook (benchmarks/stores.py) ---
    parser.add_argument(
        "--stores",
        action="store_true",
        help="run the shared-store benchmark instead (benchmarks/stores.py; needs Redis)",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="with --stores, --inbound or --propagation: the Redis server and database to use",
    )
    # --- inbound-side benchmark hook (benchmarks/inbound.py) ---
    parser.add_argument(
        "--inbound",
        action="store_true",
        help="run the inbound-side benchmark instead (benchmarks/inbound.py: middlewares, rate limiters; needs Redis)",
    )
    # --- cluster propagation benchmark hook (benchmarks/propagation.py) ---
    parser.add_argument(
        "--propagation",
        action="store_true",
        help="run the cluster propagation benchmark instead (benchmarks/propagation.py: 4 worker processes; "
        "needs Redis)",
    )
    # --- fleet-scale benchmark hook (benchmarks/scale.py) ---
    parser.add_argument(
        "--scale",
        action="store_true",
        help="run the fleet-scale benchmark instead (benchmarks/scale.py: 1,000 and 10,000 breakers; memory, "
        "creation, recovery_sweep/sync_state on Redis, a /metrics scrape, baldur_status --json, the admin list; "
        "needs Redis)",
    )
    parser.add_argument(
        "--counts",
        default=None,
        help="with --scale: comma-separated breaker counts, smallest first (default 1000,10000)",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="print where a default breaker's memory goes instead (benchmarks/memory.py, tracemalloc by line)",
    )
    # --- Prometheus metrics benchmark hook (benchmarks/metrics.py) ---
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="run the metrics benchmark instead (benchmarks/metrics.py: the hot path without and with "
        "prometheus.install(), and in multiprocess mode)",
    )
    # --- predicates benchmark hook (benchmarks/predicates.py) ---
    parser.add_argument(
        "--predicates",
        action="store_true",
        help="run the predicates benchmark instead (benchmarks/predicates.py: the CLOSED success without "
        "predicates, with exception predicates and with a result_predicate)",
    )
    # --- outbound HTTP clients benchmark hook (benchmarks/http.py) ---
    parser.add_argument(
        "--http",
        action="store_true",
        help="run the outbound HTTP clients benchmark instead (benchmarks/http.py: the requests adapter and "
        "the httpx transports against a local server)",
    )
    # --- incident rehearsal hook (benchmarks/incident.py) ---
    parser.add_argument(
        "--incident",
        nargs="*",
        default=None,
        metavar="SCENARIO",
        help="run the incident rehearsal instead (benchmarks/incident.py: real servers, a Redis of its own; "
        "scenarios level, hung-store, hosts, hosts-uncapped, empty-store, trial-kill, names; default all)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.incident is not None:  # --- incident rehearsal hook ---
        from .incident import main as incident_main

        return incident_main(args.incident, quick=args.quick, json_file=args.json)
    if args.predicates:  # --- predicates benchmark hook ---
        from .predicates import main as predicates_main

        return predicates_main(["--cpu-time"] if args.cpu_time else [], quick=args.quick, rounds=args.rounds)
    if args.stores:  # --- shared-store benchmark hook ---
        from .stores import main as stores_main

        return stores_main(
            ["--redis-url", args.redis_url] if args.redis_url else [], quick=args.quick, json_file=args.json
        )
    if args.propagation:  # --- cluster propagation benchmark hook ---
        from .propagation import main as propagation_main

        return propagation_main([], quick=args.quick, json_file=args.json, redis_url=args.redis_url)
    if args.scale:  # --- fleet-scale benchmark hook ---
        from .scale import main as scale_main

        counts = tuple(int(c) for c in args.counts.split(",")) if args.counts else None
        return scale_main(
            [], quick=args.quick, json_file=args.json, redis_url=args.redis_url, runs=args.runs, counts=counts
        )
    if args.memory:
        from .memory import main as memory_main

        return memory_main([])
    if args.metrics:  # --- Prometheus metrics benchmark hook ---
        from .metrics import main as metrics_main

        return metrics_main([], quick=args.quick, json_file=args.json)
    if args.http:  # --- outbound HTTP clients benchmark hook ---
        from .http import main as http_main

        return http_main([], quick=args.quick, json_file=args.json)
    if args.inbound:  # --- inbound-side benchmark hook ---
        from .inbound import main as inbound_main

        return inbound_main([], quick=args.quick, json_file=args.json, redis_url=args.redis_url)
    # The OPEN scenario trips breakers on purpose: keep their state-change lines off stderr
    # (and give the logger its level back afterwards: tests call main() in-process).
    quiet = logging.getLogger("baldur")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    use_cpu_time(args.cpu_time)
    try:
        return _run(args)
    finally:
        quiet.setLevel(level)
        use_cpu_time(False)


def _loadavg() -> tuple[float, float, float]:
    import os

    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover
        return (float("nan"),) * 3


def _run(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else DEFAULT
    if args.rounds is not None:
        if args.rounds < 1:
            print("--rounds must be at least 1", file=sys.stderr)
            return 2
        settings = dataclasses.replace(settings, rounds=args.rounds)

    if args.profile:
        print("cProfile of circuit_breaker, CLOSED success, steady state (own time; cProfile inflates every call):")
        print(profile_closed(calls=50_000 if args.quick else 300_000))
        print("cProfile of the same, the wrapped function returning a response object (status_code 200):")
        print(profile_closed(calls=50_000 if args.quick else 300_000, response=True))
        print("Step ladder: the hot path rebuilt line by line, each step measured against a bare call")
        print(format_ladder(measure_ladder(settings, rounds=settings.rounds if args.quick else 2 * settings.rounds)))
        return 0

    if args.runs < 1:
        print("--runs must be at least 1", file=sys.stderr)
        return 2
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in SCENARIOS]
    if unknown:
        print(f"--only: unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    env = environment()
    started = time.monotonic()
    runs = []
    for index in range(args.runs):
        # each run is a full interleaved run of its own, with its own shuffle of the contenders
        chosen = dataclasses.replace(settings, seed=settings.seed + index)
        runs.append(
            run_all(
                chosen,
                only or None,
                progress=lambda key, i=index: print(
                    f"run {i + 1}/{args.runs}: measuring {key} ...", file=sys.stderr, flush=True
                ),
            )
        )
    env["loadavg_end"] = _loadavg()
    print(format_report(runs, env, settings, time.monotonic() - started))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(to_json(runs, env, settings), handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
