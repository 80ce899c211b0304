"""``manage.py baldur_emergency`` and the level in ``baldur_status`` (EM-1, EM-3, OP-7), in process and
as real processes (exit codes, ``--json``, LC_ALL=C)."""

from __future__ import annotations

import json

import pytest
from django.core.management.base import CommandError

from baldur_django.core import emergency
from baldur_django.models import BreakerAudit
from tests.operator.test_commands import audit_in, manage, project, run  # noqa: F401 - the fixture is used

pytestmark = pytest.mark.django_db


def test_em1_status_set_and_step_down_in_process(emergency_state_file, audit, audit_rows):
    """EM-1/EM-3: status shows the level; set writes it (audited, source command); step-down keeps
    the expiry; at 0 step-down exits normally and says nothing changed."""
    out, _err = run("baldur_emergency", "status")
    assert out.splitlines()[0] == "emergency level 0 (normal operation)."
    out, _err = run("baldur_emergency", "set", "3", "--minutes", "15", "--reason", "db down")
    assert out.startswith("Emergency level 3 until ") and "(was 0)" in out
    assert emergency.current_level() == 3
    out, _err = run("baldur_emergency", "status", "--json")
    document = json.loads(out)
    assert (document["level"], document["reason"], document["source"], document["backend"]) == (
        3,
        "db down",
        "manual",
        "file",
    )
    assert document["actor"].startswith("command:")
    expires = document["expires_at"]
    out, _err = run("baldur_emergency", "step-down")
    assert out.startswith("Emergency level 3 -> 2 (expiry kept")
    assert emergency.status()["expires_at"] == expires
    run("baldur_emergency", "step-down")
    run("baldur_emergency", "step-down")
    out, _err = run("baldur_emergency", "step-down")
    assert "nothing to step down" in out
    rows = audit_rows()
    assert [(r["action"], r["source"], r["from_state"], r["to_state"]) for r in rows] == [
        ("level_set", "command", "level 0", "level 3"),
        ("level_step_down", "command", "level 3", "level 2"),
        ("level_step_down", "command", "level 2", "level 1"),
        ("level_step_down", "command", "level 1", "level 0"),
    ]
    assert rows[0]["ttl_minutes"] == 15.0 and rows[0]["reason"] == "db down" and rows[0]["service"] == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["set", "4"], "LEVEL '4'"),
        (["set", "three"], "LEVEL 'three'"),
        (["set", "2.0"], "LEVEL '2.0'"),
        (["set", "3", "--minutes", "0"], "--minutes '0'"),
        (["set", "3", "--minutes", "1441"], "--minutes '1441'"),
        (["set", "3", "--minutes", "soon"], "--minutes 'soon'"),
        (["set", "3", "--reason", "x" * 1001], "--reason"),
    ],
)
def test_em1_bad_input_is_an_error_and_writes_nothing(args, message, emergency_state_file):
    """EM-1/OP-7: bad input is a CommandError naming what was wrong; nothing is written."""
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        run("baldur_emergency", *args)
    assert not emergency_state_file.exists()


def test_em1_a_level_that_cannot_be_stored_is_an_error(tmp_path, monkeypatch):
    """EM-1/OP-7: the state file's directory is missing: set exits non-zero saying it was not stored."""
    monkeypatch.setenv("BALDUR_EMERGENCY_STATE_FILE", str(tmp_path / "missing" / "level.json"))
    emergency.mode.source.reset()
    with pytest.raises(CommandError, match="not stored"):
        run("baldur_emergency", "set", "3")
    assert BaldurAuditCount() == 0


def BaldurAuditCount() -> int:  # noqa: N802 - reads like a value
    return BreakerAudit.objects.count()


def test_em1_corrupt_state_status_is_an_error(emergency_state_file):
    """EM-1/OP-7: an unreadable state makes status exit non-zero with the reason, not a traceback."""
    emergency_state_file.write_text("{torn")
    with pytest.raises(CommandError, match="could not be read"):
        run("baldur_emergency", "status", "--json")


def test_em1_baldur_status_shows_the_level_when_not_zero(emergency_state_file):
    """EM-1/OP-7: baldur_status shows nothing extra at level 0, and the level with its expiry otherwise."""
    out, _err = run("baldur_status")
    assert "mergency" not in out
    assert "emergency" not in json.loads(run("baldur_status", "--json")[0])
    emergency.set_level(2, minutes=30, reason="search flaky", actor="alice")
    out, _err = run("baldur_status")
    last = out.splitlines()[-1]
    assert last.startswith("Emergency level 2 (") and "until " in last and "alice" in last and "search flaky" in last
    document = json.loads(run("baldur_status", "--json")[0])
    assert document["emergency"]["level"] == 2 and document["emergency"]["actor"] == "alice"


# ------------------------------------------------------------- as real processes
@pytest.mark.multiprocess
def test_em1_commands_as_processes_under_lc_all_c(project, tmp_path):  # noqa: F811 - the imported fixture
    """EM-1/EM-3/OP-7: as real processes under LC_ALL=C: set/step-down exit 0 and are audited with
    source command; --json stdout is exactly one document (UTF-8 reason intact); bad input exits
    non-zero and changes nothing; a second process sees what the first one set."""
    state = {"BALDUR_EMERGENCY_STATE_FILE": str(tmp_path / "level.json")}
    before = len(audit_in(project))
    done = manage(project, "baldur_emergency", "set", "3", "--minutes", "5", "--reason", "wartung ä 支払い", **state)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("utf-8").startswith("Emergency level 3 until "), done.stderr
    done = manage(project, "baldur_emergency", "status", "--json", **state)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout.decode("utf-8"))
    assert document["level"] == 3 and document["reason"] == "wartung ä 支払い" and document["frozen"] is True
    done = manage(project, "baldur_emergency", "set", "5", **state)
    assert done.returncode != 0 and b"LEVEL '5'" in done.stderr and done.stdout == b""
    done = manage(project, "baldur_emergency", "set", "1", "--minutes", "-3", **state)
    assert done.returncode != 0 and b"--minutes" in done.stderr
    done = manage(project, "baldur_emergency", "step-down", **state)
    assert done.returncode == 0 and b"3 -> 2" in done.stdout
    done = manage(project, "baldur_emergency", "status", **state)
    assert done.returncode == 0 and done.stdout.decode("utf-8").startswith("emergency level 2")
    done = manage(project, "baldur_status", "--json", **state)
    assert done.returncode == 0 and json.loads(done.stdout.decode("utf-8"))["emergency"]["level"] == 2
    done = manage(project, "baldur_emergency", **state)
    assert done.returncode != 0  # no subcommand: argparse's usage error
    assert [(r[1], r[2], r[4]) for r in audit_in(project)[before:]] == [
        ("level_set", "command", "wartung ä 支払い"),
        ("level_step_down", "command", ""),
    ]


@pytest.mark.multiprocess
def test_em1_json_stays_clean_when_logging_goes_to_stdout(project, tmp_path):  # noqa: F811
    """OP-7: a project whose LOGGING sends 'baldur' to stdout still gets only JSON from status --json,
    and the scope notice (file backend with a shared breaker store) is on stderr."""
    root, _env = project
    (root / "op_logging_settings.py").write_text(
        "from op_settings import *  # noqa: F401,F403\n"
        "LOGGING_CONFIG = 'logging.config.dictConfig'\n"
        "LOGGING = {'version': 1, 'handlers': {'out': {'class': 'logging.StreamHandler', 'stream': 'ext://sys.stdout'}},"
        " 'loggers': {'baldur': {'handlers': ['out'], 'level': 'DEBUG'}}}\n"
        "BALDUR_STATE_BACKEND = 'database'\n"
    )
    state = {
        "BALDUR_EMERGENCY_STATE_FILE": str(tmp_path / "level.json"),
        "DJANGO_SETTINGS_MODULE": "op_logging_settings",
    }
    assert manage(project, "baldur_emergency", "set", "2", "--minutes", "5", **state).returncode == 0
    done = manage(project, "baldur_emergency", "status", "--json", **state)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode("utf-8"))["level"] == 2
    assert b"kept on this host only" in done.stderr
