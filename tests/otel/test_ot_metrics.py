"""OT-1, OT-2: contrib.otel's install and its observable instruments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import baldur_django as baldur
from baldur_django.contrib import otel, prometheus
from baldur_django.core import decorators, emergency
from baldur_django.core.events import bus

from .conftest import dotted

ROOT = Path(__file__).resolve().parents[2]


def trip(service: str):
    """A breaker that opens on its first failure; returns the protected function."""

    @baldur.circuit_breaker(service, failure_threshold=1, failure_rate_threshold=0, recovery_timeout=60)
    def call(fail: bool = False) -> int:
        if fail:
            raise ValueError("down")
        return 1

    return call


def test_ot1_install_twice_changes_nothing(telemetry):
    """OT-1: a second install() on the same providers creates no second instrument, subscribes
    no second listener, and the figures are the same."""
    call = trip("ot1-twice")
    call()
    first = telemetry.points()
    otel.install(telemetry.meters, telemetry.tracers, spans=False)
    otel.install(telemetry.meters, telemetry.tracers, spans=False)
    assert telemetry.points() == first
    assert list(bus.listeners).count(otel.span_events) == 1
    assert [attrs for attrs, _ in first[otel.CALLS_COUNTER]] == [dotted(service="ot1-twice", outcome="success")]


def test_ot1_global_providers_install_once_and_run_without_an_sdk(clock):
    """OT-1: install() with the API's global (no-op) providers is idempotent and a protected
    call, a refusal and a retry run as before."""
    otel.install()
    otel.install()
    try:
        assert list(bus.listeners).count(otel.span_events) == 1
        call = trip("ot1-nosdk")
        assert call() == 1
        with pytest.raises(ValueError):
            call(fail=True)
        with pytest.raises(baldur.CircuitOpenError):
            call()
        assert otel.span_events.wants_rejections() is False  # no SDK: no span ever records
    finally:
        otel.uninstall()


API_ONLY = r"""
import sys
class HideSdk:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, HideSdk())
import baldur_django as baldur
from baldur_django.contrib import otel
otel.install(spans=True)
otel.install(spans=True)

@baldur.protected("api-only", failure_threshold=1, failure_rate_threshold=0, retry=baldur.RetryPolicy(max_attempts=2, backoff_initial=0.0, backoff_max=0.0, jitter=0.0))
def call(fail=False):
    if fail:
        raise ValueError("down")
    return 1

assert call() == 1
try:
    call(fail=True)
except ValueError:
    pass
try:
    call()
except baldur.CircuitOpenError:
    pass
assert "opentelemetry.sdk" not in sys.modules
print("ok")
"""

NO_OTEL = r"""
import sys
class HideOtel:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, HideOtel())
try:
    from baldur_django.contrib import otel
except ImportError as exc:
    print(exc)
"""


def _run(script: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ot1_works_with_the_api_alone():
    """OT-1: with opentelemetry-api and no SDK importable, install() (spans on) and the
    protected calls, refusals and retries work; nothing imports the SDK."""
    assert _run(API_ONLY).strip() == "ok"


def test_ot1_without_opentelemetry_the_import_names_the_extra():
    """OT-1: without opentelemetry the module refuses to import with the extra to install."""
    assert "baldur-django[otel]" in _run(NO_OTEL)


def test_ot2_instruments_carry_the_prometheus_figures(telemetry, clock):
    """OT-2: calls by outcome, rejections by reason, transitions, the state gauge (0/1 per
    state) and the emergency level equal what the Prometheus collector exports."""
    call = trip("ot2-same")
    for _ in range(3):
        call()
    with pytest.raises(ValueError):
        call(fail=True)
    for _ in range(2):
        with pytest.raises(baldur.CircuitOpenError):
            call()
    registry = CollectorRegistry()
    prometheus.install(registry)
    scraped = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    points = telemetry.points()

    def prom(name: str, **labels: str) -> float | None:
        return scraped.get((name, frozenset({"service": "ot2-same", **labels}.items())))

    calls = {attrs["baldur.outcome"]: value for attrs, value in points[otel.CALLS_COUNTER]}
    assert calls == {"success": 3, "failure": 1}
    assert calls == {o: prom("baldur_circuit_breaker_calls_total", outcome=o) for o in calls}
    rejections = {attrs["baldur.reason"]: value for attrs, value in points[otel.REJECTIONS]}
    assert rejections == {"open": 2} == {"open": prom("baldur_circuit_breaker_blocked_requests_total", reason="open")}
    moved = {
        (a["baldur.from_state"], a["baldur.to_state"], a["baldur.trigger"]): v for a, v in points[otel.TRANSITIONS]
    }
    assert len(moved) == 1
    (before, after, trigger), count = next(iter(moved.items()))
    labels = {"from_state": before, "to_state": after, "trigger": trigger}
    assert (
        (before, after, count)
        == ("closed", "open", 1)
        == (before, after, prom("baldur_circuit_breaker_transitions_total", **labels))
    )
    states = {attrs["baldur.state"]: value for attrs, value in points[otel.STATE]}
    assert states == {"closed": 0, "open": 1, "half_open": 0}
    assert prom("baldur_circuit_breaker_state") == 1  # 1 is OPEN in the Prometheus gauge
    assert points[otel.EMERGENCY_LEVEL] == [({}, 0)]


def test_ot2_read_at_collection_and_emergency_level(telemetry, clock):
    """OT-2: every collection reads the breakers afresh (no value cached between two), the
    emergency level included; counters never go down."""
    call = trip("ot2-fresh")
    call()
    assert telemetry.value(otel.CALLS_COUNTER, **dotted(service="ot2-fresh", outcome="success")) == 1
    call()
    call()
    assert telemetry.value(otel.CALLS_COUNTER, **dotted(service="ot2-fresh", outcome="success")) == 3
    emergency.set_level(2, reason="drill", minutes=5)
    try:
        assert telemetry.points()[otel.EMERGENCY_LEVEL] == [({}, 2)]
    finally:
        emergency.set_level(0, reason="drill over")


def test_ot2_nothing_on_the_closed_success_path(telemetry):
    """OT-2: with otel installed (spans off) a protected function's wrapper is the very
    function it is without otel, and no listener asks the OPEN path for rejection events
    while no span records."""

    def work() -> int:
        return 1

    with_otel = baldur.protected("ot2-path")(work)
    otel.uninstall()
    without = baldur.protected("ot2-path-bare")(work)
    assert with_otel.__code__ is without.__code__
    assert decorators.wrap_calls is None
    otel.install(telemetry.meters, telemetry.tracers, spans=False)
    probe = otel.span_events.wants_rejections
    assert probe() is False


def test_ot2_uninstalled_instruments_observe_nothing(telemetry):
    """OT-1: after uninstall() the instruments report nothing and the listener is gone."""
    trip("ot2-off")()
    otel.uninstall()
    assert telemetry.points() == {} or all(not rows for rows in telemetry.points().values())
    assert otel.span_events not in bus.listeners
