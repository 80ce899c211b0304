"""A pre-forking WSGI server for the EM-7 multiprocess test, like gunicorn ``--preload``.

``python -m tests.metrics.mp_server WORKERS`` with ``PROMETHEUS_MULTIPROC_DIR`` set: the
parent configures Django, calls ``prometheus.install()``, makes some protected calls of its
own, binds one listening socket, forks WORKERS processes that serve the app on it, and
prints ``ready PORT PARENT_PID WORKER_PID...``. It reaps workers like gunicorn's arbiter
(calling ``mark_process_dead`` as the documented ``child_exit`` hook does) and prints
``exited PID STATUS``; SIGTERM stops it and its workers. A worker stops cleanly on SIGTERM
(``sys.exit``, so ``atexit`` runs).

Views: ``/ok/N`` (N successes on ``svc``), ``/fail/N`` (N failures on ``svc``), ``/cycle``
(on ``cyc``: a forced open, three rejected calls, a release, one successful trial, which
closes it again: the same counts whichever worker serves it), ``/metrics``. Each answers
the pid of the worker that served it.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback

#: What the parent does before forking: its counts must be reported once, not per child.
PARENT_OKS = 7
PARENT_CYCLES = 1


def configure() -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="mp-metrics-test",
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "baldur_django"],
        MIDDLEWARE=[],
        ROOT_URLCONF=__name__,
        DATABASES={},
        LOGGING_CONFIG=None,
        BALDUR_STATE_BACKEND="memory",
        BALDUR_SERVICES={"svc": {"failure_threshold": 1000}, "cyc": {"half_open_max_calls": 1}},
    )
    django.setup()


def ok() -> int:
    return 1


class Down(Exception):
    pass


def down() -> int:
    raise Down("down")


def cycle() -> None:
    """force open, 3 rejections, release, one trial that closes: 3 transitions, 3 blocked, 1 success."""
    import baldur_django as baldur

    baldur.force_open_circuit("cyc", ttl_minutes=5, reason="test")
    for _ in range(3):
        try:
            baldur.protect("cyc", ok)
        except baldur.CircuitOpenError:
            pass
    baldur.release_circuit("cyc")
    baldur.protect("cyc", ok)


def _answer(text: str) -> object:
    from django.http import HttpResponse

    return HttpResponse(f"{os.getpid()} {text}", content_type="text/plain")


def view_ok(request, n):
    import baldur_django as baldur

    for _ in range(n):
        baldur.protect("svc", ok)
    time.sleep(0.02)  # simulated work, so that concurrent requests spread over the workers
    return _answer("ok")


def view_fail(request, n):
    import baldur_django as baldur

    for _ in range(n):
        try:
            baldur.protect("svc", down)
        except Down:
            pass
    time.sleep(0.02)
    return _answer("fail")


def view_cycle(request):
    cycle()
    time.sleep(0.02)
    return _answer("cycle")


def _urls():
    from django.urls import path

    from baldur_django.contrib import prometheus

    return [
        path("ok/<int:n>", view_ok),
        path("fail/<int:n>", view_fail),
        path("cycle", view_cycle),
        path("metrics", prometheus.metrics_view),
    ]


def __getattr__(name: str):  # ROOT_URLCONF: built when Django first resolves a URL
    if name == "urlpatterns":
        return _urls()
    raise AttributeError(name)


def serve(listener: socket.socket) -> None:
    """A worker: serve requests on the shared socket until SIGTERM, then exit cleanly."""
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from django.core.wsgi import get_wsgi_application

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *args: stop.set())

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = WSGIServer(listener.getsockname(), Quiet, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.server_name, server.server_port = "127.0.0.1", listener.getsockname()[1]
    server.setup_environ()
    server.set_app(get_wsgi_application())
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        while not stop.is_set():
            if selector.select(timeout=0.1):
                server._handle_request_noblock()  # another worker may have taken it: then a no-op
    sys.exit(0)


def main() -> None:
    workers = int(sys.argv[1])
    configure()
    from prometheus_client import multiprocess

    from baldur_django import services

    services.uninstall_audit_listener()  # no database here: the audit of the forces is not the point

    from baldur_django.contrib import prometheus

    prometheus.install()
    import baldur_django as baldur

    for _ in range(PARENT_CYCLES):
        cycle()
    for _ in range(PARENT_OKS - 3):
        baldur.protect("svc", ok)
    prometheus.flush()  # some of the parent's counts are in its file before the fork...
    for _ in range(3):
        baldur.protect("svc", ok)  # ...and some are not yet: neither may reach a child's file
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)  # a worker that lost the race for a connection goes back to select()
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            try:
                serve(listener)  # ends in sys.exit(0): atexit handlers run, as in a gunicorn worker
            except Exception:
                traceback.print_exc()
                os._exit(1)
        pids.append(pid)
    stopping = threading.Event()

    def terminate(*args):
        stopping.set()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, terminate)
    print("ready", listener.getsockname()[1], os.getpid(), *pids, flush=True)
    live = set(pids)
    while live:
        pid, status = os.waitpid(-1, 0)
        live.discard(pid)
        multiprocess.mark_process_dead(pid)  # gunicorn's child_exit hook, as docs/fleet.md gives it
        print("exited", pid, os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    main()
