"""HTTP and errors shared by the demo's modules (``testproject.demo`` and its phases)."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class SetupError(RuntimeError):
    """The servers could not be started or did not become ready."""


@dataclass
class Reply:
    """One HTTP exchange: ``status`` None when no answer came (``error`` says why)."""

    status: int | None
    data: Any
    seconds: float
    error: str = ""


def http_call(
    method: str, url: str, body: Any = None, timeout: float = 15.0, headers: dict[str, str] | None = None
) -> Reply:
    """One request on a fresh connection; JSON in and out, with *headers* added. Never raises
    for network errors."""
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"Accept": "application/json", **(headers or {})}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    started = time.perf_counter()
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        elapsed = time.perf_counter() - started
    except (OSError, http.client.HTTPException) as exc:
        return Reply(None, None, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    return Reply(response.status, data, elapsed)
