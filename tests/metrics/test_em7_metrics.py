"""EM-7: the Prometheus series, read from the breakers at scrape time (one process)."""

from __future__ import annotations

import importlib
import sys
import threading

import pytest
from django.test import RequestFactory
from prometheus_client import CollectorRegistry

import baldur_django as baldur
from baldur_django.contrib import prometheus
from baldur_django.core import emergency
from baldur_django.core import registry as registry_module
from baldur_django.core.breaker import core_of
from baldur_django.core.events import bus
from baldur_django.core.readings import metric_values
from baldur_django.core.registry import registry
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.testing import RecordingListener

from .conftest import Scraper, parse

CALLS = "baldur_circuit_breaker_calls_total"
BLOCKED = "baldur_circuit_breaker_blocked_requests_total"
TRANSITIONS = "baldur_circuit_breaker_transitions_total"
STATE = "baldur_circuit_breaker_state"
LEVEL = "baldur_emergency_level"
NOT_EXPORTED = {"open": None, "half_open_full": None, "frozen": None}  # blocked(): no series


class RateLimitError(Exception):
    """Recognised as a 429 by its name (RL-1)."""


def calls(scraper: Scraper, service: str) -> dict[str, float | None]:
    samples = scraper.scrape()
    return {
        outcome: samples.get((CALLS, frozenset({"service": service, "outcome": outcome}.items())))
        for outcome in ("success", "failure", "ignored", "rate_limited")
    }


def blocked(scraper: Scraper, service: str) -> dict[str, float | None]:
    samples = scraper.scrape()
    return {
        reason: samples.get((BLOCKED, frozenset({"service": service, "reason": reason}.items())))
        for reason in ("open", "half_open_full", "frozen")
    }


def transitions(scraper: Scraper, service: str) -> dict[tuple[str, str, str], float]:
    found = {}
    for (name, labels), value in scraper.scrape().items():
        labels = dict(labels)
        if name == TRANSITIONS and labels["service"] == service:
            found[(labels["from_state"], labels["to_state"], labels["trigger"])] = value
    return found


# ------------------------------------------------------------------------- calls
def test_em7_calls_by_outcome_count_final_outcomes_exactly(clock, scraper):
    """EM-7: calls_total counts each protected call once by its final outcome: healthy-lane
    and locked successes, failures, ignored exceptions, 429s (raised, and reported outside
    a call: RL-9); a retried call is one call whatever its attempts (FAC-2), and the count
    survives the cascade window ageing out and being cleared."""
    service = "em7-calls"
    attempts = {"n": 0}

    @baldur.circuit_breaker(service, failure_threshold=1000, failure_rate_threshold=0, ignore_exceptions=(KeyError,))
    def call(kind: str = "ok") -> int:
        if kind == "fail":
            raise ValueError("down")
        if kind == "ignored":
            raise KeyError("not ours")
        if kind == "429":
            raise RateLimitError("slow down")
        return 1

    def flaky() -> int:
        attempts["n"] += 1
        if attempts["n"] % 3:
            raise ValueError("down")
        return 1

    def down() -> int:
        raise ValueError("down")

    policy = baldur.RetryPolicy(max_attempts=3, backoff_initial=0.1, jitter=0)
    for _ in range(250):  # the window fills: most of these take the lock-free healthy lane
        call()
    breaker = baldur.get_breaker(service)
    assert core_of(breaker).healthy_permit is not None
    clock.advance(1.5)  # a new cascade second
    for _ in range(5):
        call()
    for kind, times in (("fail", 3), ("ignored", 2), ("429", 2)):
        for _ in range(times):
            with pytest.raises(Exception):  # noqa: B017 - each kind raises its own
                call(kind)
    baldur.record_rate_limit(service, retry_after=0)  # RL-9: a rate-limited call of its own
    assert baldur.protect(service, flaky, retry=policy) == 1  # two failed attempts, then success
    with pytest.raises(ValueError):
        baldur.protect(service, down, retry=policy)  # three failed attempts: one failure
    clock.advance(120)  # every cascade bucket leaves the 60 s window
    for _ in range(4):
        call()
    assert calls(scraper, service) == {"success": 260, "failure": 4, "ignored": 2, "rate_limited": 3}


def test_em7_dry_run_calls_are_counted_and_never_blocked(clock, scraper, monkeypatch):
    """EM-7, OP-5: in dry-run a call the OPEN breaker lets through still counts by its
    outcome, and nothing is counted as blocked."""
    monkeypatch.setenv("BALDUR_DRY_RUN", "true")
    baldur.core.config.settings.reset()
    service = "em7-dry"

    @baldur.circuit_breaker(service, failure_threshold=2, recovery_timeout=60)
    def call(fail: bool) -> int:
        if fail:
            raise ValueError("down")
        return 1

    for _ in range(2):
        with pytest.raises(ValueError):
            call(True)
    assert baldur.get_breaker(service).state is baldur.CircuitState.OPEN
    assert call(False) == 1  # let through by dry-run
    with pytest.raises(ValueError):
        call(True)
    assert calls(scraper, service) == {"success": 1, "failure": 3, "ignored": None, "rate_limited": None}
    assert blocked(scraper, service) == NOT_EXPORTED  # nothing blocked: no series at all
    assert baldur.get_breaker(service).snapshot()["dry_run_rejections"] == 2


# ---------------------------------------------------------------------- blocked
def test_em7_blocked_requests_by_reason(clock, scraper, memory_emergency):
    """EM-7: rejections by reason: ``open`` (the wrappers' lock-free rejection, and
    ``acquire_slow`` when a listener wants the event), ``half_open_full``, ``frozen``
    (Level 3 holding an OPEN breaker past its timeout, and a HALF_OPEN one)."""
    service = "em7-blocked"

    @baldur.circuit_breaker(service, failure_threshold=1, recovery_timeout=10, half_open_max_calls=1)
    def call(fail: bool = False) -> int:
        if fail:
            raise ValueError("down")
        return 1

    with pytest.raises(ValueError):
        call(True)
    for _ in range(3):  # the lock-free rejection inside the wrapper
        with pytest.raises(baldur.CircuitOpenError):
            call()
    wanted = RecordingListener(bus)  # wants rejection events: the wrapper goes to acquire_slow
    try:
        with pytest.raises(baldur.CircuitOpenError):
            call()
    finally:
        bus.unsubscribe(wanted)
    assert [e.reason for e in wanted.events if e.kind == "call_rejected"] == ["open"]
    breaker = baldur.get_breaker(service)
    clock.advance(11)
    permit = breaker.acquire()  # HALF_OPEN: the single trial slot, held
    assert permit.trial
    for _ in range(2):
        with pytest.raises(baldur.CircuitOpenError) as rejected:
            call()
        assert rejected.value.reason == "half_open_full"
    breaker.record_ignored(permit)  # the slot comes back; the call ended in neither outcome
    emergency.set_level(3, minutes=5)
    with pytest.raises(baldur.CircuitOpenError) as rejected:
        call()
    assert rejected.value.reason == "frozen"
    assert blocked(scraper, service) == {"open": 4, "half_open_full": 2, "frozen": 1}
    assert calls(scraper, service)["ignored"] == 1


def test_em7_a_429_report_looking_for_a_probe_slot_is_not_a_blocked_request(clock, scraper):
    """EM-7, RL-9: ``record_rate_limit`` on an OPEN breaker is a rate-limited call, not a
    blocked request."""
    service = "em7-report"
    breaker = registry.get(service, {"failure_threshold": 1, "recovery_timeout": 10})
    breaker.record_failure(breaker.acquire())
    baldur.record_rate_limit(service)
    assert breaker.state is baldur.CircuitState.OPEN
    assert blocked(scraper, service) == NOT_EXPORTED
    assert calls(scraper, service) == {"success": None, "failure": 1, "ignored": None, "rate_limited": 1}


def test_em7_a_429_report_finding_the_fleets_round_full_is_not_a_blocked_request(clock, scraper, fresh_registry):
    """EM-7, RL-9, ST-2: on a shared store, a 429 reported while the fleet's HALF_OPEN round
    has no free slot is a rate-limited call (a sighting only), not a blocked request."""
    fresh_registry.set_store(MemoryStore(now=clock.wall))
    service = "em7-report-shared"
    breaker = registry.get(service, {"failure_threshold": 1, "recovery_timeout": 10, "half_open_max_calls": 1})
    breaker.record_failure(breaker.acquire())
    clock.advance(11)
    probe = breaker.acquire()  # the round's only slot
    assert probe.trial
    baldur.record_rate_limit(service)
    assert blocked(scraper, service) == NOT_EXPORTED
    assert calls(scraper, service) == {"success": None, "failure": 1, "ignored": None, "rate_limited": 1}
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()  # a request, by contrast, is blocked
    assert blocked(scraper, service)["half_open_full"] == 1


# ------------------------------------------------------------------ transitions
def test_em7_transitions_by_from_to_and_trigger(clock, scraper, no_audit):
    """EM-7: each state change of the process's breaker once, labelled by from_state,
    to_state and trigger; a force on a breaker already OPEN changes no state."""
    service = "em7-transitions"

    @baldur.circuit_breaker(service, failure_threshold=2, recovery_timeout=10, half_open_max_calls=1)
    def call(fail: bool = False) -> int:
        if fail:
            raise ValueError("down")
        return 1

    for _ in range(2):
        with pytest.raises(ValueError):
            call(True)  # closed -> open (consecutive_failures)
    clock.advance(11)
    with pytest.raises(ValueError):
        call(True)  # open -> half_open (recovery_timeout), half_open -> open (half_open_failure)
    clock.advance(11)
    call()  # open -> half_open, half_open -> closed (half_open_success)
    baldur.force_open_circuit(service, ttl_minutes=1)  # closed -> open (forced)
    baldur.force_open_circuit(service, ttl_minutes=1)  # already OPEN: no transition
    baldur.release_circuit(service)  # open -> half_open (released)
    baldur.force_close_circuit(service, ttl_minutes=1)  # half_open -> closed (forced)
    assert transitions(scraper, service) == {
        ("closed", "open", "consecutive_failures"): 1,
        ("open", "half_open", "recovery_timeout"): 2,
        ("half_open", "open", "half_open_failure"): 1,
        ("half_open", "closed", "half_open_success"): 1,
        ("closed", "open", "forced"): 1,
        ("open", "half_open", "released"): 1,
        ("half_open", "closed", "forced"): 1,
    }


# ------------------------------------------------------------------------ gauges
def test_em7_state_gauge_per_service(clock, scraper):
    """EM-7: the state gauge is 0 closed, 1 open, 2 half_open, per service; an OPEN breaker
    past its recovery timeout reads half_open at scrape time (CB-5)."""
    closed = registry.get("em7-closed")
    opened = registry.get("em7-open", {"failure_threshold": 1, "recovery_timeout": 100})
    probing = registry.get("em7-half-open", {"failure_threshold": 1, "recovery_timeout": 10})
    for breaker in (opened, probing):
        breaker.record_failure(breaker.acquire())
    clock.advance(11)
    samples = scraper.scrape()
    assert samples[(STATE, frozenset({"service": "em7-closed"}.items()))] == 0
    assert samples[(STATE, frozenset({"service": "em7-open"}.items()))] == 1
    assert samples[(STATE, frozenset({"service": "em7-half-open"}.items()))] == 2
    assert closed.state is baldur.CircuitState.CLOSED


@pytest.fixture
def memory_emergency(clock):
    emergency.use_clock(clock)
    emergency.use_backend(emergency.MemoryLevelBackend())
    yield
    emergency.reset()


def test_em7_emergency_level_gauge(scraper, memory_emergency):
    """EM-7: ``baldur_emergency_level`` (no label) follows the level in force."""
    assert scraper.value(LEVEL) == 0
    emergency.set_level(2, minutes=5)
    assert scraper.value(LEVEL) == 2
    emergency.set_level(3, minutes=5)
    assert scraper.value(LEVEL) == 3
    emergency.set_level(0)
    assert scraper.value(LEVEL) == 0


# ------------------------------------------------------------- monotonic counters
def test_em7_counters_never_go_down_when_readings_fold_out_of_order(scraper):
    """EM-7: two readers (a scrape, the flusher) may fold their readings in the opposite
    order they were taken: a series keeps the highest value seen."""
    breaker = registry.get("em7-order")
    breaker.record_success(breaker.acquire())
    _, older, _ = metric_values(core_of(breaker))
    for _ in range(5):
        breaker.record_success(breaker.acquire())
    breaker.record_failure(breaker.acquire())
    _, newer, _ = metric_values(core_of(breaker))
    tally = prometheus._tally
    tally._fold([(breaker, newer, ())])
    tally._fold([(breaker, older, ())])
    assert calls(scraper, "em7-order") == {"success": 6, "failure": 1, "ignored": None, "rate_limited": None}


def test_em7_counters_carry_over_a_replaced_breaker(scraper):
    """EM-7: a breaker replaced under its name (``registry.clear()``) never makes its
    series go down: the old breaker's counts stay in them."""
    breaker = registry.get("em7-replaced")
    for _ in range(4):
        breaker.record_success(breaker.acquire())
    assert calls(scraper, "em7-replaced")["success"] == 4
    registry.clear()
    breaker = registry.get("em7-replaced")
    breaker.record_success(breaker.acquire())
    assert calls(scraper, "em7-replaced")["success"] == 5


def test_em7_counts_stay_exact_and_monotonic_under_threads(scraper, no_audit):
    """EM-7, CB-9: threads make calls (the lock-free healthy lane included) while another
    forces and releases the breaker (each open clears the cascade window the successes are
    counted in) and two threads scrape: every scrape is at least the one before, and the
    final counts equal what the callers saw."""
    service = "em7-threads"
    breaker = registry.get(service, {"sliding_window_size": 10, "half_open_max_calls": 1000})

    def ok() -> int:
        return 1

    for _ in range(20):
        baldur.protect(service, ok)
    seen = {"success": 20, "open": 0, "half_open_full": 0}
    seen_lock = threading.Lock()
    stop = threading.Event()
    dips: list[str] = []
    barrier = threading.Barrier(6)

    # The operator moves on only once a caller has met each state it set (a refusal while
    # forced open, a success while forced closed), so the calls race the forces however the
    # scheduler runs the threads: on a loaded machine the 100 rounds could otherwise finish
    # before a caller ever ran.
    progress = {"open": 0, "success": 0}
    moved = threading.Condition()

    def note(outcome: str) -> None:
        with moved:
            progress[outcome] += 1
            moved.notify_all()

    def caller() -> None:
        mine = {"success": 0, "open": 0, "half_open_full": 0}
        barrier.wait()
        while not stop.is_set():
            try:
                baldur.protect(service, ok)
                mine["success"] += 1
                note("success")
            except baldur.CircuitOpenError as rejected:
                mine[rejected.reason] += 1
                if rejected.reason == "open":
                    note("open")
        with seen_lock:
            for key, value in mine.items():
                seen[key] += value

    def until_met(outcome: str, since: int) -> None:
        with moved:
            if not moved.wait_for(lambda: progress[outcome] > since, timeout=30):
                stalled.append(outcome)

    stalled: list[str] = []

    def operator() -> None:
        barrier.wait()
        try:
            for _ in range(100):
                since = progress["open"]
                breaker.force_open(ttl_minutes=1)
                until_met("open", since)
                breaker.release()
                since = progress["success"]
                breaker.force_close(ttl_minutes=1)
                until_met("success", since)
                breaker.release()
                if stalled:
                    break
        finally:
            stop.set()

    def reader() -> None:
        last: dict = {}
        barrier.wait()
        while not stop.is_set():
            for key, value in Scraper.scrape(scraper).items():
                if key[0].endswith("_total") and value < last.get(key, 0):
                    dips.append(f"{key}: {last[key]} -> {value}")
                last[key] = value

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=target) for target in (caller, caller, caller, operator, reader, reader)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert stalled == [], f"no caller met the forced state {stalled}"
    assert dips == []
    assert seen["open"] >= 100 and seen["success"] > 100, seen  # the workload did race the forces
    assert calls(scraper, service) == {
        "success": seen["success"],
        "failure": None,
        "ignored": None,
        "rate_limited": None,
    }
    assert blocked(scraper, service) == {
        "open": seen["open"],
        "half_open_full": seen["half_open_full"] or None,
        "frozen": None,
    }


def test_em7_a_forked_child_counts_from_zero(scraper):
    """EM-7: after a fork the child's counts start at zero (what the parent counted is the
    parent's to report): the core's at-fork hook, called here as ``os.fork`` would."""
    breaker = registry.get("em7-fork")
    for _ in range(3):
        breaker.record_success(breaker.acquire())
    breaker.record_failure(breaker.acquire())
    registry_module._after_fork_in_child()
    prometheus._flusher.after_fork_in_child()  # the module's own hook: its tally starts afresh
    assert calls(scraper, "em7-fork") == {"success": None, "failure": None, "ignored": None, "rate_limited": None}
    breaker.record_success(breaker.acquire())
    assert calls(scraper, "em7-fork") == {"success": 1, "failure": None, "ignored": None, "rate_limited": None}


# --------------------------------------------------------------------- install
def test_em7_install_is_idempotent_per_registry():
    """EM-7: ``install()`` registers one collector per registry and returns it each time;
    the default registry is prometheus_client's ``REGISTRY``."""
    mine = CollectorRegistry()
    first = prometheus.install(mine)
    assert prometheus.install(mine) is first
    assert isinstance(first, prometheus.BaldurCollector)
    default = prometheus.install()
    assert prometheus.install(None) is default
    assert default is not first
    import prometheus_client

    assert default in prometheus_client.REGISTRY._collector_to_names


def test_em7_install_refuses_a_multiprocess_dir_it_cannot_use(tmp_path, monkeypatch):
    """EM-7: ``PROMETHEUS_MULTIPROC_DIR`` naming no directory, or set after prometheus_client
    was imported (as in this process), is a ConfigError naming the cause."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(baldur.ConfigError, match="not a directory"):
        prometheus.install(CollectorRegistry())
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(baldur.ConfigError, match="imported before"):
        prometheus.install(CollectorRegistry())


def test_em7_missing_prometheus_client_is_a_clear_import_error(monkeypatch):
    """EM-7: without prometheus_client the import fails naming the extra to install."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an absent package looks like
    monkeypatch.delitem(sys.modules, "baldur_django.contrib.prometheus")
    with pytest.raises(ImportError, match=r"baldur-django\[prometheus\]"):
        importlib.import_module("baldur_django.contrib.prometheus")
    monkeypatch.undo()
    assert importlib.import_module("baldur_django.contrib.prometheus") is prometheus


# ------------------------------------------------------------------- the view
def test_em7_metrics_view_serves_a_parseable_exposition(clock):
    """EM-7: ``metrics_view`` serves the default registry in the text format (OpenMetrics
    when asked), with baldur's series in it; other methods get 405."""
    breaker = registry.get("em7-view")
    breaker.record_success(breaker.acquire())
    factory = RequestFactory()
    response = prometheus.metrics_view(factory.get("/metrics"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse(response.content.decode())
    assert samples[(CALLS, frozenset({"service": "em7-view", "outcome": "success"}.items()))] == 1
    assert samples[(STATE, frozenset({"service": "em7-view"}.items()))] == 0
    assert (LEVEL, frozenset()) in samples
    response = prometheus.metrics_view(factory.get("/metrics", HTTP_ACCEPT="application/openmetrics-text"))
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")
    assert prometheus.metrics_view(factory.post("/metrics")).status_code == 405


def test_em7_a_success_racing_a_trip_is_still_counted(clock, scraper, no_audit):
    """EM-7: the healthy lane counts a success with ``next(cascade.counter)``; a thread
    switch between reading the counter and stepping it may let a trip clear the cascade
    first. The cleared counters stay readable for a second, so that late success is still
    in calls_total; after that they are folded into one number."""
    service = "em7-late"
    breaker = registry.get(service, {"sliding_window_size": 5, "half_open_max_calls": 1})
    for _ in range(8):
        baldur.protect(service, lambda: 1)
    assert core_of(breaker).healthy_permit is not None
    late = core_of(breaker).cascade.counter  # what a healthy-lane success has read, about to step it
    breaker.force_open(ttl_minutes=1)  # the trip clears the cascade window
    breaker.release()
    assert baldur.protect(service, lambda: 1) == 1  # the trial closes it; the cascade rolls
    next(late)  # the success lands in the counter it read
    assert calls(scraper, service)["success"] == 10
    clock.advance(2.5)
    baldur.protect(service, lambda: 1)  # a roll a second later folds the cleared counters
    assert core_of(breaker).cascade._gone == []
    assert calls(scraper, service)["success"] == 11
