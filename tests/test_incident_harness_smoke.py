"""Smoke test of the incident rehearsal's plumbing (``python -m benchmarks --incident``).

The scenarios themselves take minutes and are not run here (their figures are in
docs/incident.md). This starts what every scenario starts (a redis-server of its own, the
fake upstream, the incident site under gunicorn with one worker), asks the health view and
the name check once, and checks that every process it started is gone afterwards.
"""

from __future__ import annotations

import shutil

import gunicorn  # noqa: F401  (in the dev extra: a missing one fails the file, never skips it)
import pytest

pytestmark = pytest.mark.multiprocess

if shutil.which("redis-server") is None:  # pragma: no cover - the dev machine has one
    pytest.skip("needs redis-server", allow_module_level=True)

from benchmarks.incident import SCENARIOS, environment, main  # noqa: E402


def test_cb12_hc5_incident_site_answers_health_and_refuses_a_newline_name_then_everything_stops():
    """HC-5, CB-12 (issue 27 harness): the site serves the health view from its worker and
    refuses a name with a newline; the server, upstream and Redis it started are gone after."""
    with environment({}, "gunicorn", 1) as (site, server):
        health = server.get("/health/")
        assert (health.status, health.json()["status"]) == (200, "ok")
        assert health.pid in server.pids
        refused = server.get(
            "/names",
            method="POST",
            body="via=protect&name=up%0Acircuit_breaker.closed",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        ).json()
        assert refused["refused"] is True
        processes = [server.process, site.upstream.process, site.redis.process]
    assert all(process is not None and process.poll() is not None for process in processes)


def test_incident_cli_names_every_scenario_and_refuses_an_unknown_one(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["no-such-scenario"])
    assert exited.value.code == 2
    assert set(SCENARIOS) == {"level", "hung-store", "hosts", "hosts-uncapped", "empty-store", "trial-kill", "names"}
    assert "unknown scenario" in capsys.readouterr().err
