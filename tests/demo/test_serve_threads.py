"""``python -m testproject.serve --threads N`` (the demo's shop C): at most N requests are
served at once, like a worker with a fixed pool of request threads; the next one waits for
a thread, it is not refused. Checked on the server class the option builds, with real
threads and sockets, synchronised by events (no sleeps)."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from testproject.serve import bounded


def test_at_most_n_requests_are_served_at_once_and_the_next_waits_its_turn():
    inside = threading.Semaphore(0)  # one release per request that reached the handler
    release = threading.Event()
    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            inside.release()
            release.wait(timeout=30)
            with lock:
                state["now"] -= 1
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

    server = bounded(ThreadingHTTPServer, 2)(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    statuses: list[int] = []

    def get() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/")
        statuses.append(conn.getresponse().status)
        conn.close()

    clients = [threading.Thread(target=get) for _ in range(3)]
    try:
        for client in clients:
            client.start()
        assert inside.acquire(timeout=10) and inside.acquire(timeout=10)  # two are served ...
        assert not inside.acquire(timeout=1.0)  # ... the third waits for a thread
        release.set()
        assert inside.acquire(timeout=10)  # then it is served too
        for client in clients:
            client.join(timeout=10)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert statuses == [200, 200, 200]
    assert state["most"] == 2
