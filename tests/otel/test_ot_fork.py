"""OT-4: under a pre-forking server each process reports its own breakers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORKER = r"""
import json, os, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import baldur_django as baldur
from baldur_django.contrib import otel

otel.install()  # BALDUR_OTEL_ENABLED in the master (gunicorn --preload): the API's global provider

def post_fork():
    # the gunicorn recipe's post_fork hook: each worker sets an SDK of its own as the global provider
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader

def calls(reader):
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == otel.CALLS_COUNTER:
                    for point in metric.data.data_points:
                        a = point.attributes
                        found[a["baldur.service"] + "/" + a["baldur.outcome"]] = point.value
    return found

@baldur.circuit_breaker("shared")
def shared():
    return 1

@baldur.circuit_breaker("child-only")
def child_only():
    return 1

for _ in range(3):
    shared()  # counted by the master before the fork (gunicorn --preload)
from baldur_django.contrib.prometheus_readings import TALLY
TALLY.read()  # a reading in the master before the fork (a Prometheus scrape, say)
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    reader = post_fork()
    shared()
    child_only()
    child_only()
    os.write(write_end, json.dumps({"pid": os.getpid(), "calls": calls(reader)}).encode())
    os._exit(0)
reader = post_fork()
shared()
os.waitpid(pid, 0)
child = json.loads(os.read(read_end, 1 << 16))
print(json.dumps({"parent": {"pid": os.getpid(), "calls": calls(reader)}, "child": child}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_ot4_a_forked_child_and_its_parent_report_their_own_breakers():
    """OT-4: the documented recipe: reporting installed in the master on the global
    provider, an SDK set in each process after the fork. A child forked after its parent
    counted (and read) calls reports only its own; the parent reports its own, none of the
    child's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", FORKER], capture_output=True, text=True, cwd=str(ROOT), env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["parent"]["pid"] != figures["child"]["pid"]
    assert figures["child"]["calls"] == {"shared/success": 1, "child-only/success": 2}
    assert figures["parent"]["calls"] == {"shared/success": 4}
