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
    CREATE_PROTECT_ROW,
    PROTECT_KNOB_ROW,
    PROTECT_KNOBS3_ROW,
    PROTECT_KNOBS5_ROW,
    PROTECT_ROW,
    RESPONSE_ROW,
    RETRY_ROW,
    environment,
)

TINY = BenchSettings(
    rounds=2,
    calls=20,
    reject_calls=10,
    async_calls=10,
    thread_rounds=1,
    threads=2,
    per_thread=20,
    warmup=10,
    create_rounds=2,
    create_calls=3,
    memory_breakers=5,
)


def _finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def test_bench_every_scenario_reports_every_contender():
    """FAC-1, CB-4 (exercised): closed/open/async/threads each give numbers for every
    contender, or an n/a with a reason (pybreaker has no asyncio support)."""
    results = run_all(TINY)
    assert list(results) == ["closed", "open", "async", "threads", "create", "memory", "stages"]
    for key, result in results.items():
        if key == "stages":  # no contender: rows of baldur's own (test below)
            continue
        if key == "memory":
            assert result.unit == "B" and result.bare == 0.0
            assert set(result.missing) == {"protected"}
            assert all(result.value(name) > 0 for name in CONTENDERS if name != "protected")
            continue
        assert _finite(result.bare) and result.bare > 0, key
        for name in CONTENDERS:
            if name in result.missing:
                assert result.value(name) is None
                assert result.missing[name]
                continue
            sample = result.samples[name]
            rounds = TINY.thread_rounds if result.throughput else TINY.rounds
            if key == "create":
                rounds = TINY.create_rounds
            assert len(sample.per_call) == rounds == len(sample.over_bare), (key, name)
            assert all(_finite(v) for v in sample.per_call + sample.over_bare), (key, name)
            assert _finite(result.value(name)), (key, name)
    assert set(results["async"].missing) == {"pybreaker"}
    assert set(results["create"].missing) == {"protected"}
    assert all(not results[k].missing for k in ("closed", "open", "threads"))
    assert results["threads"].throughput and not results["closed"].throughput
    assert _finite(results["closed"].value(RESPONSE_ROW))
    # the other call styles: each row measured in every round of its scenario
    rows = {
        "closed": (RESPONSE_ROW, RETRY_ROW, PROTECT_ROW, PROTECT_KNOB_ROW, PROTECT_KNOBS3_ROW, PROTECT_KNOBS5_ROW),
        "create": (CREATE_PROTECT_ROW,),
        "async": (RETRY_ROW, APROTECT_ROW, APROTECT_KNOB_ROW),
        "threads": (PROTECT_ROW, PROTECT_KNOB_ROW),
    }
    for key, names in rows.items():
        result = results[key]
        assert set(result.extra) == set(names), key
        for name in names:
            rounds = TINY.thread_rounds if result.throughput else TINY.rounds
            if key == "create":
                rounds = TINY.create_rounds
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
    assert main(["--quick", "--only", "closed", "--rounds", "1", "--runs", "1", "--json", str(out)]) == 0
    assert logging.getLogger("baldur").level == level  # quietened only for the run
    printed = capsys.readouterr().out
    assert "CLOSED, successful call" in printed
    assert "circuit_breaker CLOSED-success overhead" in printed
    data = json.loads(out.read_text())
    assert set(data["scenarios"]["closed"]["contenders"]) >= set(CONTENDERS)
    assert data["environment"]["clock"] == "wall"
    assert main(["--only", "nosuch"]) == 2


def test_goals_decided_by_the_median_of_the_runs():
    """FAC-1 (exercised): with several runs a goal's ratio is the median of the runs'
    ratios, every run's ratio is kept and printed, and an absolute goal shows bytes."""
    from benchmarks import evaluate_runs
    from benchmarks.harness import Sample
    from benchmarks.scenarios import ScenarioResult

    def run(ours: float, theirs: float, memory: float) -> dict:
        closed = ScenarioResult(
            "closed",
            "CLOSED",
            False,
            40.0,
            {"circuit_breaker": Sample([ours], [ours]), "circuitbreaker": Sample([theirs], [theirs])},
        )
        mem = ScenarioResult("memory", "memory", False, 0.0, {"circuit_breaker": Sample([memory], [memory])}, unit="B")
        return {"closed": closed, "memory": mem}

    runs = [run(30.0, 100.0, 3000.0), run(50.0, 100.0, 1000.0), run(45.0, 100.0, 1500.0)]
    verdicts = {v.goal.text: v for v in evaluate_runs(runs)}
    closed = verdicts["circuit_breaker CLOSED-success overhead <= 0.40 x circuitbreaker's"]
    assert closed.ratios == (0.3, 0.5, 0.45)
    assert closed.ratio == 0.45 and closed.status == "MISS"  # the median, not the best run
    memory = verdicts["memory per breaker, default config (window of 100) <= 2048 bytes"]
    assert memory.ratio == 1500.0 and memory.status == "PASS"
    text = format_report(runs, environment(), TINY, 0.0)
    assert "[0.30, 0.50, 0.45]" in text
    assert "value 1500 B (limit 2048 B) [3000 B, 1000 B, 1500 B]" in text
    assert "Run 3 of 3" in text
    data = json.loads(json.dumps(to_json(runs, environment(), TINY)))
    assert len(data["runs"]) == 3
    assert [g["ratios"] for g in data["goals"] if g["goal"] == closed.goal.text] == [[0.3, 0.5, 0.45]]


def test_bench_cli_three_runs_cpu_time(tmp_path, capsys):
    """FAC-1 (exercised): ``--runs 3 --cpu-time`` (the issue-21 way of deciding goals) makes
    three runs, prints each, and writes each run's ratio per goal to the JSON."""
    out = tmp_path / "bench.json"
    args = ["--quick", "--only", "create,memory", "--rounds", "1", "--runs", "3", "--cpu-time", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Run 3 of 3" in printed and "thread CPU time" in printed
    assert "creating a breaker and its first call <= 2 x pybreaker's" in printed
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 3
    assert {g["goal"] for g in data["goals"]} == {g.text for g in GOALS if g.scenario in ("create", "memory")}
    assert all(len(g["ratios"]) == 3 for g in data["goals"])
    assert main(["--runs", "0"]) == 2


def test_bench_cli_cpu_time_for_one_run_only(tmp_path, capsys):
    """FAC-1 (exercised): ``--cpu-time`` times the loops with the thread's CPU time, for
    that run only (the next in-process run is back on wall time)."""
    from benchmarks.harness import clock_name

    out = tmp_path / "bench.json"
    assert main(["--quick", "--only", "open", "--rounds", "1", "--runs", "1", "--cpu-time", "--json", str(out)]) == 0
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


@pytest.mark.django_db
def test_bench_scale_tiny_run_reports_every_figure_and_cleans_up(fresh_registry, capsys):
    """ST-5, EM-7, OP-6, OP-7 (exercised): ``--scale`` with 10 and 20 breakers measures every
    figure (memory, creation, sweep, sync, scrape, ``baldur_status --json``, the admin's first
    page), prints a goal and a linear-growth line for each, and leaves no key behind."""
    from tests.conftest import need_server
    from tests.stores.conftest import reachable

    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    from baldur_django.core.stores.redis import connect
    from benchmarks import scale

    settings = scale.ScaleSettings(counts=(10, 20), runs=1, redis_url="redis://127.0.0.1:6379/9")
    runs = scale.run_scale(settings)
    assert len(runs) == 1
    for count in (10, 20):
        figures = runs[0].figures[count]
        assert set(figures) == set(scale.FIGURES)
        assert all(isinstance(v, float) and v > 0 for v in figures.values()), figures
    text = scale.format_scale(runs, settings, 0.0)
    for goal in scale.SCALE_GOALS:
        assert goal.limit is None or goal.text in text
    assert text.count("grows at most linearly") == len(scale.FIGURES)
    data = json.loads(json.dumps(scale.to_json(runs, settings)))
    assert len(data["goals"]) == len([g for g in scale.SCALE_GOALS if g.limit is not None]) + len(scale.FIGURES)
    client = connect(settings.redis_url)
    try:
        assert len(runs[0].prefixes) == 2
        for prefix in runs[0].prefixes:
            assert not list(client.scan_iter(f"{prefix}:*"))
    finally:
        client.close()
    assert fresh_registry.store is None


def test_bench_scale_cli_refuses_an_unreachable_redis(capsys):
    """FAC-1 (exercised): ``--scale`` against a Redis that is not there exits 2 with a message."""
    assert main(["--scale", "--counts", "2", "--runs", "1", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    assert "cannot reach Redis" in capsys.readouterr().err


def test_bench_stages_rows_each_stage_and_its_goal():
    """RS-9 (exercised): the stages scenario measures the CLOSED success with each outbound
    stage on alone, and the two references, in every round; each stage row has its goal
    against its reference; the deadline row's knob leaves the process unarmed (no other
    row, nor a later scenario, pays for a deadline read)."""
    from baldur_django.core.stages.deadline import ARMED
    from benchmarks.stage_rows import STAGE_ROWS

    result = run_all(TINY, ["stages"])["stages"]
    assert not ARMED
    assert set(result.extra) == {*STAGE_ROWS, "protected, no stage", "protected(retry), no stage"}
    for row, sample in result.extra.items():
        assert len(sample.per_call) == TINY.rounds and all(_finite(v) for v in sample.per_call), row
    goals = {v.goal.subject: v for v in evaluate({"stages": result})}
    assert set(goals) == set(STAGE_ROWS)
    for row, (_, reference) in STAGE_ROWS.items():
        assert goals[row].goal.reference == reference and goals[row].status in ("PASS", "MISS")
