"""EM-7: which series a scrape exports. A counter series appears with its first count and
is never dropped afterwards; a label combination that never occurred is not exported; the
state gauge is there for every breaker of the process. ``metric_values()`` (what the
collector reads) and ``metrics()`` report the same counts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import baldur_django as baldur
from baldur_django.contrib import prometheus
from baldur_django.core import registry as registry_module
from baldur_django.core.breaker import METRIC_COUNTS, core_of
from baldur_django.core.readings import metric_values
from baldur_django.core.registry import registry

from .conftest import parse

pytestmark = pytest.mark.usefixtures("clock")

ROOT = Path(__file__).resolve().parents[2]
CALLS = "baldur_circuit_breaker_calls_total"
BLOCKED = "baldur_circuit_breaker_blocked_requests_total"
TRANSITIONS = "baldur_circuit_breaker_transitions_total"
STATE = "baldur_circuit_breaker_state"


def exported(samples: dict, service: str) -> dict[tuple[str, ...], float]:
    """``{(sample name, other label values sorted by label name...): value}`` of *service*."""
    found = {}
    for (name, labels), value in samples.items():
        labels = dict(labels)
        if labels.pop("service", None) == service:
            found[(name, *(labels[k] for k in sorted(labels)))] = value
    return found


def test_em7_an_idle_breaker_exports_only_its_state(scraper):
    """EM-7: a breaker that never counted anything has its state gauge and nothing else:
    no calls, blocked or transitions series at 0."""
    registry.get("em7-idle")
    assert exported(scraper.scrape(), "em7-idle") == {(STATE,): 0}


def test_em7_only_the_outcomes_that_occurred_are_exported(scraper, no_audit):
    """EM-7: each calls/blocked/transitions series appears with its first count; the others
    of the same breaker stay absent."""
    service = "em7-some"
    breaker = registry.get(service, {"failure_threshold": 2, "recovery_timeout": 10})
    breaker.record_success(breaker.acquire())
    assert exported(scraper.scrape(), service) == {(STATE,): 0, (CALLS, "success"): 1}
    for _ in range(2):
        breaker.record_failure(breaker.acquire())
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()
    assert exported(scraper.scrape(), service) == {
        (STATE,): 1,
        (CALLS, "success"): 1,
        (CALLS, "failure"): 2,
        (BLOCKED, "open"): 1,
        (TRANSITIONS, "closed", "open", "consecutive_failures"): 1,
    }


def test_em7_an_exported_series_never_disappears(scraper, no_audit):
    """EM-7: once exported, a series stays: after ``reset()`` (its counts keep growing),
    after the breaker is forgotten (its last counts stay, its state gauge goes) and after a
    new breaker takes the name (its counts add to the old ones)."""
    service = "em7-stays"
    breaker = registry.get(service, {"failure_threshold": 1})
    breaker.record_failure(breaker.acquire())
    before = exported(scraper.scrape(), service)
    assert before == {(STATE,): 1, (CALLS, "failure"): 1, (TRANSITIONS, "closed", "open", "consecutive_failures"): 1}
    breaker.reset()
    assert exported(scraper.scrape(), service) == {**before, (STATE,): 0, (TRANSITIONS, "open", "closed", "reset"): 1}
    registry.forget(service)
    gone = exported(scraper.scrape(), service)
    assert gone == {(CALLS, "failure"): 1, **{k: v for k, v in before.items() if k[0] == TRANSITIONS}} | {
        (TRANSITIONS, "open", "closed", "reset"): 1
    }
    successor = registry.get(service)
    successor.record_success(successor.acquire())
    assert exported(scraper.scrape(), service) == {**gone, (STATE,): 0, (CALLS, "success"): 1}


def test_em7_metric_values_matches_metrics(no_audit):
    """EM-7: ``metric_values()`` gives the counts of ``metrics()`` in ``METRIC_COUNTS``
    order, and the transitions, in a forked child too (counted from the fork)."""
    breaker = registry.get("em7-values", {"failure_threshold": 1, "recovery_timeout": 10})
    for _ in range(3):
        breaker.record_success(breaker.acquire())
    breaker.record_ignored(breaker.acquire())
    breaker.record_failure(breaker.acquire())
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()

    def both() -> tuple[tuple, tuple]:
        state, counts, transitions = metric_values(core_of(breaker))
        old = breaker.metrics()
        expected = tuple(old[group][key] for group, key in METRIC_COUNTS)
        return (state, counts, dict(transitions)), (old["state"], expected, old["transitions"])

    mine, theirs = both()
    assert mine == theirs
    assert mine[1] == (3, 1, 1, 0, 1, 0, 0)
    registry_module._after_fork_in_child()  # the core's at-fork hook, as os.fork would call it
    mine, theirs = both()
    assert mine == theirs
    assert mine[1] == (0,) * 7
    breaker.reset()
    breaker.record_success(breaker.acquire())
    mine, theirs = both()
    assert mine == theirs
    assert mine[1] == (1, 0, 0, 0, 0, 0, 0)
    assert mine[2] == {("open", "closed", "reset"): 1, ("closed", "open", "consecutive_failures"): 0}


@pytest.mark.multiprocess
def test_em7_multiprocess_files_hold_only_what_occurred(tmp_path):
    """EM-7: in multiprocess mode the flusher writes a series with its first count: two
    processes' counts are summed, an idle breaker has only its state gauge, and a series
    no process counted is absent."""
    script = textwrap.dedent(
        """
        import sys
        from baldur_django.contrib import prometheus
        prometheus.FLUSH_SECONDS = 3600  # only the explicit passes below and the one at exit
        prometheus.install()
        from baldur_django.core.registry import registry
        registry.get("idle")
        busy = registry.get("busy", {"failure_threshold": 100})
        for _ in range(int(sys.argv[1])):
            busy.record_success(busy.acquire())
        prometheus.flush()
        busy.record_failure(busy.acquire())
        """
    )
    env = {"PYTHONPATH": str(ROOT), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for successes in ("2", "3"):  # two processes, one after the other: two files
        done = subprocess.run(
            [sys.executable, "-c", script, successes], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    target = CollectorRegistry()
    MultiProcessCollector(target, path=str(tmp_path))
    samples = parse(generate_latest(target).decode())
    assert {k: v for k, v in exported(samples, "busy").items() if k[0] != STATE} == {
        (CALLS, "success"): 5,
        (CALLS, "failure"): 2,
    }
    assert {k[0] for k in exported(samples, "idle")} == {STATE}  # one per process (liveall), nothing else


def test_em7_the_flusher_pauses_longer_after_a_long_pass(monkeypatch):
    """EM-7: the flusher thread sleeps FLUSH_SECONDS after a short pass, and after a long
    one (thousands of breakers) long enough that passes take FLUSH_SHARE of its time, but
    never so long that a count misses the 1 s deadline (pause + next pass)."""
    monkeypatch.setattr(prometheus, "FLUSH_SECONDS", 0.5)
    monkeypatch.setattr(prometheus, "FLUSH_SHARE", 0.1)
    monkeypatch.setattr(prometheus, "FLUSH_DEADLINE", 1.0)
    assert prometheus.flush_pause(0.0) == 0.5
    assert prometheus.flush_pause(0.05) == 0.5
    assert prometheus.flush_pause(0.08) == pytest.approx(0.72)  # 10 % share, inside the deadline
    assert 0.08 / (0.08 + prometheus.flush_pause(0.08)) == pytest.approx(0.1)
    assert prometheus.flush_pause(0.2) == pytest.approx(0.8)  # the share would ask 1.8 s: capped
    assert prometheus.flush_pause(0.2) + 0.2 <= 1.0
    assert prometheus.flush_pause(1.5) == 0.0  # a pass longer than the deadline: no pause at all
