"""Fixtures of the operator tests: the audit listener, users, a stand-in Slack webhook."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from baldur_django import services
from baldur_django.core.events import bus


@pytest.fixture
def audit(db):
    """The audit listener on the bus for this test (left in place if ready() installed it)."""
    had = services.audit_listener in bus.listeners
    services.install_audit_listener()
    yield
    if not had:
        services.uninstall_audit_listener()


@pytest.fixture
def audit_rows():
    """Returns the audit rows as plain dicts, oldest first."""
    from baldur_django.models import BreakerAudit

    def rows(**filters: Any) -> list[dict[str, Any]]:
        return list(BreakerAudit.objects.filter(**filters).order_by("id").values())

    return rows


@dataclass
class Reply:
    """One scripted answer of the fake webhook."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    block: threading.Event | None = None  # wait for this before answering


@pytest.fixture(scope="session")
def tls_certificate(tmp_path_factory):
    """A throwaway self-signed certificate for 127.0.0.1 (``openssl``): (cert path, key path)."""
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class FakeWebhook:
    """A real HTTPS server on 127.0.0.1 standing in for Slack's incoming webhook (OP-8 wants
    ``https://``), with the certificate of :func:`tls_certificate`.

    ``replies`` is a list consumed in order (then 200s). ``requests`` records
    ``(path, json_body)``; ``entered`` is set each time a handler starts.
    """

    def __init__(self, cert: str, key: str) -> None:
        self.replies: list[Reply] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.entered = threading.Event()
        self.finished = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length).decode("utf-8"))
                with outer.lock:
                    outer.requests.append((self.path, body))
                    reply = outer.replies.pop(0) if outer.replies else Reply()
                outer.entered.set()
                if reply.block is not None:
                    reply.block.wait(30)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client gave up (timeout test)
                outer.finished.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        host, port = self.server.server_address[:2]
        self.url = f"https://{host}:{port}/services/T0SECRET/B0SECRET/xoxSECRETTOKEN"

    @property
    def texts(self) -> list[str]:
        with self.lock:
            return [body["text"] for _path, body in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(tls_certificate, monkeypatch):
    """The fake webhook; HTTPS clients of this test trust its certificate (``SSL_CERT_FILE``)."""
    cert, key = tls_certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    hook = FakeWebhook(str(cert), str(key))
    yield hook
    hook.close()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Users made by these tests hash passwords with MD5 (speed only; tests never ship)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
