"""End to end: the short scripted demo (``python -m testproject.demo --short``) with its
real server processes (the payments stand-in, two carriers and three shop servers), judged from the JSON
summary and the timeline picture it writes.

The demo runs once per module (about 45 s); each test checks one claim."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from testproject.timeline import BAND_STATES, OUTCOMES

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    summary_path = out / "summary.json"
    env = dict(os.environ)
    env.pop("TESTPROJECT_DB", None)  # the demo keeps its own throwaway database in --out-dir
    env.pop("PAYMENTS_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest's tests.settings is not the demo's
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "testproject.demo",
            "--short",
            "--no-color",
            "--json-summary",
            str(summary_path),
            "--out-dir",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,  # a bound for a loaded machine; the run itself takes about 45 s
    )
    assert summary_path.exists(), f"no summary written; rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    summary = json.loads(summary_path.read_text())
    assert "phases" in summary, f"the demo did not get to run its phases:\n{result.stdout}\n{result.stderr}"
    return result, summary


def test_demo_exits_zero_and_reports_no_problem(demo_run):
    """The demo's own verdict: every expectation held (exit status 0)."""
    result, summary = demo_run
    assert summary["problems"] == [], result.stdout
    assert summary["ok"] is True
    assert result.returncode == 0, result.stdout + result.stderr


def test_cb2_cb5_cb6_transitions_closed_open_half_open_closed(demo_run):
    """CB-2, CB-5, CB-6: the breaker went CLOSED -> OPEN (consecutive failures), then
    OPEN -> HALF_OPEN (recovery timeout), then HALF_OPEN -> CLOSED (probes succeeded),
    in that order; every transition starts where the previous one ended."""
    _, summary = demo_run
    transitions = summary["transitions"]
    assert transitions, "no transition was observed"
    first = transitions[0]
    assert (first["from"], first["to"], first["trigger"]) == ("closed", "open", "consecutive_failures")
    # up to the operator's phases the server decided every transition itself, so the chain
    # is unbroken (the force and the release are published by the command's own process)
    automatic = [step for key in ("healthy", "failing", "recovering") for step in summary["phases"][key]["transitions"]]
    for before, after in itertools.pairwise(automatic):
        assert before.split("->")[1] == after.split("->")[0], automatic
    wanted = [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    found = 0
    for t in transitions:
        if found < len(wanted) and (t["from"], t["to"]) == wanted[found]:
            found += 1
    assert found == len(wanted), transitions
    closing = [t for t in transitions if (t["from"], t["to"]) == ("half_open", "closed")]
    assert closing[0]["trigger"] == "half_open_success"


def test_cb4_open_breaker_spares_the_upstream(demo_run):
    """CB-4, FAC-4: while the upstream failed, it counted fewer requests than were sent
    (the open breaker rejected the rest fast) and every request got the fallback."""
    _, summary = demo_run
    failing = summary["phases"]["failing"]
    assert failing["upstream_counted"] < failing["sent"]
    assert failing["rejected_fast"] > 0
    assert failing["upstream_counted"] + failing["rejected_fast"] == failing["sent"]
    assert failing["fallback"] == failing["sent"]
    assert failing["errors"] == 0
    # the server's own count of rejections (call_rejected signals) matches the responses
    assert summary["totals"]["server_rejections"] == summary["totals"]["rejected_fast"]
    assert summary["totals"]["fallbacks"] > 0


def test_cb1_healthy_phase_is_all_paid(demo_run):
    """CB-1: with a healthy upstream every request went through and was paid."""
    _, summary = demo_run
    healthy = summary["phases"]["healthy"]
    assert healthy["ok"] == healthy["sent"] == healthy["upstream_counted"] > 0


def test_cb4_breaker_keeps_latency_low_while_upstream_hangs(demo_run):
    """CB-4: while the upstream hangs, the median latency with the breaker is below the
    median without it (the unprotected view waits out the client timeout every time)."""
    _, summary = demo_run
    protected = summary["hang_median_ms"]["protected"]
    unprotected = summary["hang_median_ms"]["unprotected"]
    assert protected < unprotected
    hang_off = summary["phases"]["hang_unprotected"]
    assert hang_off["errors"] == hang_off["sent"] == hang_off["upstream_counted"]
    hang_on = summary["phases"]["hang_protected"]
    assert "closed->open" in hang_on["transitions"]
    assert hang_on["upstream_counted"] < hang_on["sent"]


def test_cb13_server_logs_breaker_lines_on_stderr(demo_run):
    """CB-13: the server's stderr carries ``circuit_breaker.opened`` / ``.closed`` lines
    from logger ``baldur.circuit_breaker``; the HALF_OPEN step is not logged (CB-5)."""
    _, summary = demo_run
    lines = summary["log_lines"]
    assert any("circuit_breaker.opened service=payments" in line for line in lines)
    assert any("circuit_breaker.closed service=payments" in line for line in lines)
    assert not any("half_opened" in line for line in lines)


def test_plain_output_when_not_a_terminal(demo_run):
    """Off a TTY with --no-color: no carriage-return updates, no ANSI escapes, a summary table."""
    result, _ = demo_run
    assert "\r" not in result.stdout
    assert "\x1b[" not in result.stdout
    assert "Summary" in result.stdout
    assert "CLOSED -> OPEN" in result.stdout


def test_op4_operator_force_from_another_process_reaches_the_server(demo_run):
    """OP-4, ST-2, OP-3: `manage.py baldur_force open payments` in a separate process is
    obeyed by the running server (shared database store): while forced, every request gets
    the fallback and the upstream counts none of them; after `release` the server probes
    and closes through HALF_OPEN."""
    _, summary = demo_run
    forced = summary["phases"]["operator_forced"]
    assert forced["sent"] > 0
    assert forced["upstream_counted"] == 0
    assert forced["fallback"] == forced["rejected_fast"] == forced["sent"]
    released = summary["phases"]["operator_released"]
    assert "half_open->closed" in released["transitions"]
    assert released["ok"] > 0


def test_st2_fleet_of_two_sends_half_open_max_calls_trial_calls_in_all(demo_run):
    """ST-2, CB-6: two shop server processes share the breaker through the database store.
    While HALF_OPEN each gets more requests than ``half_open_max_calls``, yet the upstream's
    own counter saw exactly ``half_open_max_calls`` trial calls from the whole fleet (a
    per-worker allowance would have let that many through per server); every other request
    was refused with reason ``half_open_full``; the trial calls closed the breaker and both
    servers then served normally."""
    _, summary = demo_run
    max_calls = summary["config"]["half_open_max_calls"]
    fleet = summary["phases"]["fleet"]["fleet"]
    assert fleet["servers"] == 2
    assert all(sent > max_calls for sent in fleet["burst_sent_by_server"].values()), fleet
    assert fleet["burst_upstream"] == max_calls, fleet
    assert sum(fleet["trial_calls_by_server"].values()) == max_calls
    assert fleet["burst_paid"] == max_calls
    assert fleet["burst_rejected"] == fleet["burst_sent"] - max_calls
    assert fleet["rejection_reasons"] == ["half_open_full"]
    assert "half_open->closed" in summary["phases"]["fleet"]["transitions"]
    assert fleet["states_after"] == {"A": "closed", "B": "closed"}
    assert fleet["after_paid"] == fleet["after_sent"] > 0
    assert {t["server"] for t in summary["transitions"]} >= {"A", "operator"}


def test_timeline_picture_is_written_and_shows_the_run(demo_run):
    """The demo ends by drawing ``timeline.png`` in its output directory and printing its
    path: a real PNG of a sensible size, whose pixels carry the band's colours for every
    state the run went through (CLOSED, OPEN, HALF_OPEN, forced OPEN, FROZEN) and the bars'
    colours for the three outcomes; the frozen span lies inside the Emergency Mode phases
    (from the Level 3 phase into the step-down phase), between an OPEN and an OPEN."""
    from PIL import Image

    result, summary = demo_run
    path = Path(summary["timeline_png"])
    assert path.name == "timeline.png" and path.exists()
    assert f"timeline of the run: {path}" in result.stdout
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000
    with Image.open(path) as image:
        assert image.size[0] >= 1200 and image.size[1] >= 700
        pixels = Counter({colour: count for count, colour in image.convert("RGB").getcolors(maxcolors=1 << 24)})
    assert len(pixels) > 50  # a picture, not a blank canvas

    def rgb(colour: str) -> tuple[int, int, int]:
        return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))

    for state in ("closed", "open", "half_open", "forced_open", "frozen"):
        assert pixels[rgb(BAND_STATES[state][1])] > 200, f"no {state} in the band"
    for outcome in ("paid", "failed", "rejected"):
        assert pixels[rgb(OUTCOMES[outcome][1])] > 200, f"no {outcome} bars"
    timeline = summary["timeline"]
    assert len(timeline["phases"]) == 15
    states = sorted(timeline["states"], key=lambda s: s["t"])
    assert [s["state"] for s in states][:2] == ["closed", "open"]
    assert "forced_open" in [s["state"] for s in states]
    names = [s["state"] for s in states]
    assert names.count("frozen") == 1
    frozen = names.index("frozen")
    assert names[frozen - 1] == "open" and names[frozen + 1] == "open", names
    level3, step_down = timeline["phases"][5], timeline["phases"][6]
    assert "Level 3" in level3["title"] and "steps the level down" in step_down["title"]
    assert level3["start"] < states[frozen]["t"] < level3["end"] < states[frozen + 1]["t"] < step_down["end"]
    # every request to a shop, but in the per-host phase each call the shop made to a carrier
    per_host = summary["phases"]["per_host"]["sent"]
    assert len([r for r in timeline["requests"] if "host" not in r]) == summary["totals"]["sent"] - per_host
    assert len([r for r in timeline["requests"] if "host" in r]) == 2 * per_host
    # one clock with the console (phase 1 starts once the servers answer, not at 0), no band
    # for the view without a breaker, and the five operator commands drawn where they ran
    assert timeline["phases"][0]["start"] > 0.5
    assert [p["key"] for p in timeline["phases"] if not p["breaker"]] == ["hang_unprotected"]
    assert [c["text"].split()[1] for c in timeline["commands"]] == ["baldur_force"] * 2 + ["baldur_emergency"] * 3
    assert all(
        p["start"] <= c["start"] < c["end"] <= p["end"] + 0.01
        for c in timeline["commands"]
        for p in [next(p for p in timeline["phases"] if p["start"] <= c["start"] <= p["end"])]
    )


def test_em2_em3_level_3_from_another_process_holds_the_breaker_then_step_down_recovers(demo_run):
    """EM-1, EM-2, EM-3: with the upstream down and the breaker OPEN, `manage.py
    baldur_emergency set 3` in another process reaches the running server through the shared
    level file; past its recovery timeout the breaker is held OPEN and the server rejects
    with reason ``frozen`` (its own count), every request gets the fallback, and the
    upstream's own counter saw no call during the freeze, not even once it was healthy
    again. After one step-down (level 2) the breaker probes and closes, with no more
    ``frozen`` rejections, and `set 0` brings the server back to level 0."""
    _, summary = demo_run
    phase = summary["phases"]["emergency"]
    freeze = phase["emergency"]
    assert freeze["tripped"] is True and freeze["level_seen"] == 3
    assert "closed->open" in phase["transitions"]
    assert freeze["frozen_rejections"] >= 4  # --short asks for 4 before the upstream recovers
    assert phase["server_rejections_by_reason"]["frozen"] == freeze["frozen_rejections"]
    assert freeze["upstream_during_freeze"] == 0
    assert freeze["sent_while_upstream_healthy"] > 0
    assert freeze["states_during_freeze"] and set(freeze["states_during_freeze"]) == {"open"}
    assert freeze["held_open_seconds"] > freeze["recovery_timeout"] == summary["config"]["recovery_timeout"]
    assert phase["fallback"] == phase["sent"] and phase["errors"] == 0 and phase["ok"] == 0
    # the failures of the trip are all the upstream saw in this phase
    assert phase["upstream_counted"] == summary["config"]["failure_threshold"]
    assert [c["args"][:2] for c in summary["emergency_commands"]] == [["set", "3"], ["step-down"], ["set", "0"]]
    assert all(c["status"] == 0 for c in summary["emergency_commands"])
    step_down = summary["phases"]["emergency_step_down"]
    assert step_down["emergency"] == {"level_after_step_down": 2, "level_at_end": 0}
    assert "open->half_open" in step_down["transitions"] and "half_open->closed" in step_down["transitions"]
    assert "frozen" not in step_down["server_rejections_by_reason"]
    assert step_down["ok"] > 0 and step_down["errors"] == 0


def test_hc1_one_failing_carrier_trips_only_its_own_host_breaker(demo_run):
    """HC-1: the shop reaches its two carriers (two stand-in servers, two ports) through one
    ``BreakerAdapter()`` with no service name. The shop's answers and its ``/breakers/``
    name two breakers after the hosts ("127.0.0.1:PORT"): the failing carrier's is OPEN,
    the healthy one's CLOSED. The failing carrier's own counter stops at the failures that
    opened its breaker (no call reached it while OPEN, though requests kept coming), and the
    healthy carrier counted and answered every quote request. The phase is in the summary,
    the console and the picture (its own panel, one strip per host breaker)."""
    result, summary = demo_run
    phase = summary["phases"]["per_host"]
    f = phase["per_host"]
    bad, good = f["failing"], f["healthy"]
    hosts = f["breakers"]
    assert len(set(hosts.values())) == 2
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", host) for host in hosts.values()), hosts
    assert sorted(f["breakers_reported"]) == sorted(hosts.values())
    assert f["states_after"] == {bad: "open", good: "closed"}
    assert f["config"]["failure_threshold"] == 5  # the package default: nothing configured per host
    # the failing host: bounded by its breaker
    assert f["failing_counted_when_open"] == f["config"]["failure_threshold"]
    assert f["sent_while_open"] > 0 and f["failing_counted_while_open"] == 0
    assert f["upstream_counted"][bad] == f["config"]["failure_threshold"] < phase["sent"]
    assert f["calls"][bad]["rejected"] == phase["sent"] - f["upstream_counted"][bad] == phase["rejected_fast"]
    assert [t["to"] for t in f["transitions"][bad]][:1] == ["open"] and not f["transitions"][good]
    # the healthy host: every call went through and was answered
    assert f["calls"][good] == {"quoted": phase["sent"], "failed": 0, "rejected": 0, "error": 0}
    assert f["upstream_counted"][good] == phase["sent"]
    assert phase["ok"] == phase["sent"] and phase["errors"] == 0
    assert phase["server_rejections"] == phase["rejected_fast"]
    # the console names both breakers by host, with their states
    line = next(line for line in result.stdout.splitlines() if "lists one breaker per host" in line)
    assert f"{hosts[bad]} ({bad}) OPEN" in line and f"{hosts[good]} ({good}) CLOSED" in line
    assert f"breaker {hosts[bad]}: CLOSED -> OPEN  (consecutive_failures)" in result.stdout
    # the picture: its own panel, named in words, one band per host breaker
    shown = next(p for p in summary["timeline"]["phases"] if p["key"] == "per_host")
    assert "breaker per host" in shown["title"]
    assert [b["name"] for b in shown["bands"]] == [f"{hosts[bad]} ({bad})", f"{hosts[good]} ({good})"]
    assert phase["seconds"] < 10


def test_rs2_rs3_a_429_holds_web_requests_until_a_deadline_and_the_gate_stop_it(demo_run):
    """Issue 28 item 10, RS-2, RS-3: the rates API answers 429 with Retry-After. With the
    docs' retry example the retried requests are held for the cooldowns (at least the
    Retry-After) and the call site without retry keeps calling during the quiet; with a
    request deadline and honor_retry_after no request is held past its deadline, every one
    is answered by the fallback, and one call of the fleet reaches the provider within its
    Retry-After (the database store keeps the gate for the fleet; a shop that read the store
    just before the gate closed may make one of its own, never more)."""
    _result, summary = demo_run
    before = summary["phases"]["retry_after_docs"]["stages"]
    after = summary["phases"]["retry_after_guarded"]["stages"]
    retry_after, deadline = before["retry_after"], after["deadline"]
    for shop in ("A", "B"):
        b, a = before["shops"][shop], after["shops"][shop]
        assert b["held_max_by_call_site"]["retry"] >= retry_after
        assert b["calls"] > b["requests"] and b["calls_in_retry_after"] >= 2
        assert a["held_max"] <= deadline + 0.25
        assert a["calls_in_retry_after"] <= 1
        assert a["fallback"] == a["requests"] > 1
        assert set(a["reasons"]) <= {"retry_after", "cooldown"} and a["reasons"].get("retry_after", 0) >= 1
    assert 1 <= after["fleet_calls_in_retry_after"] <= 2 and after["calls"] <= 2 < before["calls"]
    assert after["gate_scope"].startswith("fleet")


def test_rs4_a_bulkhead_refuses_the_excess_fast_and_other_views_keep_answering(demo_run):
    """Issue 28 item 10, RS-4: on shop C (4 request threads) with the rates API hanging,
    without a bulkhead every lookup reaches the provider and a view that calls nothing waits
    behind the doomed calls; with max_concurrent_calls=2 and max_wait=0 at most 2 calls reach
    it, the excess is refused fast with reason bulkhead_full (counted by the server too) and
    answered by the fallback, and the other view answers at once."""
    _result, summary = demo_run
    without = summary["phases"]["hang_no_bulkhead"]["stages"]
    with_ = summary["phases"]["hang_bulkhead"]["stages"]
    assert without["calls"] == without["lookups"] == 8
    assert without["other_view_held_max"] >= 1.0
    assert with_["calls"] <= with_["slots"] == 2
    assert with_["refused"]["bulkhead_full"] == with_["lookups"] - with_["calls"] > 0
    assert with_["server_rejections_by_reason"]["bulkhead_full"] == with_["refused"]["bulkhead_full"]
    assert with_["refused_held_max"] < 1.0
    assert with_["other_view_answered"] == with_["other_view"] > 0
    assert with_["other_view_held_max"] < 1.0 <= without["other_view_held_max"]
    held = [r for r in summary["timeline"]["requests"] if "held" in r]
    assert {p["key"] for p in summary["timeline"]["phases"] if p.get("held")} == {
        "retry_after_docs",
        "retry_after_guarded",
        "hang_no_bulkhead",
        "hang_bulkhead",
    }
    assert {r["outcome"] for r in held} >= {"failed", "retry_after", "bulkhead_full", "other_view"}
