"""Smoke test of the benchmark package (``python -m benchmarks``): tiny runs, structure only.

No timing is asserted: the figures depend on the machine. What is checked is that every
scenario runs every contender through the state it claims to measure and reports numbers.
"""

from __future__ import annotations

import json
import logging
import math

import pytest

pytest.importorskip("pybreaker")
pytest.importorskip("circuitbreaker")

from benchmarks import CONTENDERS, GOALS, BenchSettings, evaluate, format_report, run_all, to_json
from benchmarks.__main__ import main
from benchmarks.profiling import format_ladder, measure_ladder, profile_closed
from benchmarks.scenarios import (
    APROTECT_KNOB_ROW,
    APROTECT_ROW,
    PROTECT_KNOB_ROW,
    PROTECT_ROW,
    RESPONSE_ROW,
    RETRY_ROW,
    environment,
)

TINY = BenchSettings(
    rounds=2, calls=20, reject_calls=10, async_calls=10, thread_rounds=1, threads=2, per_thread=20, warmup=10
)


def _finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def test_bench_every_scenario_reports_every_contender():
    """FAC-1, CB-4 (exercised): closed/open/async/threads each give numbers for every
    contender, or an n/a with a reason (pybreaker has no asyncio support)."""
    results = run_all(TINY)
    assert list(results) == ["closed", "open", "async", "threads"]
    for key, result in results.items():
        assert _finite(result.bare) and result.bare > 0, key
        for name in CONTENDERS:
            if name in result.missing:
                assert result.value(name) is None
                assert result.missing[name]
                continue
            sample = result.samples[name]
            rounds = TINY.thread_rounds if result.throughput else TINY.rounds
            assert len(sample.per_call) == rounds == len(sample.over_bare), (key, name)
            assert all(_finite(v) for v in sample.per_call + sample.over_bare), (key, name)
            assert _finite(result.value(name)), (key, name)
    assert set(results["async"].missing) == {"pybreaker"}
    assert all(not results[k].missing for k in ("closed", "open", "threads"))
    assert results["threads"].throughput and not results["closed"].throughput
    assert _finite(results["closed"].value(RESPONSE_ROW))
    # the other call styles: each row measured in every round of its scenario
    rows = {
        "closed": (RESPONSE_ROW, RETRY_ROW, PROTECT_ROW, PROTECT_KNOB_ROW),
        "async": (RETRY_ROW, APROTECT_ROW, APROTECT_KNOB_ROW),
        "threads": (PROTECT_ROW, PROTECT_KNOB_ROW),
    }
    for key, names in rows.items():
        result = results[key]
        assert set(result.extra) == set(names), key
        for name in names:
            rounds = TINY.thread_rounds if result.throughput else TINY.rounds
            assert len(result.extra[name].per_call) == rounds, (key, name)
            assert _finite(result.value(name)), (key, name)

    verdicts = evaluate(results)
    assert [v.goal for v in verdicts] == list(GOALS)
    assert all(v.status in ("PASS", "MISS", "N/A") for v in verdicts)

    text = format_report(results, environment(), TINY, 0.0)
    for goal in GOALS:
        assert goal.text in text
    data = json.loads(json.dumps(to_json(results, environment(), TINY)))
    assert set(data["scenarios"]) == set(results)
    assert len(data["goals"]) == len(GOALS)


def test_bench_cli_runs_one_scenario_and_writes_json(tmp_path, capsys):
    """FAC-1 (exercised): ``--quick --only closed --rounds 1 --json FILE`` prints the table and goals."""
    out = tmp_path / "bench.json"
    level = logging.getLogger("baldur").level
    assert main(["--quick", "--only", "closed", "--rounds", "1", "--json", str(out)]) == 0
    assert logging.getLogger("baldur").level == level  # quietened only for the run
    printed = capsys.readouterr().out
    assert "CLOSED, successful call" in printed
    assert "circuit_breaker CLOSED-success overhead" in printed
    data = json.loads(out.read_text())
    assert set(data["scenarios"]["closed"]["contenders"]) >= set(CONTENDERS)
    assert data["environment"]["clock"] == "wall"
    assert main(["--only", "nosuch"]) == 2


def test_bench_cli_cpu_time_for_one_run_only(tmp_path, capsys):
    """FAC-1 (exercised): ``--cpu-time`` times the loops with the thread's CPU time, for
    that run only (the next in-process run is back on wall time)."""
    from benchmarks.harness import clock_name

    out = tmp_path / "bench.json"
    assert main(["--quick", "--only", "open", "--rounds", "1", "--cpu-time", "--json", str(out)]) == 0
    assert "thread CPU time" in capsys.readouterr().out
    assert json.loads(out.read_text())["environment"]["clock"] == "thread CPU"
    assert clock_name() == "wall"


def test_bench_profile_ladder_rebuilds_the_hot_path():
    """FAC-1 (exercised): the profile's step ladder measures every step and cProfile sees the wrapper."""
    rows = measure_ladder(TINY, rounds=1)
    assert len(rows) == 7
    assert rows[-1][0] == "the real circuit_breaker wrapper"
    assert all(_finite(overhead) and _finite(step) for _, overhead, step in rows)
    assert "real circuit_breaker wrapper" in format_ladder(rows)
    assert "wrapper" in profile_closed(calls=200, warmup=10)
