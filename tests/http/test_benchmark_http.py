"""Smoke test of ``./dev bench --http`` (benchmarks/http.py): a tiny run, structure only.

No timing is asserted (speed is proven by the benchmark itself, HC-6): every contender is
measured in every round and the report names every goal.
"""

from __future__ import annotations

import json
import math

from benchmarks.__main__ import main
from benchmarks.http import PAIRS, HttpSettings, bench_http, evaluate_http, format_http, to_json

TINY = HttpSettings(rounds=2, requests=5, refusal_rounds=2, refusals=3)


def test_hc6_bench_http_measures_every_contender(fresh_registry):
    """HC-6: the loopback pairs, the own-cost pairs and the refusal pair all report finite
    figures, one per round, and the verdicts name the four goals."""
    result = bench_http(TINY)
    for client, plain, wrapped in PAIRS:
        for samples in (result.loopback[client], result.loopback_cpu[client], result.own[client]):
            assert set(samples) == {plain, wrapped}
            assert all(len(sample.per_call) == TINY.rounds for sample in samples.values())
        assert math.isfinite(result.overhead_percent(client))
    assert all(len(s.per_call) == TINY.refusal_rounds for s in result.refusal.values())
    verdicts = evaluate_http(result)
    assert len(verdicts) == 4 and all(v.status in ("PASS", "MISS") for v in verdicts)
    text = format_http(result)
    assert "BreakerAdapter" in text and "AsyncBreakerTransport" in text and "refused connection" in text
    json.dumps(to_json(result))
    assert not baldur_forced_leftover(fresh_registry)


def baldur_forced_leftover(registry) -> bool:
    return any(b.forced for b in registry)


def test_hc6_dev_bench_http_flag_is_wired(monkeypatch, capsys):
    """HC-6: ``python -m benchmarks --http --quick`` runs this benchmark."""
    import benchmarks.http as http

    monkeypatch.setattr(http, "HTTP_QUICK", TINY)
    assert main(["--http", "--quick"]) == 0
    assert "Outbound HTTP clients" in capsys.readouterr().out
