"""A real local HTTP server for the adapter tests (HC-1..HC-5), on 127.0.0.1 in a thread.

Paths (the query string is ignored unless named):

``/ok``                     200 ``ok``
``/status/<code>``          that status, body ``status <code>``
``/429?retry_after=<v>``    429 with ``Retry-After: <v>``
``/hang``                   no answer until the server stops (or 10 s): past any client timeout
``/stream?size=<bytes>``    200 with the headers sent at once and the body (``size`` bytes,
                            a fixed pattern) only once :attr:`TestServer.release` is set,
                            then in small slow chunks
``/echo``                   200 with the request body echoed (POST, PUT...)

Every accepted TCP connection is counted (:attr:`connections`), and every request by
method and path (:attr:`requests`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["TestServer", "closed_port", "pattern"]


def pattern(size: int) -> bytes:
    """The streamed body: *size* bytes of a repeating pattern."""
    block = bytes(range(256))
    return (block * (size // 256 + 1))[:size]


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # one buffered write per answer (flushed after each request) and no Nagle: headers and
    # body in one segment, never a delayed-ACK stall
    wbufsize = 65536
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        owner = self.server.owner
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with owner.lock:
            owner.requests[(self.command, parts.path)] += 1
        body = self._body()
        path = parts.path
        if path == "/ok":
            self._answer(200, b"ok")
        elif path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            self._answer(code, f"status {code}".encode())
        elif path == "/429":
            self._answer(429, b"slow down", {"Retry-After": query.get("retry_after", "120")})
        elif path == "/hang":
            owner.stopping.wait(10)
            self.close_connection = True
        elif path == "/stream":
            size = int(query.get("size", "1048576"))
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.flush()
            owner.release.wait(10)
            data = pattern(size)
            step = max(1, size // 16)
            for start in range(0, size, step):
                self.wfile.write(data[start : start + step])
                self.wfile.flush()
                time.sleep(0.002)
            owner.body_sent = True
        elif path == "/echo":
            self._answer(200, body)
        else:
            self._answer(404, b"no such path")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: TestServer

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        with self.owner.lock:
            self.owner.connections += 1
        return conn, addr


class TestServer:
    """The server of one test; :meth:`stop` ends it (hanging requests included).

    Attributes:
        port (int): its port on 127.0.0.1.
        connections (int): TCP connections accepted so far.
        requests (Counter): ``(method, path)`` -> requests received.
        release (threading.Event): lets ``/stream`` send its body.
        body_sent (bool): True once a ``/stream`` body was sent whole.
    """

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: Counter[tuple[str, str]] = Counter()
        self.release = threading.Event()
        self.stopping = threading.Event()
        self.body_sent = False
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    def url(self, path: str = "/ok", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def name(self) -> str:
        """The per-host breaker name of this server's URLs."""
        return f"127.0.0.1:{self.port}"

    def count(self, path: str, method: str = "GET") -> int:
        with self.lock:
            return self.requests[(method, path)]

    def stop(self) -> None:
        self.stopping.set()
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
