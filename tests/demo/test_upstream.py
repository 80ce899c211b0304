"""The payments stand-in (``testproject.upstream``) that the demo and the shop tests use.
Its behaviour is what the demo's numbers rest on, so it is tested on its own."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testproject import upstream as upstream_module

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server():
    srv = upstream_module.start_in_thread()
    yield srv
    srv.stop()


def call(srv, method, path, body=None, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=timeout)
    try:
        payload = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=payload)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def test_modes_ok_fail_recover_and_counts(server):
    """ok answers 200 with a charge id, fail answers 503, recover is ok again; each
    /charge is counted, and every request (control ones too) in ``requests``."""
    status, body = call(server, "POST", "/charge", {"order": 7, "amount_cents": 100})
    assert status == 200 and body["charge_id"] == "ch_1" and body["order"] == 7
    assert call(server, "POST", "/control/mode", {"mode": "fail"}) == (
        200,
        {"mode": "fail", "previous": "ok", "hang_seconds": 10.0, "retry_after": 2.0},
    )
    assert call(server, "POST", "/charge", {})[0] == 503
    assert call(server, "POST", "/control/mode", b"recover")[1]["mode"] == "ok"
    assert call(server, "POST", "/charge", {})[0] == 200
    stats = call(server, "GET", "/control/stats")[1]
    assert stats["charge_requests"] == 3
    assert stats["by_outcome"]["ok"] == 2 and stats["by_outcome"]["fail"] == 1
    assert stats["recoveries"] == 1
    assert stats["requests"] == 6  # 3 charges, 2 mode switches, this stats call
    assert call(server, "POST", "/control/reset")[1]["charge_requests"] == 0


@pytest.mark.parametrize(
    "body, message",
    [
        ({"mode": "explode"}, "mode='explode': expected one of ok, fail, hang, recover"),
        ({"mode": "hang", "hang_seconds": 0}, "hang_seconds=0: expected a number of seconds above 0 and at most 60"),
        ({"mode": "hang", "hang_seconds": True}, "hang_seconds=True"),
        ({"mode": "limit", "retry_after": -1}, "retry_after=-1: expected a number of seconds above 0"),
        (b"{not json", "body is not valid JSON"),
    ],
)
def test_bad_control_input_is_a_400_naming_the_problem(server, body, message):
    """A bad mode or hang limit is refused with a message naming the value; the mode stays."""
    status, reply = call(server, "POST", "/control/mode", body)
    assert status == 400
    assert message in reply["error"]
    assert server.state.mode == "ok"


def call_full(srv, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=5.0)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"null")
    finally:
        conn.close()


def test_limit_mode_answers_429_with_retry_after_and_rate_is_counted_apart(server):
    """Mode ``limit`` answers each counted request 429 with ``Retry-After`` (the seconds it
    was given); ``/rate`` is a GET counted in ``rate_requests``, not in the charges."""
    status, _headers, body = call_full(server, "GET", "/rate?order=5")
    assert status == 200 and body["order"] == "5" and body["rate"] > 0
    assert call(server, "POST", "/control/mode", {"mode": "limit", "retry_after": 1.5})[1]["retry_after"] == 1.5
    status, headers, body = call_full(server, "GET", "/rate?order=6")
    assert status == 429 and headers["Retry-After"] == "1.5"
    assert call(server, "POST", "/charge", {"order": 7})[0] == 429
    stats = call(server, "GET", "/control/stats")[1]
    assert stats["rate_requests"] == 2 and stats["charge_requests"] == 1
    assert stats["by_outcome"]["limited"] == 2 and stats["by_outcome"]["ok"] == 1


def test_call_log_lists_each_counted_request_with_its_order_and_arrival(server):
    """``/control/calls`` lists every charge, quote and rate request as it arrived, numbered
    from 0, with its order (the demo tells the shops apart by it); ``since`` skips the first."""
    before = time.time()
    call(server, "POST", "/charge", {"order": 1})
    call(server, "GET", "/rate?order=2")
    call(server, "GET", "/quote?order=3&amount_cents=100")
    calls = call(server, "GET", "/control/calls")[1]["calls"]
    assert [(c["n"], c["kind"], c["order"]) for c in calls] == [(0, "charge", "1"), (1, "rate", "2"), (2, "quote", "3")]
    assert before <= calls[0]["t"] <= calls[1]["t"] <= calls[2]["t"] <= time.time()
    assert [c["n"] for c in call(server, "GET", "/control/calls?since=2")[1]["calls"]] == [2]
    call(server, "POST", "/control/reset")
    assert call(server, "GET", "/control/calls")[1]["calls"] == []


def test_unknown_routes_are_404(server):
    assert call(server, "GET", "/nope")[0] == 404
    assert call(server, "POST", "/nope")[0] == 404


def test_hang_is_bounded_by_its_limit(server):
    """A hang with nobody giving up ends after ``hang_seconds`` with a 504."""
    call(server, "POST", "/control/mode", {"mode": "hang", "hang_seconds": 0.2})
    started = time.monotonic()
    status, _ = call(server, "POST", "/charge", {}, timeout=10)
    assert status == 504
    assert 0.2 <= time.monotonic() - started < 5
    assert server.state.by_outcome["hang_timeout"] == 1


def test_hang_ends_when_the_client_gives_up(server):
    """The hanging handler notices the client closing its connection and stops."""
    call(server, "POST", "/control/mode", {"mode": "hang", "hang_seconds": 30})
    with pytest.raises(TimeoutError):
        call(server, "POST", "/charge", {}, timeout=0.2)
    assert server.state.wait_for(lambda s: s.by_outcome["hang_abandoned"] == 1, timeout=5)


def test_shutdown_interrupts_a_hang():
    """Stopping the server ends a hanging request at once, long before its limit."""
    srv = upstream_module.start_in_thread()
    call(srv, "POST", "/control/mode", {"mode": "hang", "hang_seconds": 30})
    errors = []

    def client():
        try:
            call(srv, "POST", "/charge", {}, timeout=20)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    assert srv.state.wait_for(lambda s: s.charge_requests == 1, timeout=5)
    started = time.monotonic()
    srv.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert time.monotonic() - started < 5
    assert srv.state.by_outcome["hang_shutdown"] == 1
    assert errors and isinstance(errors[0], (http.client.RemoteDisconnected, ConnectionError))


@pytest.mark.multiprocess
def test_command_line_prints_address_and_stops_on_sigterm():
    """``python -m testproject.upstream --port 0`` announces its address, serves, and
    exits 0 on SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testproject.upstream", "--port", "0", "--quiet"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("upstream listening on http://127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        conn.close()
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_command_line_rejects_a_bad_hang_limit():
    """A bad ``--hang-seconds`` exits 2 with a message naming the option."""
    result = subprocess.run(
        [sys.executable, "-m", "testproject.upstream", "--hang-seconds", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--hang-seconds 0" in result.stderr


def test_hold_keeps_charges_waiting_until_release(server):
    """``/control/hold`` counts each charge on arrival and keeps it waiting (``held``)
    until ``/control/release``, which answers it as the mode then says (the demo's fleet
    phase keeps trial calls in flight this way)."""
    assert call(server, "POST", "/control/hold") == (200, {"holding": True})
    answers = []
    clients = [
        threading.Thread(target=lambda: answers.append(call(server, "POST", "/charge", {"order": 1}, timeout=20)))
        for _ in range(2)
    ]
    for thread in clients:
        thread.start()
    assert server.state.wait_for(lambda s: s.held == 2, timeout=5)
    stats = call(server, "GET", "/control/stats")[1]
    assert (stats["charge_requests"], stats["held"], stats["holding"]) == (2, 2, True)
    assert answers == []  # nothing answered while held
    assert call(server, "POST", "/control/release") == (200, {"holding": False, "released": 2})
    for thread in clients:
        thread.join(timeout=10)
    assert sorted(status for status, _ in answers) == [200, 200]
    stats = call(server, "GET", "/control/stats")[1]
    assert (stats["held"], stats["by_outcome"]["ok"]) == (0, 2)
    assert call(server, "POST", "/charge", {})[0] == 200  # no longer held


def test_hold_is_bounded_by_the_hang_limit_and_ends_on_shutdown():
    """A held charge answers 504 once the hang limit passes, and stopping the server ends
    a held charge at once."""
    srv = upstream_module.start_in_thread()
    try:
        call(srv, "POST", "/control/mode", {"mode": "ok", "hang_seconds": 0.2})
        call(srv, "POST", "/control/hold")
        status, body = call(srv, "POST", "/charge", {})
        assert status == 504 and "held for 0.2 s" in body["error"]
        assert srv.state.by_outcome["hang_timeout"] == 1
        call(srv, "POST", "/control/mode", {"mode": "ok", "hang_seconds": 30})
        errors = []

        def client():
            try:
                call(srv, "POST", "/charge", {}, timeout=20)
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                errors.append(exc)

        thread = threading.Thread(target=client)
        thread.start()
        assert srv.state.wait_for(lambda s: s.held == 1, timeout=5)
    finally:
        srv.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert srv.state.by_outcome["hang_shutdown"] == 1
    assert errors and isinstance(errors[0], (http.client.RemoteDisconnected, ConnectionError))


def test_quote_endpoint_counts_apart_from_charges_and_follows_the_mode(server):
    """``GET /quote`` answers a quote in mode ok and 503 in mode fail, counted under
    ``quote_requests`` (not ``charge_requests``)."""
    status, body = call(server, "GET", "/quote?order=7&amount_cents=1000")
    assert status == 200 and body["quote_id"] == "q_1" and body["order"] == "7" and body["price_cents"] == 510
    call(server, "POST", "/control/mode", {"mode": "fail"})
    assert call(server, "GET", "/quote")[0] == 503
    stats = call(server, "GET", "/control/stats")[1]
    assert (stats["quote_requests"], stats["charge_requests"]) == (2, 0)
    assert stats["by_outcome"]["ok"] == 1 and stats["by_outcome"]["fail"] == 1
