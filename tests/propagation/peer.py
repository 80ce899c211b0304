"""A peer worker process for the EM-6 tests: breakers plus cluster propagation, core only.

Run as ``python -m tests.propagation.peer '<json options>'`` with ``BALDUR_REDIS_URL`` in the
environment. Options: ``prefix`` (channel prefix), ``services`` ({name: per-call overrides}),
``health`` (the subscriber's health interval, seconds). It prints one JSON line when its
subscription is confirmed, then answers one JSON line per command read from stdin:

* ``{"op": "register", "service": s, "overrides": {...}}``: create the breaker (per-call overrides)
* ``{"op": "trip", "service": s}``: failures until the breaker is OPEN (an automatic decision)
* ``{"op": "recover", "service": s}``: wait for HALF_OPEN, then successful trials until CLOSED
* ``{"op": "fail", "service": s, "times": n}``: n recorded failures (whatever they cause)
* ``{"op": "force_open" | "force_close" | "release", "service": s}``
* ``{"op": "wait", "service": s, "state": "open", "timeout": t}``: polls the breaker until it
  reads *state* or the deadline passes (waiting on another process, never ordering threads)
* ``{"op": "show", "service": s}``: state, forced, last trigger and the transitions seen
* ``{"op": "stats"}``, ``{"op": "flush"}`` (the publisher's queue drained), ``{"op": "level", "level": n}``
* ``{"op": "quit"}``
"""

from __future__ import annotations

import json
import os
import sys
import time

from baldur_django.contrib import propagation
from baldur_django.core import emergency
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.events import bus
from baldur_django.core.registry import registry
from baldur_django.core.testing import RecordingListener


def _wait_state(breaker, state: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    current = breaker.state.value
    while current != state and time.monotonic() < deadline:
        time.sleep(0.005)  # polling a change another process causes, with a deadline
        current = breaker.state.value
    return current


def _show(breaker, events) -> dict:
    snapshot = breaker.snapshot()
    return {
        "state": snapshot["state"],
        "forced": snapshot["forced"],
        "last_trigger": snapshot["last_trigger"],
        "transitions": [
            [e.kind, getattr(e, "from_state", ""), getattr(e, "to_state", ""), getattr(e, "trigger", "")]
            for e in events.events
            if e.service == breaker.name and e.kind in ("state_changed", "trip_blocked", "forced")
        ],
    }


def main() -> None:
    options = json.loads(sys.argv[1])
    events = RecordingListener(bus)
    for name, overrides in options.get("services", {}).items():
        registry.get(name, overrides)
    propagator = propagation.install(prefix=options["prefix"], health_interval=options.get("health", 5.0))
    ready = propagator.wait_connected(20)
    print(json.dumps({"ready": ready, "pid": os.getpid(), "origin": propagator.origin}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "quit":
            break
        breaker = registry.get(command["service"]) if "service" in command else None
        answer: dict = {}
        if op == "register":
            registry.get(command["service"], command.get("overrides") or None)
            answer = {"registered": command["service"]}
        elif op == "trip":
            while breaker.state.value != "open":
                try:
                    breaker.record_failure(breaker.acquire())
                except CircuitOpenError:
                    break
            answer = {"state": breaker.state.value}
        elif op == "recover":
            _wait_state(breaker, "half_open", command.get("timeout", 10.0))
            while breaker.state.value == "half_open":
                breaker.record_success(breaker.acquire())
            answer = {"state": breaker.state.value}
        elif op == "fail":
            for _ in range(command["times"]):
                try:
                    breaker.record_failure(breaker.acquire())
                except CircuitOpenError:
                    pass
            answer = {"state": breaker.state.value}
        elif op == "force_open":
            breaker.force_open(10)
            answer = {"state": breaker.state.value}
        elif op == "force_close":
            breaker.force_close(10)
            answer = {"state": breaker.state.value}
        elif op == "release":
            answer = {"released": breaker.release()}
        elif op == "wait":
            answer = {"state": _wait_state(breaker, command["state"], command.get("timeout", 10.0))}
        elif op == "show":
            answer = _show(breaker, events)
        elif op == "stats":
            answer = propagator.stats()
        elif op == "flush":
            answer = {"flushed": propagator.flush(10.0)}
        elif op == "level":
            emergency.set_level(command["level"], actor="peer")
            answer = {"level": emergency.current_level()}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)
    propagation.uninstall()


if __name__ == "__main__":
    main()
