"""A stand-in "payments" service whose behaviour you can switch at run time.

Run it as its own process::

    python -m testproject.upstream --port 8765      # --port 0 picks a free port

It prints ``upstream listening on http://HOST:PORT`` on stdout once it accepts
connections. Endpoints:

``POST /charge``
    Counted. Mode ``ok``: 200 ``{"charge_id": "ch_<n>", "status": "succeeded", ...}``.
    Mode ``fail``: 503 ``{"error": ...}``. Mode ``hang``: no answer until the client
    gives up (closes its connection), the hang limit passes (then 504), or the server
    shuts down.
``GET /rate?order=ID``
    An exchange rate (the shop's rates API, a GET it may retry), counted apart
    (``rate_requests``) and answered as the mode says: 200 ``{"rate": float, ...}``, 503,
    429 or a hang.
``GET /quote?order=ID&amount_cents=N``
    A shipping quote (the shop's carriers), counted apart from the charges
    (``quote_requests``) and answered as the mode says, like ``/charge``: 200
    ``{"quote_id": "q_<n>", "price_cents": int, "days": int, ...}``, 503 or a hang. The demo
    runs two of these servers as the shop's two carriers, one host each.
``POST /control/mode``
    Body ``{"mode": "ok" | "fail" | "hang" | "recover" | "limit", "hang_seconds": float,
    "retry_after": float}`` (or the bare mode as text). ``recover`` is ``ok`` after
    trouble; it is counted in the stats. ``limit`` answers every counted request 429 with
    ``Retry-After: retry_after`` (seconds, default 2, at most 60). ``hang_seconds``
    (default 10, at most 60) bounds each hang. Answers 200 with the new mode, 400 naming
    what was wrong.
``POST /control/hold`` and ``POST /control/release``
    While held, each ``/charge`` is counted on arrival and then kept waiting (``held`` in
    the stats) until the release, the hang limit (then 504) or shutdown; on release the
    waiting charges are answered as the mode then says. The demo uses it to keep a fleet's
    trial calls in flight until every other request has been answered.
``GET /control/calls?since=N``
    ``{"calls": [{"n": int, "kind": "charge" | "quote" | "rate", "order": str | None,
    "t": Unix seconds}, ...]}``: every counted request from the ``n``-th on (the last
    5,000 kept), as it arrived; the demo tells which shop sent each by its order.
``GET /control/stats``
    ``{"charge_requests": int, "requests": int, "by_outcome": {...}, "mode": str,
    "holding": bool, "held": int, ...}``: every request received is counted, control ones
    included (in ``requests``).
``POST /control/reset``
    Counters back to zero (the mode is kept).
``GET /health``
    200 ``{"ok": true}``.

The server uses :class:`http.server.ThreadingHTTPServer`: a hanging request holds its
own thread only. SIGTERM and SIGINT stop it at once, hanging requests included.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

MODES = ("ok", "fail", "hang", "recover", "limit")
DEFAULT_HANG_SECONDS = 10.0
MAX_HANG_SECONDS = 60.0
DEFAULT_RETRY_AFTER = 2.0
MAX_CALLS_KEPT = 5000
_POLL = 0.02  # seconds between checks for a departed client while hanging


class UpstreamState:
    """Mode and counters shared by the handler threads.

    Attributes:
        mode (str): ``"ok"``, ``"fail"`` or ``"hang"`` (``"recover"`` is stored as ``"ok"``).
        hang_seconds (float): longest hang (or hold) of one request, seconds.
        holding (bool): True between :meth:`hold` and :meth:`release`.
        held (int): charges waiting for the release right now.
        stopping (threading.Event): set on shutdown; ends every hang at once.
    """

    def __init__(self, hang_seconds: float = DEFAULT_HANG_SECONDS) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified whenever a counter moves
        self.mode = "ok"
        self.hang_seconds = hang_seconds
        self.retry_after = DEFAULT_RETRY_AFTER
        self.holding = False
        self.held = 0
        self.calls: deque[dict[str, Any]] = deque(maxlen=MAX_CALLS_KEPT)
        self.stopping = threading.Event()
        self.reset()

    def reset(self) -> None:
        """Zero every counter (the mode stays)."""
        with self.lock:
            self.requests = 0
            self.charge_requests = 0
            self.quote_requests = 0
            self.rate_requests = 0
            self.calls.clear()
            self.recoveries = 0
            self.by_outcome = {
                "ok": 0,
                "fail": 0,
                "limited": 0,
                "hang_abandoned": 0,
                "hang_timeout": 0,
                "hang_shutdown": 0,
            }

    def set_mode(self, mode: str, hang_seconds: float | None = None, retry_after: float | None = None) -> str:
        """Switch mode; returns the previous one. ``recover`` means ``ok``; *retry_after*
        (seconds) is what mode ``limit`` asks for."""
        with self.lock:
            previous = self.mode
            if mode == "recover":
                self.recoveries += 1
                mode = "ok"
            self.mode = mode
            if hang_seconds is not None:
                self.hang_seconds = hang_seconds
            if retry_after is not None:
                self.retry_after = retry_after
            return previous

    def arrived(self, kind: str, order: str | None) -> int:
        """Count one ``/charge``, ``/quote`` or ``/rate`` request (lock held by the caller)
        and log its arrival; returns its number among its kind."""
        name = f"{kind}_requests"
        number = getattr(self, name) + 1
        setattr(self, name, number)
        self.calls.append({"kind": kind, "order": order, "t": time.time()})
        self.changed.notify_all()
        return number

    def calls_since(self, since: int) -> list[dict[str, Any]]:
        """The logged arrivals numbered *since* and later (from 0, oldest first)."""
        with self.lock:
            first = self.logged() - len(self.calls)
            return [dict(c, n=first + i) for i, c in enumerate(self.calls) if first + i >= since]

    def logged(self) -> int:
        """How many arrivals were ever logged (lock held by the caller)."""
        return self.charge_requests + self.quote_requests + self.rate_requests

    def shut_down(self) -> None:
        """Set :attr:`stopping` and wake every held charge (they end as ``hang_shutdown``)."""
        self.stopping.set()
        with self.lock:
            self.changed.notify_all()

    def hold(self) -> None:
        """Keep every ``/charge`` arriving from now on waiting until :meth:`release`."""
        with self.lock:
            self.holding = True

    def release(self) -> int:
        """End the hold; returns how many charges were waiting (they are answered now)."""
        with self.lock:
            self.holding = False
            self.changed.notify_all()
            return self.held

    def wait_release(self, limit: float) -> bool:
        """Wait (lock held by the caller's ``with self.changed``) until the hold ends,
        *limit* seconds pass or shutdown; True when released."""
        self.held += 1
        self.changed.notify_all()
        try:
            self.changed.wait_for(lambda: not self.holding or self.stopping.is_set(), limit)
        finally:
            self.held -= 1
        return not self.holding and not self.stopping.is_set()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "charge_requests": self.charge_requests,
                "quote_requests": self.quote_requests,
                "rate_requests": self.rate_requests,
                "retry_after": self.retry_after,
                "requests": self.requests,
                "by_outcome": dict(self.by_outcome),
                "mode": self.mode,
                "hang_seconds": self.hang_seconds,
                "recoveries": self.recoveries,
                "holding": self.holding,
                "held": self.held,
            }

    def outcome(self, name: str) -> None:
        """Count one finished ``/charge`` or ``/quote`` request under *name* (a key of
        ``by_outcome``)."""
        with self.lock:
            self.by_outcome[name] += 1
            self.changed.notify_all()

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        """Block until ``predicate(state)`` holds (checked whenever a counter moves) or
        *timeout* seconds pass; returns the predicate's last value. For tests."""
        with self.changed:
            return bool(self.changed.wait_for(lambda: predicate(self), timeout))


def _seconds_field(data: dict[str, Any], name: str) -> float | None:
    """``data[name]`` as seconds above 0 and at most MAX_HANG_SECONDS, None when absent;
    ValueError names the field."""
    if name not in data:
        return None
    raw = data[name]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= MAX_HANG_SECONDS:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds above 0 and at most {MAX_HANG_SECONDS:g}")
    return float(raw)


def _parse_mode(body: bytes) -> tuple[str, float | None, float | None]:
    """Read ``{"mode": ..., "hang_seconds": ..., "retry_after": ...}`` or a bare mode;
    ValueError names the problem."""
    text = body.decode("utf-8", "replace").strip()
    hang_seconds = retry_after = None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            raise ValueError("body is not valid JSON") from None
        mode = data.get("mode")
        hang_seconds = _seconds_field(data, "hang_seconds")
        retry_after = _seconds_field(data, "retry_after")
    else:
        mode = text.strip('"')
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
    return mode, hang_seconds, retry_after


def _answer(kind: str, number: int, request: dict[str, Any]) -> dict[str, Any]:
    """The body of a successful ``/charge``, ``/quote`` or ``/rate``, the *number*-th of its kind."""
    if kind == "quote":
        amount = str(request.get("amount_cents", ""))
        return {
            "quote_id": f"q_{number}",
            "order": request.get("order"),
            "price_cents": 490 + (int(amount) if amount.isdigit() else 0) // 50,
            "days": 2,
        }
    if kind == "rate":
        return {"rate_id": f"r_{number}", "order": request.get("order"), "pair": "EUR/USD", "rate": 1.08}
    return {
        "charge_id": f"ch_{number}",
        "status": "succeeded",
        "order": request.get("order"),
        "amount_cents": request.get("amount_cents"),
    }


class UpstreamHandler(BaseHTTPRequestHandler):
    """Request handler; the server's ``state`` attribute holds the :class:`UpstreamState`."""

    server_version = "baldur-demo-upstream/1.0"
    quiet = False

    @property
    def state(self) -> UpstreamState:
        return self.server.state  # type: ignore[attr-defined]

    # -- plumbing --------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if not self.server.quiet:  # type: ignore[attr-defined]
            sys.stderr.write("upstream: %s\n" % (format % args))

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left; nothing to tell it

    def _count(self) -> None:
        with self.state.lock:
            self.state.requests += 1

    def _client_gone(self) -> bool:
        """True when the client closed its end of the connection."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- routes ----------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._count()
        if self.path == "/control/stats":
            self._json(200, self.state.stats())
        elif self.path == "/health":
            self._json(200, {"ok": True})
        elif self.path.partition("?")[0] in ("/quote", "/rate"):
            route, _, query = self.path.partition("?")
            self._charge(query.encode(), kind=route[1:])
        elif self.path.partition("?")[0] == "/control/calls":
            query = {k: v[-1] for k, v in parse_qs(self.path.partition("?")[2]).items()}
            since = int(query["since"]) if query.get("since", "").isdigit() else 0
            self._json(200, {"calls": self.state.calls_since(since)})
        else:
            self._json(404, {"error": f"no GET route {self.path}"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self._count()
        body = self._body()
        if self.path == "/charge":
            self._charge(body)
        elif self.path == "/control/mode":
            try:
                mode, hang_seconds, retry_after = _parse_mode(body)
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
                return
            previous = self.state.set_mode(mode, hang_seconds, retry_after)
            self._json(
                200,
                {
                    "mode": self.state.mode,
                    "previous": previous,
                    "hang_seconds": self.state.hang_seconds,
                    "retry_after": self.state.retry_after,
                },
            )
        elif self.path == "/control/hold":
            self.state.hold()
            self._json(200, {"holding": True})
        elif self.path == "/control/release":
            released = self.state.release()
            self._json(200, {"holding": False, "released": released})
        elif self.path == "/control/reset":
            self.state.reset()
            self._json(200, self.state.stats())
        else:
            self._json(404, {"error": f"no POST route {self.path}"})

    def _charge(self, body: bytes, kind: str = "charge") -> None:
        """Answer a ``/charge`` (JSON *body*) or, *kind* ``"quote"`` or ``"rate"``, a
        ``/quote`` or ``/rate`` (*body*: its query string) as the mode and the hold say."""
        state = self.state
        if kind == "charge":
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = {}
            request = request if isinstance(request, dict) else {}
        else:
            request = {k: v[-1] for k, v in parse_qs(body.decode(errors="replace")).items()}
        order = request.get("order")
        with state.changed:
            number = state.arrived(kind, None if order is None else str(order))
            released = not state.holding or state.wait_release(state.hang_seconds)
            mode, hang_seconds, retry_after = state.mode, state.hang_seconds, state.retry_after
        if not released:
            if state.stopping.is_set():
                state.outcome("hang_shutdown")
            else:
                state.outcome("hang_timeout")
                self._json(504, {"error": f"held for {hang_seconds:g} s"})
            return
        if mode == "hang":
            self._hang(hang_seconds)
        elif mode == "fail":
            state.outcome("fail")
            what = {"quote": "shipping quotes", "rate": "exchange rates"}.get(kind, "payments")
            self._json(503, {"error": f"{what} temporarily unavailable"})
        elif mode == "limit":
            state.outcome("limited")
            self._json(429, {"error": "too many requests"}, {"Retry-After": f"{retry_after:g}"})
        else:
            state.outcome("ok")
            self._json(200, _answer(kind, number, request))

    def _hang(self, limit: float) -> None:
        """Send nothing until the client leaves, *limit* seconds pass (then 504) or shutdown."""
        state = self.state
        waited = 0.0
        while waited < limit:
            if state.stopping.wait(_POLL):
                state.outcome("hang_shutdown")
                return
            waited += _POLL
            if self._client_gone():
                state.outcome("hang_abandoned")
                return
        state.outcome("hang_timeout")
        self._json(504, {"error": f"hung for {limit:g} s"})


class UpstreamServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` carrying an :class:`UpstreamState`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: UpstreamState | None = None, quiet: bool = False) -> None:
        self.state = state or UpstreamState()
        self.quiet = quiet
        super().__init__(address, UpstreamHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """End every hang, stop serving and close the socket. Call from another thread
        than the one in ``serve_forever``."""
        self.state.shut_down()
        self.shutdown()
        self.server_close()


def start_in_thread(host: str = "127.0.0.1", port: int = 0, quiet: bool = True) -> UpstreamServer:
    """Start a server on a daemon thread (tests); stop it with ``server.stop()``.

    Returns:
        The running :class:`UpstreamServer`; ``server.url`` is its base URL.
    """
    server = UpstreamServer((host, port), quiet=quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="upstream", daemon=True)
    thread.start()
    return server


def exit_with_parent() -> None:
    """Exit as soon as stdin reaches EOF: the parent (the demo) died or let go of us.

    Reads the raw file descriptor: a thread parked in ``sys.stdin.buffer.read`` holds the
    buffered reader's lock and makes interpreter shutdown abort."""
    import os

    def watch() -> None:
        try:
            while os.read(sys.stdin.fileno(), 1024):
                pass
        except (OSError, ValueError):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m testproject.upstream [--host H] [--port N] [--quiet]``."""
    parser = argparse.ArgumentParser(
        prog="python -m testproject.upstream", description="A payments stand-in with switchable failure modes."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port to bind, 0 for any free one (default 8765)")
    parser.add_argument(
        "--hang-seconds",
        type=float,
        default=DEFAULT_HANG_SECONDS,
        help="longest hang of one request, seconds (default 10)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request on stderr")
    parser.add_argument("--exit-with-parent", action="store_true", help="exit when stdin closes (used by the demo)")
    args = parser.parse_args(argv)
    if not 0 < args.hang_seconds <= MAX_HANG_SECONDS:
        parser.error(f"--hang-seconds {args.hang_seconds:g}: expected above 0 and at most {MAX_HANG_SECONDS:g}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: expected 0..65535")
    try:
        server = UpstreamServer((args.host, args.port), UpstreamState(args.hang_seconds), quiet=args.quiet)
    except OSError as exc:
        print(f"upstream: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    if args.exit_with_parent:
        exit_with_parent()

    def stop(signum: int, frame: Any) -> None:
        server.state.shut_down()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"upstream listening on {server.url}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.state.shut_down()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
