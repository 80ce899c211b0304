"""Management commands baldur_status and baldur_force (OP-4, OP-7, CFG-4), in process and as real processes."""

from __future__ import annotations

import io
import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import baldur_django as baldur
from baldur_django.core import registry as registry_module
from baldur_django.core.errors import StoreError
from baldur_django.core.knobs import KNOBS
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.models import BreakerAudit

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def some_breakers(clock, db):
    """'alpha' healthy, 'beta' tripped, 'gamma' forced open (its audit row removed)."""
    baldur.get_breaker("alpha")
    broken = baldur.get_breaker("beta")
    for _ in range(5):
        broken.record_failure(broken.acquire())
    baldur.force_open_circuit("gamma", ttl_minutes=10, reason="planned", actor="ops")
    BreakerAudit.objects.all().delete()
    return clock


@pytest.fixture
def shared(settings, db):
    """Pretend a shared backend is configured (the commands' shared-store paths)."""
    settings.BALDUR_STATE_BACKEND = "database"


# ------------------------------------------------------------------- baldur_status
def test_status_table_lists_breakers_and_says_it_sees_one_process(some_breakers):
    """OP-7: a readable table of every known breaker; on memory, stderr says it shows only its own process."""
    out, err = run("baldur_status")
    lines = out.splitlines()
    assert lines[0] == "backend: memory (this process only)"
    assert lines[1].split()[:3] == ["SERVICE", "STATE", "FORCED"]
    body = {line.split()[0]: line.split() for line in lines[2:]}
    assert list(body) == ["alpha", "beta", "gamma"]
    assert body["beta"][1] == "OPEN" and body["alpha"][1] == "CLOSED"
    assert body["gamma"][2:4] == ["open", "by"]
    assert "only its own process" in err


def test_status_json_is_the_only_thing_on_stdout(some_breakers):
    """OP-7: --json prints one JSON document on stdout; the notice goes to stderr."""
    out, err = run("baldur_status", "--json")
    document = json.loads(out)
    assert document["backend"] == "memory" and document["shared"] is False
    assert "this process only" in document["scope"]
    assert [b["service"] for b in document["breakers"]] == ["alpha", "beta", "gamma"]
    gamma = document["breakers"][2]
    assert gamma["forced"] == "open" and gamma["force_expires_at"] == pytest.approx(some_breakers.wall() + 600)
    assert document["breakers"][1]["consecutive_failures"] == 5
    assert "only its own process" in err and "only its own process" not in out


def test_status_single_service(some_breakers):
    """OP-7: --service NAME shows that breaker only."""
    document = json.loads(run("baldur_status", "--json", "--service", "beta")[0])
    assert [b["service"] for b in document["breakers"]] == ["beta"]


def test_status_unknown_service_is_an_error(some_breakers):
    """OP-7: an unknown --service is a CommandError naming it (and the closest known names), and
    registers nothing."""
    with pytest.raises(CommandError, match="'nope'"):
        run("baldur_status", "--service", "nope")
    assert "nope" not in registry_module.registry.names()
    with pytest.raises(CommandError, match=r"'alpah' is known here; did you mean 'alpha'\?"):
        run("baldur_status", "--service", "alpah")


def test_status_on_a_shared_backend_has_no_process_notice(some_breakers, shared):
    """OP-7: with a shared backend there is no 'this process only' notice."""
    out, err = run("baldur_status", "--json")
    assert json.loads(out)["shared"] is True and err == ""


class _RegistryUnreadable(MemoryStore):
    """A shared store whose registry of names cannot be read (the server is down)."""

    def names(self):
        raise ConnectionError("store down")


def test_status_json_notices_go_to_stderr_not_through_logging(some_breakers, shared):
    """OP-7: with the store unreadable, baldur_status --json writes its notice to its own stderr; the
    project's handlers on the ``baldur`` loggers get nothing while it runs and are back afterwards."""
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    family = logging.getLogger("baldur")
    child = logging.getLogger("baldur.services")
    family.addHandler(keep)
    child.addHandler(keep)
    registry_module.registry.set_store(_RegistryUnreadable())
    try:
        out, err = run("baldur_status", "--json")
        assert json.loads(out)["shared"] is True
        assert "status_store_unavailable" in err and "could not be read" in err
        assert seen == []
        logging.getLogger("baldur.services").warning("after the command")
        assert seen == ["after the command", "after the command"]  # both handlers are back
    finally:
        family.removeHandler(keep)
        child.removeHandler(keep)


def test_status_config_lists_every_setting_with_source(settings, monkeypatch, db):
    """CFG-4: --config lists every knob with its effective value and source (setting, env, default)."""
    settings.BALDUR_CB_FAILURE_THRESHOLD = 9
    monkeypatch.setenv("BALDUR_CB_RECOVERY_TIMEOUT", "12.5")
    from baldur_django.core.config import settings as source

    source.reset()
    out, _err = run("baldur_status", "--config")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert list(rows) == list(KNOBS)
    assert rows["BALDUR_CB_FAILURE_THRESHOLD"][1:] == ["9", "setting"]
    assert rows["BALDUR_CB_RECOVERY_TIMEOUT"][1:] == ["12.5", "env"]
    assert rows["BALDUR_CB_MINIMUM_CALLS"][1:] == ["10", "default"]
    document = json.loads(run("baldur_status", "--config", "--json")[0])
    assert {r["name"]: r["source"] for r in document["settings"]}["BALDUR_CB_RECOVERY_TIMEOUT"] == "env"


def test_status_config_never_prints_the_webhook(settings, db):
    """CFG-4, OP-8: the Slack URL shows as hidden."""
    settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = "https://hooks.example.test/services/T/B/TOPSECRET"
    out, _ = run("baldur_status", "--config")
    assert "TOPSECRET" not in out and "<set, hidden>" in out


def test_status_config_and_service_cannot_be_combined():
    """OP-7: --config and --service together are refused."""
    with pytest.raises(CommandError):
        run("baldur_status", "--config", "--service", "x")


# -------------------------------------------------------------------- baldur_force
def test_force_refuses_on_the_memory_backend(some_breakers):
    """OP-7: on memory, baldur_force refuses: a force from this process cannot reach running workers."""
    with pytest.raises(CommandError, match=r"cannot reach the\s+running workers"):
        run("baldur_force", "open", "alpha", "--ttl", "5")
    assert baldur.get_breaker("alpha").forced is None


def test_force_open_close_release(some_breakers, shared, audit, audit_rows):
    """OP-1, OP-3, OP-6, OP-7: open/close/release through the command, audited as source 'command'."""
    out, _ = run("baldur_force", "open", "alpha", "--ttl", "30", "--reason", "maintenance window")
    assert "Forced 'alpha' open for 30 minutes" in out
    snap = baldur.get_breaker("alpha").snapshot()
    assert snap["forced"] == "open" and snap["force_reason"] == "maintenance window"
    out, _ = run("baldur_force", "close", "beta")
    assert "for 90 minutes" in out
    assert baldur.get_breaker("beta").state is baldur.CircuitState.CLOSED
    out, _ = run("baldur_force", "release", "alpha")
    assert "Released 'alpha'" in out
    assert baldur.get_breaker("alpha").state is baldur.CircuitState.HALF_OPEN
    rows = audit_rows()
    assert [(r["service"], r["action"], r["source"], r["ttl_minutes"]) for r in rows] == [
        ("alpha", "open", "command", 30.0),
        ("beta", "close", "command", 90.0),
        ("alpha", "release", "command", None),
    ]
    assert rows[0]["reason"] == "maintenance window"
    assert all(r["actor"].startswith("command:") and len(r["actor"]) > len("command:") for r in rows)


def test_force_registers_an_unseen_service_with_new(clock, shared):
    """OP-1, OP-7: with --new, forcing a service no process has seen registers it."""
    run("baldur_force", "open", "new-service", "--ttl", "1", "--new")
    assert baldur.get_breaker("new-service").forced == "open"
    assert "new-service" in registry_module.registry.store.names()


@pytest.fixture
def configured(settings, shared):
    """Names known only through settings: 'payments' (BALDUR_SERVICES), 'orders' (BALDUR_DOMAIN_MAPPING)."""
    settings.BALDUR_SERVICES = {"payments": {"failure_threshold": 3}}
    settings.BALDUR_DOMAIN_MAPPING = {"/api/orders/": "orders"}


@pytest.mark.parametrize(
    "argv, closest",
    [
        (["open", "paymnets", "--ttl", "5"], "'payments'"),
        (["close", "ordres"], "'orders'"),
        (["open", "alpah"], "'alpha'"),
        (["release", "gamma2"], "'gamma'"),
    ],
)
def test_force_refuses_a_name_nobody_knows_naming_the_closest(
    some_breakers, configured, audit, audit_rows, argv, closest
):
    """OP-7: a name in no registry and no setting is refused with the closest known names; nothing is
    forced, registered (in this process or the shared registry) or audited."""
    store = registry_module.registry.store
    before, shared_before = registry_module.registry.names(), set(store.names())
    with pytest.raises(CommandError, match="did you mean") as caught:
        run("baldur_force", *argv)
    text = str(caught.value)
    assert closest in text and f"{argv[1]!r}" in text and "Nothing was changed" in text
    assert ("--new" in text) is (argv[0] != "release")
    assert registry_module.registry.names() == before and set(store.names()) == shared_before
    assert audit_rows() == []


def test_force_accepts_names_from_settings_and_the_shared_registry(some_breakers, configured, audit, audit_rows):
    """OP-7: a name from BALDUR_SERVICES, from BALDUR_DOMAIN_MAPPING or registered by another process
    (only in the shared registry) is forced without --new."""
    registry_module.registry.store.load("inventory")  # another process used it
    assert "inventory" not in registry_module.registry.names()
    for name in ("payments", "orders", "inventory"):
        out, _ = run("baldur_force", "open", name, "--ttl", "2")
        assert f"Forced {name!r} open" in out
    assert [r["service"] for r in audit_rows()] == ["payments", "orders", "inventory"]


def test_force_of_an_unknown_name_with_nothing_close_still_says_new(clock, shared):
    """OP-7: with no close match the refusal still names the name and --new."""
    with pytest.raises(CommandError, match=r"'zzz' is known here\. .*pass --new"):
        run("baldur_force", "open", "zzz")


def test_new_with_release_is_refused(clock, shared, audit, audit_rows):
    """OP-7: --new means nothing for a release: refused, the force stays."""
    baldur.force_open_circuit("held", ttl_minutes=5)
    with pytest.raises(CommandError, match="--new applies to 'open' and 'close' only"):
        run("baldur_force", "release", "held", "--new")
    assert baldur.get_breaker("held").forced == "open"
    assert [r["action"] for r in audit_rows()] == ["open"]


def test_release_of_an_unforced_breaker_exits_zero_and_says_so(some_breakers, shared, audit, audit_rows):
    """OP-3, OP-7: releasing an unforced breaker succeeds, says nothing changed, writes no audit row."""
    out, _ = run("baldur_force", "release", "alpha")
    assert "was not forced" in out
    assert audit_rows() == []


@pytest.mark.parametrize(
    "argv, match",
    [
        (["open", "alpha", "--ttl", "0"], "more than 0 and at most 1440"),
        (["open", "alpha", "--ttl", "-3"], "more than 0 and at most 1440"),
        (["close", "alpha", "--ttl", "1441"], "more than 0 and at most 1440"),
        (["open", "alpha", "--ttl", "ten"], "expected a number of minutes"),
        (["open", "alpha", "--ttl", "nan"], "more than 0 and at most 1440"),
        (["open", "alpha", "--ttl", "inf"], "more than 0 and at most 1440"),
        (["release", "alpha", "--ttl", "5"], "--ttl applies to 'open' and 'close' only"),
        (["open", "", "--ttl", "5"], "non-empty"),
        (["open", "alpha", "--reason", "x" * 1001], "at most 1000"),
        (["sideways", "alpha"], "invalid choice"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(some_breakers, shared, audit, audit_rows, argv, match):
    """OP-1, OP-7: bad input -> CommandError with a clear message; nothing forced, registered or audited."""
    before = registry_module.registry.names()
    with pytest.raises(CommandError, match=match):
        run("baldur_force", *argv)
    assert registry_module.registry.names() == before
    assert baldur.get_breaker("alpha").forced is None
    assert audit_rows() == []


def test_a_force_the_store_could_not_record_fails_the_command(some_breakers, shared, monkeypatch, audit, audit_rows):
    """OP-4, OP-7: a BaldurError from the store write becomes a CommandError (non-zero exit)."""

    def unavailable(*args, **kwargs):
        raise StoreError("store unreachable: connection refused")

    monkeypatch.setattr(registry_module, "force_open_circuit", unavailable)
    monkeypatch.setattr(registry_module, "release_circuit", unavailable)
    with pytest.raises(CommandError, match=r"was not stored.*store unreachable"):
        run("baldur_force", "open", "alpha", "--ttl", "5")
    with pytest.raises(CommandError, match="was not stored"):
        run("baldur_force", "release", "gamma")
    assert audit_rows() == []


# ------------------------------------------------------------------- baldur_forget
class FakeTerminal(io.StringIO):
    """Typed answers on a terminal (``isatty()`` True)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def ghost(clock, shared):
    """'paymnets': a typo forced with --new, then released (HALF_OPEN), as issue 20 found it."""
    run("baldur_force", "open", "paymnets", "--ttl", "5", "--new")
    run("baldur_force", "release", "paymnets")
    return registry_module.registry.store


def test_forget_with_yes_removes_the_ghost_and_is_audited(ghost, audit, audit_rows):
    """OP-7: baldur_forget SERVICE --yes removes the breaker from the shared record and registry and the
    status; audited as action 'forget' with source 'command'."""
    BreakerAudit.objects.all().delete()
    out, err = run("baldur_forget", "paymnets", "--yes", "--reason", "typo")
    assert "Forgot 'paymnets' (was HALF_OPEN): removed from the shared record and registry." in out and err == ""
    assert "paymnets" not in ghost.names()
    assert "paymnets" not in [b["service"] for b in json.loads(run("baldur_status", "--json")[0])["breakers"]]
    (row,) = audit_rows()
    assert (row["action"], row["service"], row["source"], row["reason"]) == ("forget", "paymnets", "command", "typo")
    assert row["actor"].startswith("command:")


def test_forget_asks_on_a_terminal(ghost, audit, audit_rows):
    """OP-7: without --yes the command asks on stderr and reads the answer: 'yes' forgets, anything else
    cancels (non-zero, nothing changed)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="cancelled: 'paymnets' was not forgotten"):
        call_command("baldur_forget", "paymnets", stdin=FakeTerminal("n\n"), stdout=out, stderr=err)
    assert "Forget circuit breaker 'paymnets'?" in err.getvalue() and "paymnets" in ghost.names()
    with pytest.raises(CommandError, match="cancelled"):
        call_command("baldur_forget", "paymnets", stdin=FakeTerminal(""), stdout=out, stderr=err)  # end of input
    call_command("baldur_forget", "paymnets", stdin=FakeTerminal("YES\n"), stdout=out, stderr=err)
    assert "Forgot 'paymnets'" in out.getvalue() and "paymnets" not in ghost.names()
    assert [r["action"] for r in audit_rows(service="paymnets")][-1] == "forget"


def test_forget_without_a_terminal_refuses_instead_of_waiting(ghost, audit, audit_rows):
    """OP-7: without --yes and with stdin not a terminal (a pipe, cron) it refuses at once, saying to pass
    --yes; nothing is read and nothing changes."""
    piped = io.StringIO("yes\n")
    with pytest.raises(CommandError, match=r"stdin is not a terminal.*Pass --yes"):
        call_command("baldur_forget", "paymnets", stdin=piped, stdout=io.StringIO(), stderr=io.StringIO())
    assert piped.tell() == 0 and "paymnets" in ghost.names()
    assert audit_rows(action="forget") == []


def test_forget_refuses_a_forced_breaker(ghost, audit, audit_rows):
    """OP-7: a forced breaker is refused with a pointer to the release; nothing changes."""
    run("baldur_force", "open", "paymnets", "--ttl", "5")
    with pytest.raises(CommandError, match=r"'paymnets' is forced open until .*release it first.*Nothing was changed"):
        run("baldur_forget", "paymnets", "--yes")
    assert ghost.inspect("paymnets").record.forced == "open"
    assert audit_rows(action="forget") == []


def test_forget_of_an_unregistered_name_names_the_closest(ghost):
    """OP-7: a name nobody registered is refused with the closest registered names."""
    with pytest.raises(CommandError, match=r"'paymnet' is known here; did you mean 'paymnets'\? Nothing was changed"):
        run("baldur_forget", "paymnet", "--yes")


def test_forget_on_the_memory_backend_says_it_acts_on_its_own_process(clock, db, audit, audit_rows):
    """OP-7: on the memory backend the command says on stderr that only its own process is concerned,
    and forgets a breaker of that process."""
    baldur.get_breaker("local")
    out, err = run("baldur_forget", "local", "--yes")
    assert "only its own process" not in out and "its own short-lived process" in err
    assert "removed from this process (memory backend)" in out
    assert "local" not in registry_module.registry.names()


# ------------------------------------------------------------- as real processes
@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A settings module on a file SQLite database, migrated, for commands run as subprocesses."""
    root = tmp_path_factory.mktemp("opproj")
    (root / "op_settings.py").write_text(
        "from tests.settings import *  # noqa: F401,F403\n"
        f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(root / 'db.sqlite3')!r}}}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env.update(
        DJANGO_SETTINGS_MODULE="op_settings",
        PYTHONPATH=os.pathsep.join([str(REPO), str(root)]),
        LC_ALL="C",
        LANG="C",
        PYTHONIOENCODING="ascii",  # the commands must still print UTF-8
        PYTHONUTF8="0",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return root, env


def manage(project, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    _root, env = project
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env={**env, **extra_env}, capture_output=True, timeout=120
    )


def audit_in(project) -> list[tuple]:
    root, _env = project
    with sqlite3.connect(root / "db.sqlite3") as db:
        return db.execute(
            "select service, action, source, ttl_minutes, reason from baldur_django_breakeraudit order by id"
        ).fetchall()


@pytest.mark.multiprocess
def test_process_status_json_and_memory_notice(project):
    """OP-7: as a process, --json stdout is exactly one JSON document; the memory notice is on stderr; exit 0."""
    done = manage(project, "baldur_status", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout.decode("utf-8"))
    assert document == {"backend": "memory", "shared": False, "scope": document["scope"], "breakers": []}
    assert b"only its own process" in done.stderr


@pytest.mark.multiprocess
def test_process_output_is_utf8_whatever_the_locale(project):
    """OP-7: under LC_ALL=C and an ASCII PYTHONIOENCODING the output is still UTF-8 text, not an error."""
    name = "zahlungs-dienst-äöü-支払い"
    done = manage(project, "baldur_status", "--config", BALDUR_DOMAIN_DEFAULT=name)
    assert done.returncode == 0, done.stderr
    line = next(row for row in done.stdout.decode("utf-8").splitlines() if row.startswith("BALDUR_DOMAIN_DEFAULT"))
    assert f'"{name}"' in line and line.split()[-1] == "env"
    done = manage(project, "baldur_status", "--config", "--json", BALDUR_DOMAIN_DEFAULT=name)
    assert done.returncode == 0
    assert {r["name"]: r["value"] for r in json.loads(done.stdout.decode("utf-8"))["settings"]}[
        "BALDUR_DOMAIN_DEFAULT"
    ] == name


@pytest.mark.multiprocess
def test_process_unknown_service_exits_non_zero(project):
    """OP-7: an unknown --service exits non-zero with a message naming it."""
    done = manage(project, "baldur_status", "--service", "nope")
    assert done.returncode != 0
    assert b"'nope'" in done.stderr and done.stdout == b""


@pytest.mark.multiprocess
def test_process_force_refused_on_memory(project):
    """OP-7: baldur_force on the memory backend exits non-zero, explains why, and writes nothing."""
    before = audit_in(project)
    done = manage(project, "baldur_force", "open", "payments", "--ttl", "5")
    assert done.returncode != 0
    assert b"cannot reach the" in done.stderr and b"running workers" in done.stderr
    assert audit_in(project) == before


@pytest.mark.multiprocess
def test_process_force_on_a_shared_backend_reaches_other_processes(project):
    """OP-1, OP-4, OP-7: with the database backend, bad input exits non-zero and writes nothing; a force made by
    one process is seen by the next; releasing an unforced breaker exits 0 and says so."""
    shared = {"BALDUR_STATE_BACKEND": "database"}
    done = manage(project, "baldur_force", "open", "proc-payments", "--ttl", "0", **shared)
    assert done.returncode != 0 and b"--ttl" in done.stderr
    done = manage(project, "baldur_status", "--json", "--service", "proc-payments", **shared)
    assert done.returncode != 0 and b"'proc-payments'" in done.stderr  # nothing was registered
    done = manage(project, "baldur_force", "open", "proc-payments", "--ttl", "7.5", **shared)
    assert done.returncode == 1 and b"--new" in done.stderr  # a name nobody knows yet (OP-7)
    done = manage(
        project, "baldur_force", "open", "proc-payments", "--ttl", "7.5", "--reason", "wartung ä", "--new", **shared
    )
    assert done.returncode == 0, done.stderr
    assert "Forced 'proc-payments' open for 7.5 minutes" in done.stdout.decode("utf-8")
    done = manage(project, "baldur_status", "--json", **shared)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout.decode("utf-8"))
    assert document["shared"] is True and done.stderr.count(b"only its own process") == 0
    (row,) = [b for b in document["breakers"] if b["service"] == "proc-payments"]
    assert (row["state"], row["forced"], row["force_reason"]) == ("open", "open", "wartung ä")
    done = manage(project, "baldur_force", "open", "proc-paymnets", "--ttl", "5", **shared)
    assert done.returncode == 1 and done.stdout == b""
    assert b"did you mean 'proc-payments'?" in done.stderr
    done = manage(project, "baldur_force", "release", "proc-payments", **shared)
    assert done.returncode == 0 and b"Released 'proc-payments'" in done.stdout, done.stderr
    done = manage(project, "baldur_force", "release", "proc-payments", **shared)
    assert done.returncode == 0, done.stderr
    assert b"was not forced" in done.stdout
    done = manage(project, "baldur_status", "--json", **shared)
    assert [b["service"] for b in json.loads(done.stdout)["breakers"] if "paymnets" in b["service"]] == []


@pytest.mark.multiprocess
def test_process_forget(project):
    """OP-7: as processes on the database backend: without --yes and with no terminal on stdin,
    baldur_forget exits 1 at once saying to pass --yes; on a real terminal (a pty) answering 'yes'
    removes the ghost for every later process, audited."""
    shared = {"BALDUR_STATE_BACKEND": "database"}
    assert manage(project, "baldur_force", "close", "proc-ghost", "--ttl", "1", "--new", **shared).returncode == 0
    assert manage(project, "baldur_force", "release", "proc-ghost", **shared).returncode == 0
    _root, env = project
    done = subprocess.run(
        [sys.executable, "manage.py", "baldur_forget", "proc-ghost"],
        cwd=REPO,
        env={**env, **shared},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 1 and b"stdin is not a terminal" in done.stderr and b"--yes" in done.stderr
    import pty

    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"yes\n")  # typed ahead; the command reads it after its question
        done = subprocess.run(
            [sys.executable, "manage.py", "baldur_forget", "proc-ghost"],
            cwd=REPO,
            env={**env, **shared},
            stdin=terminal,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 0, done.stderr
    assert b"Forget circuit breaker 'proc-ghost'?" in done.stderr and b"Forgot 'proc-ghost'" in done.stdout
    done = manage(project, "baldur_status", "--json", **shared)
    assert "proc-ghost" not in [b["service"] for b in json.loads(done.stdout)["breakers"]]
    assert audit_in(project)[-1][:3] == ("proc-ghost", "forget", "command")


@pytest.mark.multiprocess
def test_process_every_command_says_to_migrate_first(tmp_path):
    """OP-7: on a fresh SQLite database (``migrate`` never ran) every operator command, on the memory and
    on the database backend, exits 1 and says to run ``manage.py migrate`` first; nothing is created."""
    (tmp_path / "fresh_settings.py").write_text(
        "from tests.settings import *  # noqa: F401,F403\n"
        f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(tmp_path / 'db.sqlite3')!r}}}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_") or k == "BALDUR_EMERGENCY_STATE_FILE"}
    env.update(DJANGO_SETTINGS_MODULE="fresh_settings", PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]))
    commands = [
        (["baldur_status"], "memory"),
        (["baldur_status", "--json"], "database"),
        (["baldur_force", "open", "payments", "--ttl", "5", "--new"], "database"),
        (["baldur_forget", "payments", "--yes"], "database"),
        (["baldur_emergency", "status"], "memory"),
        (["baldur_emergency", "set", "1"], "memory"),
    ]
    running = [
        subprocess.Popen(
            [sys.executable, "manage.py", *argv],
            cwd=REPO,
            env={**env, "BALDUR_STATE_BACKEND": backend},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv, backend in commands
    ]
    for (argv, _backend), process in zip(commands, running, strict=True):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 1, (argv, err)
        assert b"Run `python manage.py migrate` first" in err and b"Traceback" not in err, (argv, err)
        assert out == b"", argv
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
    assert not {t for t in tables if t.startswith("baldur_django_")}
    assert not Path(env["BALDUR_EMERGENCY_STATE_FILE"]).exists()  # the level was not set


def test_missing_tables_are_reported_per_database(db):
    """OP-7: with the test database migrated nothing is missing; with the audit table gone (dropped
    inside this test's transaction) require_migrated names it and says to run migrate."""
    from django.db import connection

    from baldur_django import services

    assert services.missing_tables() == {}
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE "{BreakerAudit._meta.db_table}"')
    with pytest.raises(services.NotMigratedError, match=r"baldur_django_breakeraudit.*manage\.py migrate") as info:
        services.require_migrated()
    assert info.value.missing == {"default": [BreakerAudit._meta.db_table]}
    with pytest.raises(CommandError, match=r"Run `python manage\.py migrate` first"):
        run("baldur_status")


@pytest.mark.multiprocess
def test_process_force_is_audited(project):
    """OP-6, OP-7: a force from the command, in its own process, writes its audit row (source 'command').

    Needs ``services.install_audit_listener()`` in ``BaldurDjangoConfig.ready()``."""
    before = len(audit_in(project))
    done = manage(
        project,
        "baldur_force",
        "close",
        "proc-audited",
        "--ttl",
        "3",
        "--reason",
        "audit me",
        "--new",
        BALDUR_STATE_BACKEND="database",
    )
    assert done.returncode == 0, done.stderr
    assert audit_in(project)[before:] == [("proc-audited", "close", "command", 3.0, "audit me")]


# ------------------------------------------- --json with LOGGING sending baldur to stdout
LOGGING_TO_STDOUT = """
from tests.settings import *  # noqa: F401,F403
import os

LOGGING_CONFIG = "logging.config.dictConfig"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "LOG %(name)s %(levelname)s %(message)s"}},
    "handlers": {"out": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout", "formatter": "plain"}},
    "loggers": {"baldur": {"handlers": ["out"], "level": "DEBUG", "propagate": False}},
}
BALDUR_STATE_BACKEND = "redis"
BALDUR_REDIS_URL = os.environ["OP7_REDIS_URL"]
BALDUR_REDIS_SOCKET_TIMEOUT = 0.5
"""


@pytest.fixture(scope="module")
def logging_project(tmp_path_factory, project):
    """A settings module whose LOGGING sends ``baldur`` (DEBUG and up) to stdout, on the Redis
    backend pointed at a closed local port (nothing listens: the store is down); its database
    is the migrated one of ``project``."""
    import socket

    root = tmp_path_factory.mktemp("op7log")
    database = project[0] / "db.sqlite3"
    (root / "op7_settings.py").write_text(
        LOGGING_TO_STDOUT
        + f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(database)!r}}}}}\n"
    )
    with socket.socket() as sock:  # a port nothing listens on once this socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env.update(
        DJANGO_SETTINGS_MODULE="op7_settings",
        PYTHONPATH=os.pathsep.join([str(REPO), str(root)]),
        OP7_REDIS_URL=f"redis://127.0.0.1:{port}/12",
        LC_ALL="C",
        LANG="C",
        PYTHONIOENCODING="ascii",
        PYTHONUTF8="0",
    )
    return root, env


@pytest.mark.multiprocess
def test_process_status_json_stdout_is_clean_when_logging_sends_baldur_to_stdout(logging_project):
    """OP-7: a project whose LOGGING sends ``baldur`` to stdout, the Redis store down (a closed
    port), LC_ALL=C: ``baldur_status --json`` exits 0, stdout is exactly one JSON document, and the
    command's notice that the shared registry could not be read is on stderr, written by the command."""
    sanity = manage(logging_project, "shell", "-c", "import logging; logging.getLogger('baldur.x').warning('routed')")
    assert sanity.returncode == 0, sanity.stderr
    assert b"LOG baldur.x WARNING routed" in sanity.stdout  # this LOGGING really writes baldur to stdout

    done = manage(logging_project, "baldur_status", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout.decode("utf-8"))
    assert document == {"backend": "redis", "shared": True, "scope": "shared store", "breakers": []}
    assert b"status_store_unavailable" in done.stderr and b"LOG " not in done.stderr

    done = manage(logging_project, "baldur_status", "--json", "--service", "nope")
    assert done.returncode != 0 and done.stdout == b""
    assert b"'nope'" in done.stderr

    done = manage(logging_project, "baldur_status", "--config", "--json")
    assert done.returncode == 0, done.stderr
    assert {row["name"] for row in json.loads(done.stdout.decode("utf-8"))["settings"]} >= {"BALDUR_STATE_BACKEND"}
