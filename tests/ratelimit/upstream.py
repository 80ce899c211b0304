"""A scripted local HTTP upstream for the rate-limit tests (RL-1..RL-9).

:class:`Upstream` runs a real ``http.server.ThreadingHTTPServer`` on ``127.0.0.1`` (an
ephemeral port) in a daemon thread. Every request it receives is counted under a lock,
and each one is answered with the next :class:`Answer` of the current script:

    upstream.script("429,429,200")                      # status codes, comma separated
    upstream.script("200*5,429", cycle=True)            # "N*k" repeats; cycle=True loops
    upstream.script(too_many("7"), ok())                # Answer objects carry Retry-After

When a non-cycling script runs out, its last answer repeats. The fixture that starts
and stops it lives in ``tests/ratelimit/conftest.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Answer", "Upstream", "ok", "too_many", "unavailable", "http_date", "parse_script"]


@dataclass(frozen=True)
class Answer:
    """One scripted reply.

    Attributes:
        status (int): HTTP status code sent back.
        retry_after (str | None): raw ``Retry-After`` header value, sent verbatim
            (delta-seconds, an HTTP-date, or deliberate garbage); None sends no header.
        body (str): response body (UTF-8).
    """

    status: int = 200
    retry_after: str | None = None
    body: str = ""


def ok(body: str = '{"ok": true}') -> Answer:
    """A 200 answer."""
    return Answer(200, None, body)


def too_many(retry_after: Any = None) -> Answer:
    """A 429 answer; *retry_after* (any value, ``str()``-ed) becomes the ``Retry-After`` header."""
    return Answer(429, None if retry_after is None else str(retry_after), '{"error": "slow down"}')


def unavailable(retry_after: Any = None) -> Answer:
    """A 503 answer, optionally with a ``Retry-After`` header."""
    return Answer(503, None if retry_after is None else str(retry_after), '{"error": "unavailable"}')


def http_date(unix_seconds: float) -> str:
    """Format Unix time *unix_seconds* as an RFC 9110 HTTP-date (``Wed, 21 Oct 2015 07:28:00 GMT``)."""
    return format_datetime(datetime.fromtimestamp(unix_seconds, tz=UTC), usegmt=True)


def parse_script(items: Iterable[Any]) -> list[Answer]:
    """Turn script items into answers.

    Args:
        items: :class:`Answer` objects, integers (a status code) or strings of
            comma-separated tokens ``"429"`` / ``"200*5"`` (status, optionally repeated).

    Returns:
        The list of answers, in order.

    Raises:
        ValueError: a token is not a status code between 100 and 599, or a repeat count
            is not a positive integer; the message names the token.
    """
    answers: list[Answer] = []
    for item in items:
        if isinstance(item, Answer):
            answers.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            answers.append(_answer_for(item, repr(item)))
        elif isinstance(item, str):
            for token in (t.strip() for t in item.split(",")):
                code, star, times = token.partition("*")
                try:
                    status = int(code)
                    count = int(times) if star else 1
                except ValueError:
                    raise ValueError(f"upstream script token {token!r}: expected STATUS or STATUS*COUNT") from None
                if count < 1:
                    raise ValueError(f"upstream script token {token!r}: repeat count must be at least 1")
                answers.extend([_answer_for(status, token)] * count)
        else:
            raise ValueError(f"upstream script item {item!r}: expected an Answer, a status code or a string")
    return answers


def _answer_for(status: int, token: str) -> Answer:
    if not 100 <= status <= 599:
        raise ValueError(f"upstream script token {token!r}: {status} is not an HTTP status code")
    if status == 429:
        return too_many()
    if status == 503:
        return unavailable()
    return Answer(status, None, "" if status == 200 else '{"error": "scripted"}')


class Upstream:
    """A real HTTP server whose answers follow a per-test script.

    Attributes:
        url (str): base URL, ``http://127.0.0.1:<port>``.
        stamp (Callable[[], float] | None): when set, called on every request (in the
            server thread) and the value appended to :attr:`times` (tests install
            ``clock.monotonic`` to see *when* on the fake clock the server was reached).
        times (list[float]): the stamps, in arrival order.
        paths (list[str]): request paths, in arrival order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: list[Answer] = [ok()]
        self._cursor = 0
        self._cycle = False
        self._hits = 0
        self.stamp: Callable[[], float] | None = None
        self.times: list[float] = []
        self.paths: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------------ script
    def script(self, *items: Any, cycle: bool = False) -> Upstream:
        """Replace the script (see :func:`parse_script`) and rewind it; the count is kept.

        Args:
            *items: answers, status codes or comma-separated strings.
            cycle: loop over the script forever instead of repeating its last answer.

        Raises:
            ValueError: an empty script or a bad token.
        """
        answers = parse_script(items)
        if not answers:
            raise ValueError("upstream script is empty: give at least one answer")
        with self._lock:
            self._answers = answers
            self._cursor = 0
            self._cycle = cycle
        return self

    def _next_answer(self, path: str) -> Answer:
        with self._lock:
            self._hits += 1
            self.paths.append(path)
            if self.stamp is not None:
                self.times.append(self.stamp())
            answers = self._answers
            if self._cycle:
                answer = answers[self._cursor % len(answers)]
            else:
                answer = answers[min(self._cursor, len(answers) - 1)]
            self._cursor += 1
            return answer

    @property
    def hits(self) -> int:
        """How many requests the server has received so far (all paths)."""
        with self._lock:
            return self._hits

    def endpoint(self, path: str = "/api/charge") -> str:
        """Absolute URL of *path* on this server (keep '429' out of paths: it is a 429 clue)."""
        return self.url + path

    # --------------------------------------------------------------- lifecycle
    def start(self) -> Upstream:
        """Bind 127.0.0.1 on a free port and serve from a daemon thread."""
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                answer = upstream._next_answer(self.path)
                body = answer.body.encode("utf-8")
                self.send_response(answer.status, HTTPStatus(answer.status).phrase)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if answer.retry_after is not None:
                    self.send_header("Retry-After", answer.retry_after)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
