"""How often do the concurrency scenarios catch a breaker whose lock does nothing?

Not collected by pytest (the name does not start with ``test_``). Run it by hand:

    .venv/bin/python tests/core/race_demo.py [runs] [scenario-name-filter ...]

For every scenario of ``tests/core/test_concurrency.py`` it builds fresh breakers, runs
the scenario *runs* times (default 20) with the real lock and with ``NoLock`` (a lock
whose acquire/release do nothing), and prints how many runs reported a violation. With
the real lock every count must be 0; with ``NoLock`` a non-zero count shows the scenario
can see the race. "plain" uses the breaker's own window; "yielding" uses a window whose
counters are Python properties, so a thread switch can fall between the read and the
write of ``calls += 1`` (on CPython 3.11 with the GIL, the plain window's increments
contain no switch point, so a missing lock cannot lose them there).

Nothing here touches the package's files: the lock is swapped on each breaker object.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.core import test_concurrency as scenarios  # noqa: E402

COUNTS_ONLY = dict(failure_threshold=scenarios.NEVER, failure_rate_threshold=0, minimum_calls=1)
HALF_OPEN = dict(
    failure_threshold=1,
    failure_rate_threshold=0,
    half_open_max_calls=3,
    recovery_timeout=5,
    sliding_window_size=10,
    minimum_calls=1,
)


def _prefilled(rig: scenarios.Rig) -> scenarios.Rig:
    for _ in range(rig.breaker.config.sliding_window_size):
        rig.breaker.record_success(rig.breaker.acquire())
    return rig


CASES = [
    # name, window kind, breaker options, scenario, preparation
    (
        "filling window",
        "plain",
        dict(COUNTS_ONLY, sliding_window_size=100_000),
        scenarios.scenario_filling_window,
        None,
    ),
    (
        "filling window",
        "yielding",
        dict(COUNTS_ONLY, sliding_window_size=100_000),
        scenarios.scenario_filling_window,
        None,
    ),
    (
        "consecutive count",
        "plain",
        dict(COUNTS_ONLY, sliding_window_size=100_000),
        scenarios.scenario_consecutive_count,
        None,
    ),
    (
        "consecutive count",
        "yielding",
        dict(COUNTS_ONLY, sliding_window_size=100_000),
        scenarios.scenario_consecutive_count,
        None,
    ),
    ("full window", "plain", dict(COUNTS_ONLY, sliding_window_size=16), scenarios.scenario_full_window, _prefilled),
    ("full window", "yielding", dict(COUNTS_ONLY, sliding_window_size=16), scenarios.scenario_full_window, _prefilled),
    (
        "trip once (300 rounds)",
        "plain",
        dict(failure_threshold=8, failure_rate_threshold=0, sliding_window_size=100, minimum_calls=1),
        scenarios.scenario_trip_once,
        None,
    ),
    ("half-open race", "plain", HALF_OPEN, scenarios.scenario_half_open_race, None),
    ("half-open give-back", "plain", HALF_OPEN, scenarios.scenario_half_open_giveback, None),
]


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv and argv[0].isdigit() else 20
    wanted = [a for a in argv if not a.isdigit()]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    bad_with_lock = 0
    try:
        for name, window, options, scenario, prepare in CASES:
            if wanted and not any(w in name for w in wanted):
                continue
            for unprotected in (False, True):
                failed, example, started = 0, "", time.perf_counter()
                for _ in range(runs):
                    rig = scenarios.make_breaker(unprotected=unprotected, window=window, **options)
                    if prepare:
                        rig = prepare(rig)
                    try:
                        problems = scenario(rig)
                    except Exception as exc:  # an unprotected breaker may corrupt itself
                        problems = [f"crashed: {exc!r}"]
                    if problems:
                        failed += 1
                        example = example or problems[0]
                per_run = (time.perf_counter() - started) / runs * 1000
                lock = "NoLock" if unprotected else "lock"
                print(
                    f"{name:24} {window:9} {lock:6}: {failed:3}/{runs} runs misbehaved ({per_run:4.0f} ms/run) {example}",
                    flush=True,
                )
                if not unprotected:
                    bad_with_lock += failed
    finally:
        sys.setswitchinterval(previous)
    return 1 if bad_with_lock else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
