"""Serve the test project with Django's development server.

``python -m testproject.serve [--host H] [--port N] [--exit-with-parent]`` (what the demo
runs) is the same threaded WSGI server as ``manage.py runserver --noreload``, but
``--port 0`` picks a free port and the line ``django listening on http://HOST:PORT`` is
printed on stdout once connections are accepted, so a parent process knows where to go
without guessing a free port. ``--exit-with-parent`` ends the server when stdin closes.
``--threads N`` serves at most N requests at once, like a gunicorn worker run with
``--threads N``: a request arriving while all N are busy waits for one to finish (the
default, 0, starts a thread for every request, as ``runserver`` does).

``python -m testproject.serve --reload [--port N]`` (what ``./dev serve`` runs) is
``manage.py runserver`` with its autoreloader, made to stop on SIGINT: a shell without job
control (a script, ``./dev serve &``) starts its children with SIGINT ignored, and then
Ctrl-C or ``kill -INT`` reached neither the reloader nor the server it runs as a child.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m testproject.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--exit-with-parent", action="store_true", help="exit when stdin closes")
    parser.add_argument("--threads", type=int, default=0, help="requests served at once (default 0: no limit)")
    parser.add_argument("--reload", action="store_true", help="manage.py runserver with its autoreloader (./dev serve)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: expected 0..65535")
    if args.threads < 0:
        parser.error(f"--threads {args.threads}: expected 0 (no limit) or more")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    if args.reload:
        return runserver(args.host, args.port or 8000)
    import django

    django.setup()
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    application = get_wsgi_application()
    server_class = bounded(ThreadedWSGIServer, args.threads) if args.threads else ThreadedWSGIServer
    try:
        server = server_class((args.host, args.port), WSGIRequestHandler, ipv6=":" in args.host)
    except OSError as exc:
        print(f"django: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    server.set_app(application)

    if args.exit_with_parent:
        from testproject.upstream import exit_with_parent

        exit_with_parent()

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"django listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


def bounded(server_class: type[Any], threads: int) -> type[Any]:
    """*server_class* (a ``ThreadingMixIn`` server) serving at most *threads* requests at
    once: the accept loop takes a free thread before it accepts the next connection, so a
    request arriving while every thread is busy waits in the listen queue, as it would for
    a worker with a fixed pool of request threads."""
    slots = threading.BoundedSemaphore(threads)

    class Bounded(server_class):  # type: ignore[misc, valid-type]
        def process_request(self, request: Any, client_address: Any) -> None:
            slots.acquire()
            try:
                super().process_request(request, client_address)
            except BaseException:
                slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                slots.release()

    return Bounded


def runserver(host: str, port: int) -> int:
    """``manage.py runserver HOST:PORT`` with the autoreloader; stops on SIGINT.

    The reloader (this process) restarts the server as a child process running this same
    module. SIGINT raises KeyboardInterrupt here whatever disposition we inherited, so a
    SIGINT to this process ends it, and on its way out the reloader ends the child; a
    Ctrl-C to the whole process group stops both directly.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "runserver", f"{host}:{port}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
