"""The incident rehearsal's last three scenarios (see :mod:`benchmarks.incident`):
``empty-store``, ``trial-kill`` and ``names``."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests

from baldur_django.core.names import name_problem

from .incident import Poller, environment
from .incident_tools import Site, loadavg, manage, wait_for

SERVICES = ("svc-a", "svc-b", "svc-c")


def _records(site: Site, services: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The stored record of each of *services* (name -> decoded JSON), those that exist."""
    client, found = site.redis.client(), {}
    for service in services:
        for key in client.scan_iter(match=f"baldur:{{{service}-*}}:state"):
            found[service] = json.loads(client.get(key) or b"{}")
    return found


def _refusing_everywhere(load: dict[str, Poller], pids: set[int]) -> bool:
    for poller in load.values():
        with poller.lock:
            refusing = {a.pid for a in poller.answers[-40:] if a.status == 503 and '"open"' in a.body}
        if not pids <= refusing:
            return False
    return True


def empty_store_run(recovery: float, before_end: float = 2.3, pause: float = 0.06) -> dict[str, Any]:
    """Three breakers OPEN, Redis killed, an empty one back *before_end* s before their open time ends."""
    knobs = {"INCIDENT_RECOVERY": str(recovery), "INCIDENT_THRESHOLD": "3", "INCIDENT_CALL_TIMEOUT": "2"}
    with environment(knobs) as (site, server):
        site.upstream.mode("fail")
        load = {s: Poller(server, f"/call/{s}", threads=1, pause=pause, method="POST") for s in SERVICES}
        wait_for(
            lambda: (
                len(_records(site, SERVICES)) == 3
                and all(r.get("state") == "open" for r in _records(site, SERVICES).values())
            ),
            30,
            "three OPEN records",
        )
        wait_for(lambda: _refusing_everywhere(load, server.pids), 30, "every worker refusing", pause=0.05)
        records = _records(site, SERVICES)
        open_until = min(float(r["open_until"]) for r in records.values())
        site.redis.kill()
        killed = time.time()
        site.upstream.control("reset")
        restart_at = open_until - before_end
        time.sleep(max(0.0, restart_at - time.time()))
        site.redis.start()
        restarted = time.time()
        clean_until = restarted + recovery - 0.2  # no write-back trip can end its open time before this
        time.sleep(max(0.0, clean_until - time.time()))
        during = site.upstream.stats()["charge_requests"]
        time.sleep(recovery + 2.0)
        after = site.upstream.stats()["charge_requests"] - during
        for poller in load.values():
            poller.stop()
        calls = [(s, a) for s, p in load.items() for a in p.since(killed)]
        log = Path(site.log).read_text(errors="replace")
        reached = [  # answers of calls that reached the (failing) upstream within the window
            {"service": s, "pid": a.pid, "sent_after_open_end_s": round(a.sent - open_until, 2)}
            for s, a in calls
            if a.status == 502 and a.sent < clean_until
        ]
        kept = ""
        if during:  # keep the breaker log of a run that let calls through
            kept = f"{site.log}.kept"
            Path(kept).write_text(log)
    return {
        "recovery_s": recovery,
        "killed_before_open_end_s": round(open_until - killed, 2),
        "restarted_before_open_end_s": round(open_until - restarted, 2),
        "window_s": round(clean_until - killed, 2),
        "calls_made": len(calls),
        "calls_reaching_upstream": during,
        "trial_calls_after_window": after,
        "reached": reached[:20],
        "log_kept": kept,
        "adopted_closed_was_open": len(re.findall(r"store_adopted.*state=closed.*was=open", log)),
        "store_adopted_lines": log.count("store_adopted"),
        "store_adopted_sample": next((line for line in log.splitlines() if "store_adopted" in line), "")[-160:],
        "loadavg": loadavg(),
    }


def scenario_empty_store(quick: bool) -> dict[str, Any]:
    """10 runs at a 5 s recovery (1 when quick), and one at 30 s (not when quick)."""
    runs = [empty_store_run(5.0) for _ in range(1 if quick else 10)]
    if not quick:
        runs.append(empty_store_run(30.0))
    return {
        "runs": runs,
        "runs_with_calls": sum(1 for run in runs if run["calls_reaching_upstream"]),
        "pass": all(run["calls_reaching_upstream"] == 0 for run in runs),
    }


def scenario_trial_kill(quick: bool, timeout: float = 8.0, lease: float = 30.0) -> dict[str, Any]:
    """Trials hanging, every worker SIGKILLed, upstream back: seconds from the trials to a success."""
    knobs = {
        "INCIDENT_RECOVERY": "6",
        "INCIDENT_THRESHOLD": "3",
        "INCIDENT_TRIALS": "3",
        "INCIDENT_CALL_TIMEOUT": str(timeout),
    }
    with environment(knobs) as (site, server):
        site.upstream.mode("fail")
        tripping = Poller(server, "/call/payments", threads=1, pause=0.05, method="POST")
        try:  # every worker holds it OPEN: none sends a CLOSED call of its own at the trials' time
            wait_for(lambda: _refusing_everywhere({"payments": tripping}, server.pids), 30, "every worker refusing")
        finally:
            tripping.stop()
        site.upstream.mode("hang")
        open_until = float(_records(site, ("payments",))["payments"]["open_until"])
        time.sleep(max(0.0, open_until - time.time()) + 0.1)
        site.upstream.control("reset")
        callers = [
            threading.Thread(target=server.get, args=("/call/payments",), kwargs={"method": "POST"}, daemon=True)
            for _ in range(6)
        ]
        for thread in callers:
            thread.start()
        wait_for(lambda: site.upstream.stats()["charge_requests"] >= 3, 20, "three trials in flight")
        trials_began = time.time()
        time.sleep(0.3)
        in_flight = site.upstream.stats()["charge_requests"]
        for pid in server.pids:
            os.kill(pid, signal.SIGKILL)
        killed = time.time()
        site.upstream.mode("ok")
        poller = Poller(server, "/call/payments", threads=2, pause=0.05, method="POST")
        try:
            first = wait_for(
                lambda: next((a for a in poller.since(killed) if a.status == 200), None), lease + 30, "a first success"
            )
        finally:
            poller.stop()
        refusals = [a for a in poller.since(killed) if a.status == 503]
    to_success = first.received - trials_began
    return {
        "call_timeout_s": timeout,
        "probe_lease_s": lease,
        "trials_in_flight_at_kill": in_flight,
        "workers_killed": len(server.pids),
        "killed_after_trials_s": round(killed - trials_began, 2),
        "first_success_after_trials_s": round(to_success, 2),
        "refusals_meanwhile": len(refusals),
        "refusal_reasons": sorted({a.body for a in refusals[:50]}, key=len)[:3],
        "loadavg": loadavg(),
        "pass": to_success <= timeout + 3.0,
    }


BAD_NAMES = {
    "newline": "upstream\ncircuit_breaker.closed service=upstream",
    "carriage return": "upstream\r",
    "tab": "up\tstream",
    "trailing space": "upstream ",
    "escape": "up\x1b[31mstream",
    "line separator": "upstream\u2028circuit_breaker.closed service=upstream",
    "1,001 characters": "u" * 1001,
    "10 KB": "u" * 10_240,
}
GOOD = "upstream-ok"


def _site_entry_points(server: Any, name: str) -> dict[str, Any]:
    found = {}
    for via in ("decorator", "protect", "adapter"):
        body = urlencode({"via": via, "name": name})
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        answer = server.get("/names", method="POST", body=body, headers=headers)
        got = answer.json() if answer.status == 200 else {"status": answer.status}
        if got.get("refused"):
            found[via] = "refused"
        elif via == "adapter" and got.get("breaker") not in (None, name) and name_problem(got["breaker"]) is None:
            found[via] = f"made safe: {got['breaker'][:70]!r}"  # a URL's host is escaped, never refused
        else:
            found[via] = f"TAKEN {got}"
    return found


def _admin(server: Any, name: str) -> str:
    base, operator = f"http://127.0.0.1:{server.port}/admin/baldur_django/breaker/", {"X-Incident-Operator": "1"}
    session = requests.Session()
    page = session.get(base, headers=operator, timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    if not token:
        return f"no form ({page.status_code})"
    form = {
        "csrfmiddlewaretoken": token.group(1),
        "action": "force_open",
        "_selected_action": name,
        "post": "yes",
        "reason": "rehearsal",
        "ttl_minutes": "5",
    }
    answer = session.post(base, data=form, headers=operator | {"Referer": base}, timeout=30)
    if "Unknown breaker" in answer.text and "Nothing was changed" in answer.text:
        return "refused"
    if "Forced" in answer.text:
        return "TAKEN"
    return f"other ({answer.status_code})"


def scenario_names(quick: bool) -> dict[str, Any]:
    """Every entry point offered every bad name (and one good one); then the logs read."""
    table: dict[str, dict[str, Any]] = {}
    with environment({}) as (site, server):
        outputs = []
        for label, name in {**BAD_NAMES, "good": GOOD}.items():
            row = _site_entry_points(server, name)
            force = manage(site, ["baldur_force", "open", name, "--new", "--reason", "rehearsal"])
            outputs.append(force.stdout + force.stderr)
            row["baldur_force"] = "refused" if force.returncode else "TAKEN"
            row["admin"] = _admin(server, name)
            table[label] = row
        status = manage(site, ["baldur_status"])
        outputs.append(status.stdout + status.stderr)
        logs = "\n".join([Path(site.log).read_text(errors="replace"), server.log_text(), *outputs])
    forged = [line for line in logs.splitlines() if line.startswith("circuit_breaker.")]
    good_logged = f"service={GOOD}" in logs
    bad_refused = all(
        v == "refused" or v.startswith("made safe")
        for label, row in table.items()
        if label != "good"
        for v in row.values()
    )
    good_taken = all(v.startswith("TAKEN") for v in table["good"].values())
    return {
        "entry_points": table,
        "forged_lines": forged[:5],
        "log_lines_read": len(logs.splitlines()),
        "good_name_logged": good_logged,
        "status_widest_line": max((len(line) for line in status.stdout.splitlines()), default=0),
        "loadavg": loadavg(),
        "pass": bad_refused and good_taken and not forged and good_logged,
    }


MORE = {"empty-store": scenario_empty_store, "trial-kill": scenario_trial_kill, "names": scenario_names}
