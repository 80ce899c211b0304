"""The services package: forces with lifetimes, releases, status rows, config report, audit (OP-1..OP-6, CFG-4, CB-13)."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid

import pytest
from django.db import DatabaseError, transaction

import baldur_django as baldur
from baldur_django import services
from baldur_django.core import registry as registry_module
from baldur_django.core.errors import CircuitOpenError, ConfigError, StoreError
from baldur_django.core.events import bus
from baldur_django.core.knobs import KNOBS
from baldur_django.models import BreakerAudit


def trip(name: str, failures: int = 5) -> None:
    breaker = baldur.get_breaker(name)
    for _ in range(failures):
        breaker.record_failure(breaker.acquire())


# ------------------------------------------------------------------ forces and lapses
def test_force_open_holds_then_lapses_to_half_open(clock, events):
    """OP-1, OP-2, OP-3: a forced open rejects, never probes, and lapses straight to HALF_OPEN."""
    snap = services.force("pay", "open", 1.5, reason="maintenance", actor="alice")
    assert snap["state"] == "open" and snap["forced"] == "open"
    assert snap["force_expires_at"] == pytest.approx(clock.wall() + 90.0)
    assert snap["force_reason"] == "maintenance" and snap["force_actor"] == "alice"
    breaker = baldur.get_breaker("pay")
    clock.advance(89.9)  # beyond the 60 s recovery timeout, still inside the force
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()
    assert info.value.retry_after == pytest.approx(0.1)
    assert breaker.state is baldur.CircuitState.OPEN
    clock.advance(0.1)
    assert breaker.state is baldur.CircuitState.HALF_OPEN
    assert breaker.forced is None
    assert events.kinds().count("force_lapsed") == 1


def test_force_close_outranks_failures_then_lapses_with_counts(clock):
    """OP-2, OP-3: forced closed records failures without tripping; after the lapse the next failure trips."""
    trip("pay")
    assert baldur.get_breaker("pay").state is baldur.CircuitState.OPEN
    services.force("pay", "close", 2, actor="bob")
    breaker = baldur.get_breaker("pay")
    assert breaker.state is baldur.CircuitState.CLOSED
    trip("pay", 7)
    snap = breaker.snapshot()
    assert snap["state"] == "closed" and snap["consecutive_failures"] == 7
    clock.advance(120)
    snap = breaker.snapshot()
    assert snap["forced"] is None and snap["state"] == "closed" and snap["consecutive_failures"] == 7
    breaker.record_failure(breaker.acquire())
    assert breaker.state is baldur.CircuitState.OPEN


def test_release_in_both_directions(clock):
    """OP-3: releasing a forced open goes to HALF_OPEN; a forced closed stays CLOSED with its counts."""
    services.force("a", "open", 30)
    assert services.release("a", actor="carol") is True
    assert baldur.get_breaker("a").state is baldur.CircuitState.HALF_OPEN
    services.force("b", "closed", 30)
    trip("b", 3)
    assert services.release("b") is True
    snap = baldur.get_breaker("b").snapshot()
    assert snap["state"] == "closed" and snap["forced"] is None and snap["consecutive_failures"] == 3


def test_release_of_unforced_or_unknown_breaker_is_a_noop(clock, events):
    """OP-3: nothing forced -> False, no event; an unknown name on the memory backend is not registered."""
    baldur.get_breaker("idle")
    assert services.release("idle") is False
    assert services.release("never-seen") is False
    assert "never-seen" not in registry_module.registry.names()
    assert "released" not in events.kinds()


def test_force_registers_a_new_service(clock):
    """OP-1: forcing a service not seen yet registers its breaker."""
    services.force("fresh", "open", 5)
    assert "fresh" in registry_module.registry.names()


@pytest.mark.parametrize("ttl", [0, -1, 1440.0001, 1e9, math.nan, math.inf, True, "10", [5]])
def test_bad_lifetimes_are_refused_and_nothing_is_written(clock, events, ttl):
    """OP-1: a lifetime <= 0, above 1440 or not a number is a ConfigError naming it; nothing registered or published."""
    with pytest.raises(ConfigError, match="ttl_minutes"):
        services.force("svc", "open", ttl)
    assert registry_module.registry.names() == []
    assert events.events == []


@pytest.mark.parametrize("ttl", [1440, 0.01, 1])
def test_lifetime_bounds_accepted(clock, ttl):
    """OP-1: any number > 0 and <= 1440 (fractions allowed) is a lifetime in minutes."""
    snap = services.force("svc", "open", ttl)
    assert snap["force_expires_at"] == pytest.approx(clock.wall() + ttl * 60)


def test_default_lifetime_comes_from_the_setting(clock, settings):
    """OP-1: no lifetime -> BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES (default 90, settings override honoured)."""
    snap = services.force("svc", "open")
    assert snap["force_expires_at"] == pytest.approx(clock.wall() + 90 * 60)
    settings.BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES = 15
    assert services.default_ttl_minutes() == 15
    snap = services.force("svc2", "close")
    assert snap["force_expires_at"] == pytest.approx(clock.wall() + 15 * 60)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "sideways"}, "mode"),
        ({"mode": None}, "mode"),
        ({"reason": "x" * 1001}, "reason"),
        ({"reason": 5}, "reason"),
        ({"source": "email"}, "source"),
        ({"actor": 42}, "actor"),
        ({"service": ""}, "service"),
    ],
)
def test_bad_force_arguments_name_the_problem(clock, kwargs, match):
    """OP-1: every bad argument is a ConfigError naming it, and nothing is registered."""
    args = {"service": "svc", "mode": "open", "ttl_minutes": 5, **kwargs}
    with pytest.raises(ConfigError, match=match):
        services.force(**args)
    assert registry_module.registry.names() == []


def test_dry_run_force_is_applied_but_rejects_nothing(clock, settings):
    """OP-5: under dry-run a forced open shows as forced, yet calls pass and are counted as dry-run rejections."""
    settings.BALDUR_DRY_RUN = True
    snap = services.force("svc", "open", 10)
    assert snap["forced"] == "open"
    permit = baldur.get_breaker("svc").acquire()
    assert permit.dry_run
    assert services.status_rows("svc")[0]["dry_run_rejections"] == 1


# ----------------------------------------------------------------------- status rows
def test_status_rows_list_every_breaker_sorted(clock):
    """OP-6, OP-7: one snapshot per known breaker, sorted by name, with the section-0 keys."""
    trip("zeta")
    baldur.get_breaker("alpha")
    services.force("mid", "open", 5)
    rows = services.status_rows()
    assert [row["service"] for row in rows] == ["alpha", "mid", "zeta"]
    for key in (
        "service",
        "state",
        "consecutive_failures",
        "window_calls",
        "window_failures",
        "opened_at",
        "forced",
        "force_expires_at",
        "dry_run_rejections",
        "backend",
    ):
        assert key in rows[0]
    assert {row["service"]: row["state"] for row in rows} == {"alpha": "closed", "mid": "open", "zeta": "open"}
    assert services.status_rows("zeta")[0]["consecutive_failures"] == 5


def test_status_rows_unknown_service():
    """OP-7: an unknown name is an UnknownServiceError (a BaldurError and a LookupError)."""
    with pytest.raises(services.UnknownServiceError, match="nope") as info:
        services.status_rows("nope")
    assert isinstance(info.value, baldur.BaldurError) and isinstance(info.value, LookupError)
    assert "nope" not in registry_module.registry.names()


@pytest.fixture
def on_database(settings, db):
    """The database store, with 'payments' in BALDUR_SERVICES and 'orders' in BALDUR_DOMAIN_MAPPING."""
    settings.BALDUR_STATE_BACKEND = "database"
    settings.BALDUR_SERVICES = {"payments": {"failure_threshold": 3}}
    settings.BALDUR_DOMAIN_MAPPING = {"/api/orders/": "orders"}
    return registry_module.registry.store


def test_known_services_come_from_processes_the_shared_registry_and_settings(clock, on_database):
    """OP-7: the known names are this process's breakers, the shared registry's, BALDUR_SERVICES' keys
    and BALDUR_DOMAIN_MAPPING's breakers."""
    baldur.get_breaker("local")
    on_database.load("remote")  # another process registered it
    assert services.known_services() >= {"local", "remote", "payments", "orders"}
    assert services.closest_services("paymnets") == ["payments"]
    assert services.check_known("remote") == "remote"


def test_force_without_allow_new_refuses_a_name_nobody_knows(clock, on_database, events):
    """OP-7: force(allow_new=False) refuses an unknown name with the closest names and writes nothing;
    the public API (allow_new defaults to True) still registers a new service (OP-1)."""
    with pytest.raises(services.UnknownServiceError, match=r"did you mean 'payments'\?") as info:
        services.force("paymnets", "open", 5, allow_new=False)
    assert info.value.suggestions == ["payments"] and info.value.service == "paymnets"
    assert "paymnets" not in registry_module.registry.names() and "paymnets" not in on_database.names()
    assert events.events == []
    services.force("payments", "open", 5, allow_new=False)
    services.force("brand-new", "open", 5)
    assert {"payments", "brand-new"} <= set(on_database.names())


def test_release_of_a_name_nobody_knows_registers_nothing(clock, on_database):
    """OP-7: releasing a name nobody knows writes nothing to the shared store (no ghost breaker):
    False by default, UnknownServiceError with allow_unknown=False."""
    assert services.release("ghost") is False
    with pytest.raises(services.UnknownServiceError, match="ghost"):
        services.release("ghosts", allow_unknown=False)
    assert "ghost" not in on_database.names() and "ghost" not in registry_module.registry.names()


def test_check_known_says_when_the_shared_registry_cannot_be_read(clock, on_database, monkeypatch):
    """OP-4, OP-7: an unreadable shared registry is a StoreError, not a misleading 'unknown name'."""

    def down():
        raise ConnectionError("store down")

    monkeypatch.setattr(on_database, "names", down)
    with pytest.raises(baldur.BaldurError, match=r"could not be read.*store down"):
        services.check_known("anything")


# ------------------------------------------------------------------------------ forget
def _shared_store(kind: str):
    if kind == "fakeredis":
        import fakeredis

        from baldur_django.core.stores.redis import RedisStore

        return RedisStore(fakeredis.FakeRedis(), prefix=f"forget-{uuid.uuid4().hex[:8]}")
    if kind == "memory":
        from baldur_django.core.stores.memory import MemoryStore

        return MemoryStore()
    return registry_module.registry.store  # the database store


@pytest.mark.parametrize("kind", ["database", "fakeredis", "memory"])
def test_forget_removes_a_ghost_from_the_shared_record_and_registry(clock, on_database, audit, audit_rows, kind):
    """OP-7: a typo forced with allow_new, then released (HALF_OPEN), is forgotten: gone from the shared
    registry and record (every store), from this process and from the status; audited as 'forget'."""
    store = _shared_store(kind)
    registry_module.registry.set_store(store)
    services.force("paymnets", "open", 5, actor="ops")
    services.release("paymnets")
    assert services.status_rows("paymnets")[0]["state"] == "half_open"
    result = services.forget("paymnets", actor="alice", source="admin", reason="typo")
    assert result == {"service": "paymnets", "state": "half_open", "shared": True}
    assert "paymnets" not in store.names() and "paymnets" not in registry_module.registry.names()
    assert "paymnets" not in [row["service"] for row in services.status_rows()]
    assert store.inspect("paymnets").record.state == "closed"  # no record left: reads as fresh
    row = audit_rows(action="forget")[0]
    assert (row["service"], row["actor"], row["source"], row["reason"], row["from_state"]) == (
        "paymnets",
        "alice",
        "admin",
        "typo",
        "half_open",
    )


def test_forget_is_refused_while_forced(clock, on_database, audit, audit_rows):
    """OP-7: a forced breaker is not forgotten (BreakerForcedError); record, registry and audit unchanged."""
    services.force("payments", "close", 5)
    with pytest.raises(services.BreakerForcedError, match=r"'payments' is forced closed until .*release it first"):
        services.forget("payments")
    assert "payments" in on_database.names() and on_database.inspect("payments").record.forced == "closed"
    assert [r["action"] for r in audit_rows()] == ["close"]


def test_forget_sees_a_force_another_process_just_made(clock, on_database, audit, audit_rows):
    """OP-4, OP-7: a breaker this process consulted a moment ago, then forced by another process
    (written straight to the shared store), is refused: forget reads the shared record first."""
    baldur.get_breaker("payments").snapshot()  # consulted now; the next regular consult is seconds away
    on_database.force("payments", mode="open", ttl_seconds=600.0, reason="elsewhere", actor="other-process")
    with pytest.raises(services.BreakerForcedError, match="'payments' is forced open"):
        services.forget("payments")
    assert on_database.inspect("payments").record.forced == "open" and audit_rows() == []


def test_forget_of_a_lapsed_force_goes_ahead(clock, on_database, audit, audit_rows):
    """OP-7: a force whose lifetime is over does not block the forget (a shared store on the test's clock)."""
    from baldur_django.core.stores.memory import MemoryStore

    store = MemoryStore(now=clock.wall)
    registry_module.registry.set_store(store)
    services.force("payments", "open", 1)
    clock.advance(61)
    assert services.forget("payments")["state"] == "half_open"
    assert "payments" not in store.names()


def test_forget_of_an_unregistered_name_names_the_closest(clock, on_database, audit, audit_rows):
    """OP-7: a name neither the shared registry nor this process has is an UnknownServiceError with
    the closest registered names; nothing is written."""
    baldur.get_breaker("inventory")
    with pytest.raises(services.UnknownServiceError, match=r"did you mean 'inventory'\?"):
        services.forget("inventroy")
    assert audit_rows() == [] and "inventroy" not in on_database.names()


def test_forget_on_the_memory_backend_acts_on_this_process(clock, audit, audit_rows):
    """OP-7: on the memory backend only this process's breaker is forgotten, and the result says so."""
    trip("local")
    assert services.forget("local") == {"service": "local", "state": "open", "shared": False}
    assert "local" not in registry_module.registry.names()
    assert baldur.get_breaker("local").state is baldur.CircuitState.CLOSED  # a fresh breaker on next use
    with pytest.raises(services.UnknownServiceError):
        services.forget("elsewhere")


def test_a_forget_the_store_could_not_carry_out_is_a_store_error(clock, on_database, monkeypatch, audit, audit_rows):
    """OP-4, OP-7: a store error during the removal is a StoreError; this process keeps the breaker."""
    baldur.get_breaker("payments")

    def down(name):
        raise ConnectionError("store down")

    monkeypatch.setattr(on_database, "reset", down)
    with pytest.raises(StoreError, match=r"could not be removed.*nothing was forgotten"):
        services.forget("payments")
    assert "payments" in registry_module.registry.names() and audit_rows() == []


def test_backend_name_and_sharing(settings):
    """OP-6, OP-7: memory is not shared; database and redis are."""
    assert services.backend_name() == "memory" and not services.is_shared_backend()
    settings.BALDUR_STATE_BACKEND = "database"
    assert services.is_shared_backend()
    settings.BALDUR_STATE_BACKEND = "redis"
    assert services.backend_name() == "redis" and services.is_shared_backend()


# --------------------------------------------------------------------- config report
def test_config_report_lists_every_knob_with_its_source(settings, monkeypatch):
    """CFG-4: every knob appears once, in table order, with setting/env/default provenance."""
    settings.BALDUR_CB_FAILURE_THRESHOLD = 9
    monkeypatch.setenv("BALDUR_CB_MINIMUM_CALLS", "7")
    from baldur_django.core.config import settings as source

    source.reset()
    rows = services.config_report()
    assert [row["name"] for row in rows] == list(KNOBS)
    by_name = {row["name"]: row for row in rows}
    assert by_name["BALDUR_CB_FAILURE_THRESHOLD"] == {
        "name": "BALDUR_CB_FAILURE_THRESHOLD",
        "value": 9,
        "source": "setting",
    }
    assert by_name["BALDUR_CB_MINIMUM_CALLS"] == {"name": "BALDUR_CB_MINIMUM_CALLS", "value": 7, "source": "env"}
    assert by_name["BALDUR_CB_RECOVERY_TIMEOUT"]["source"] == "default"
    assert by_name["BALDUR_MIDDLEWARE_CB_STATUS_CODES"]["value"] == [500, 502, 503, 504]


def test_config_report_hides_secrets(settings):
    """CFG-4, OP-8: the Slack webhook URL and a Redis password never show."""
    settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = "https://hooks.example.test/services/T1/B2/SECRETTOKEN"
    settings.BALDUR_REDIS_URL = "redis://user:hunter2@127.0.0.1:6379/0"
    text = repr(services.config_report())
    assert "SECRETTOKEN" not in text and "hunter2" not in text
    by_name = {row["name"]: row for row in services.config_report()}
    assert by_name["BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL"]["value"] == "<set, hidden>"
    assert by_name["BALDUR_REDIS_URL"]["value"] == "redis://user:***@127.0.0.1:6379/0"


# ---------------------------------------------------------------------------- audit
def test_audit_rows_for_force_and_release(clock, audit, audit_rows):
    """OP-6: one row per breaker per action with who, when, what, lifetime, reason and source."""
    services.force("pay", "open", 30, reason="maintenance", actor="alice", source="admin")
    services.force("pay", "close", 5, reason="it is back", actor="command:root", source="command")
    assert services.release("pay", actor="bob", source="admin", reason="done") is True
    rows = audit_rows()
    assert [(r["action"], r["actor"], r["source"], r["ttl_minutes"], r["reason"]) for r in rows] == [
        ("open", "alice", "admin", 30.0, "maintenance"),
        ("close", "command:root", "command", 5.0, "it is back"),
        ("release", "bob", "admin", None, "done"),
    ]
    assert [r["service"] for r in rows] == ["pay"] * 3
    assert (rows[0]["from_state"], rows[0]["to_state"]) == ("closed", "open")
    assert rows[0]["at"].timestamp() == pytest.approx(clock.wall())
    assert rows[0]["expires_at"].timestamp() == pytest.approx(clock.wall() + 30 * 60)
    assert rows[2]["expires_at"] is None


def test_audit_noop_release_writes_nothing(clock, audit, audit_rows):
    """OP-6: a release that changed nothing writes no row."""
    baldur.get_breaker("idle")
    assert services.release("idle", actor="bob") is False
    assert audit_rows() == []


def test_audit_records_public_api_calls_as_api(clock, audit, audit_rows):
    """OP-6: forces and releases through the public functions are recorded with source 'api' and the actor given."""
    baldur.force_open_circuit("pay", ttl_minutes=3, reason="deploy", actor="deploy-bot")
    baldur.release_circuit("pay", actor="deploy-bot")
    rows = audit_rows()
    assert [(r["action"], r["source"], r["actor"]) for r in rows] == [
        ("open", "api", "deploy-bot"),
        ("release", "api", "deploy-bot"),
    ]


def test_audit_database_error_never_breaks_the_force(clock, audit, audit_rows, monkeypatch, caplog):
    """OP-6, CB-14: a failing audit write is logged on baldur.audit; the force stands and no exception escapes."""

    def broken(*args, **kwargs):
        raise DatabaseError("disk full")

    monkeypatch.setattr(BreakerAudit.objects, "create", broken)
    with caplog.at_level(logging.ERROR, logger="baldur.audit"), transaction.atomic():
        services.force("pay", "open", 5, actor="alice")
        assert BreakerAudit.objects.count() == 0  # the outer transaction is still usable
    assert baldur.get_breaker("pay").forced == "open"
    assert any("audit_not_written" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_audit_written_when_forcing_from_async_code(clock, monkeypatch):
    """OP-6: a force made on an event loop is audited (the ORM write runs off the loop's thread)."""
    had = services.audit_listener in bus.listeners
    services.install_audit_listener()
    try:

        async def main():
            baldur.force_open_circuit("async-svc", ttl_minutes=2, actor="async-user")

        asyncio.run(main())
        rows = list(BreakerAudit.objects.values_list("service", "action", "actor"))
        assert rows == [("async-svc", "open", "async-user")]
    finally:
        if not had:
            services.uninstall_audit_listener()


# ------------------------------------------------------------------------ logging
def test_forces_releases_and_lapses_log_at_the_configured_level(clock, settings, caplog):
    """CB-13: forced_open/forced_closed/released/force_lapsed lines at BALDUR_EVENT_LOGGING_CB_LOG_LEVEL with record attributes."""
    settings.BALDUR_EVENT_LOGGING_CB_LOG_LEVEL = "INFO"
    with caplog.at_level(logging.DEBUG, logger="baldur.circuit_breaker"):
        services.force("pay", "open", 1, reason="maint", actor="alice")
        services.release("pay", actor="alice")
        services.force("pay", "close", 1)
        clock.advance(61)
        baldur.get_breaker("pay").state  # noqa: B018 - evaluates the lapse
    records = [r for r in caplog.records if r.name == "baldur.circuit_breaker"]
    events = [r.event for r in records]
    assert events == [
        "circuit_breaker.forced_open",
        "circuit_breaker.released",
        "circuit_breaker.forced_closed",
        "circuit_breaker.force_lapsed",
    ]
    assert {r.levelno for r in records} == {logging.INFO}
    for record in records:
        assert record.service == "pay"
        assert record.getMessage().startswith(record.event)
    assert (records[0].from_state, records[0].to_state, records[0].trigger) == ("closed", "open", "forced")
    assert (records[1].from_state, records[1].to_state, records[1].trigger) == ("open", "half_open", "released")
    assert records[3].trigger == "force_lapsed"
