"""RS-7 (metrics): the outbound stages' refusals are in the rejections counter
(``baldur_circuit_breaker_blocked_requests_total`` reasons ``bulkhead_full``, ``throttled``,
``deadline``, ``retry_after``), the retries a retry budget refused in
``baldur_retry_budget_exhausted_total{service}`` and the bulkhead's slots in use in
``baldur_bulkhead_in_flight{service}``, all read at scrape time."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import baldur_django as baldur
from baldur_django.contrib import prometheus
from baldur_django.core.breaker import core_of
from baldur_django.core.registry import registry
from baldur_django.core.stages.refusals import count_deadline
from baldur_django.core.stages.service import service_stages

from ..stages.refusing import refuse_each, staged
from .test_em7_exported_series import BLOCKED, STATE, exported

pytestmark = pytest.mark.usefixtures("clock")

ROOT = Path(__file__).resolve().parents[2]
EXHAUSTED = "baldur_retry_budget_exhausted_total"
IN_FLIGHT = "baldur_bulkhead_in_flight"


def test_rs7_each_stage_refusal_reason_is_in_the_rejections_counter(scraper):
    """RS-7: one refusal of each reason shows as its own ``reason`` series; a retry the
    budget refused grows the exhausted counter; the slot still taken is in flight."""
    breaker, held = staged("rs7-metrics")
    ticket = refuse_each(breaker, held)
    assert exported(scraper.scrape(), "rs7-metrics") == {
        (STATE,): 0,
        (BLOCKED, "bulkhead_full"): 1,
        (BLOCKED, "throttled"): 1,
        (BLOCKED, "deadline"): 1,
        (BLOCKED, "retry_after"): 1,
        (EXHAUSTED,): 1,
        (IN_FLIGHT,): 1,
    }
    held.bulkhead.leave(ticket)
    assert scraper.value(IN_FLIGHT, service="rs7-metrics") == 0


def test_rs7_stage_counts_grow_and_sit_beside_the_breakers_own(scraper, no_audit):
    """RS-7: the stages' reasons add to the breaker's own (``open``) in the same counter,
    and every count only grows between scrapes."""
    breaker, held = staged("rs7-both", failure_threshold=1)
    refuse_each(breaker, held)
    breaker.record_failure(breaker.acquire())
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()
    count_deadline(core_of(breaker))
    held.budget.try_retry()
    found = exported(scraper.scrape(), "rs7-both")
    assert found[(BLOCKED, "open")] == 1
    assert found[(BLOCKED, "deadline")] == 2
    assert found[(EXHAUSTED,)] == 2


def test_rs7_a_breaker_without_stages_exports_no_stage_series(scraper):
    """RS-7: without a stage knob nothing new is exported (no in-flight gauge at 0, no
    exhausted counter at 0)."""
    breaker = registry.get("rs7-plain")
    breaker.record_success(breaker.acquire())
    assert service_stages(core_of(breaker)) is None
    found = exported(scraper.scrape(), "rs7-plain")
    assert set(found) == {(STATE,), ("baldur_circuit_breaker_calls_total", "success")}


def test_rs7_a_deadline_refusal_counts_for_a_breaker_without_stages(scraper):
    """RS-7: a deadline set around a call reaches breakers without stages: their deadline
    refusals are counted too (and nothing else appears)."""
    breaker = registry.get("rs7-deadline-only")
    count_deadline(core_of(breaker))
    assert exported(scraper.scrape(), "rs7-deadline-only") == {(STATE,): 0, (BLOCKED, "deadline"): 1}


def test_rs7_counts_survive_new_stages_after_a_reconfiguration(scraper):
    """RS-7: a breaker whose configuration changes gets new stage objects counting from 0;
    its series keep what the old ones counted and grow from there."""
    breaker, held = staged("rs7-rebuilt")
    refuse_each(breaker, held)
    assert scraper.value(BLOCKED, service="rs7-rebuilt", reason="bulkhead_full") == 1
    core = core_of(breaker)
    core.config = dataclasses.replace(core.config, max_concurrent_calls=1)
    fresh = service_stages(core)
    assert fresh is not None and fresh is not held
    fresh.bulkhead.enter()
    with pytest.raises(baldur.BulkheadFullError):
        fresh.bulkhead.enter()
    assert scraper.value(BLOCKED, service="rs7-rebuilt", reason="bulkhead_full") == 2
    assert scraper.value(IN_FLIGHT, service="rs7-rebuilt") == 1


def test_rs7_series_names_are_the_exported_ones():
    """RS-7, section 0: the names a scrape shows."""
    assert f"{prometheus.RETRY_BUDGET_EXHAUSTED}_total" == EXHAUSTED
    assert prometheus.BULKHEAD_IN_FLIGHT == IN_FLIGHT


FORKER = r"""
import json, os
from baldur_django.contrib.prometheus_readings import COUNT_FAMILY, COUNT_LABELS, TALLY
from baldur_django.core.breaker import core_of
from baldur_django.core.registry import registry
from baldur_django.core.stages.refusals import count_deadline
from baldur_django.core.stages.service import service_stages

breaker = registry.get("rs7-fork", {"max_concurrent_calls": 1, "max_wait": 0.0})
held = service_stages(core_of(breaker))
held.bulkhead.enter()

def refuse():
    try:
        held.bulkhead.enter()
    except Exception:
        pass
    count_deadline(core_of(breaker))

def blocked():
    entry = TALLY.read().series["rs7-fork"]
    return {l[0]: n for n, l, f in zip(entry.totals, COUNT_LABELS, COUNT_FAMILY) if f.endswith("requests") and n}

refuse(); refuse()
before = blocked()
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    refuse()
    os.write(write_end, json.dumps(blocked()).encode())
    os._exit(0)
refuse()
os.waitpid(pid, 0)
print(json.dumps({"before": before, "parent": blocked(), "child": json.loads(os.read(read_end, 1 << 16))}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_rs7_a_forked_child_counts_its_own_stage_refusals():
    """RS-7, OT-4: a child forked after its parent's stages refused calls reports only its
    own refusals; the parent keeps counting its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", FORKER], capture_output=True, text=True, cwd=str(ROOT), env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["before"] == {"bulkhead_full": 2, "deadline": 2}
    assert found["parent"] == {"bulkhead_full": 3, "deadline": 3}
    assert found["child"] == {"bulkhead_full": 1, "deadline": 1}


def test_rs7_refusals_through_a_decorated_function_reach_the_counter(scraper, clock):
    """RS-7 end to end: a protected function's bulkhead and Retry-After gate refusals (the
    wired stages) are in the rejections counter; the slot is back after the call."""
    seen: list[int] = []

    @baldur.protected("rs7-e2e", max_concurrent_calls=1, max_wait=0.0, honor_retry_after=True, fallback=lambda: -1)
    def call(inner: bool = False) -> int:
        if inner:
            seen.append(scraper.value(IN_FLIGHT, service="rs7-e2e"))
            return call()  # the one slot is taken: refused, answered by the fallback
        return 1

    assert call(inner=True) == -1 and seen == [1]
    assert scraper.value(IN_FLIGHT, service="rs7-e2e") == 0
    assert scraper.value(BLOCKED, service="rs7-e2e", reason="bulkhead_full") == 1
    stages = service_stages(core_of(baldur.get_breaker("rs7-e2e")))
    stages.gate.close_for(10.0)
    assert call() == -1
    assert scraper.value(BLOCKED, service="rs7-e2e", reason="retry_after") == 1


def test_rs7_a_call_refused_by_the_pipeline_for_its_deadline_is_counted(scraper, clock):
    """RS-7: a call whose deadline has passed before it starts is refused by the deadline
    stage, and counted as ``deadline``."""

    @baldur.protected("rs7-late", fallback=lambda: -1)
    def call() -> int:
        return 1

    with baldur.deadline(1.0, clock=clock):
        clock.advance(2.0)
        assert call() == -1
    assert scraper.value(BLOCKED, service="rs7-late", reason="deadline") == 1
