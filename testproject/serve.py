"""Serve the test project with Django's threaded development server (used by the demo).

``python -m testproject.serve [--host H] [--port N] [--exit-with-parent]`` runs the
same WSGI server as ``manage.py runserver --noreload``, but ``--port 0`` picks a free
port and the line ``django listening on http://HOST:PORT`` is printed on stdout once
connections are accepted, so a parent process knows where to go without guessing a
free port. ``--exit-with-parent`` ends the server when stdin closes. For everyday use
run ``./dev serve`` (``manage.py runserver``) instead.
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
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    application = get_wsgi_application()
    try:
        server = ThreadedWSGIServer((args.host, args.port), WSGIRequestHandler, ipv6=":" in args.host)
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


if __name__ == "__main__":
    sys.exit(main())
