"""Smoke test of ``python -m benchmarks --metrics`` (EM-7): a tiny run of every mode, each in
its own process as the real run makes them; figures are reported, none is asserted.
Cost: about 3 s."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("pybreaker")
pytest.importorskip("circuitbreaker")

from benchmarks.metrics import MODES, MetricsSettings, format_results, run_modes

pytestmark = pytest.mark.multiprocess


def test_em7_metrics_bench_runs_every_mode():
    """EM-7: the metrics benchmark measures the hot path off, installed and in multiprocess
    mode, plus the scrape and flush figures where they apply."""
    tiny = MetricsSettings(rounds=2, calls=50, reject_calls=20, passes=2)
    results = run_modes(tiny)
    assert [row["mode"] for row in results] == list(MODES)
    for row in results:
        for key in ("closed_circuit_breaker", "closed_protected", "open_circuit_breaker"):
            assert math.isfinite(row[key]), (row["mode"], key)
    assert "scrape_ms" not in results[0] and "scrape_ms" in results[1] and "flush_ms" in results[2]
    assert "collect_ms" in results[3] and "scrape_ms" not in results[3]
    text = format_results(results, tiny)
    assert all(mode in text for mode in MODES)
