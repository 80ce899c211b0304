"""The report of every effective setting, secrets hidden."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..core.config import settings
from ..core.knobs import SECRETS

_HIDDEN = SECRETS  # knobs marked secret in the knobs table
_URLS_WITH_PASSWORDS = {"BALDUR_REDIS_URL"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (frozenset, set)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _mask_password(url: str) -> str:
    try:
        parts = urlsplit(url)
        if parts.password:
            host = parts.hostname or ""
            if parts.port:
                host = f"{host}:{parts.port}"
            user = parts.username or ""
            return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return "<hidden>"
    return url


def config_report() -> list[dict[str, Any]]:
    """Every ``BALDUR_*`` knob's effective value and where it came from.

    Returns:
        ``[{"name": str, "value": JSON-able, "source": "setting" | "env" | "default" |
        "error"}, ...]`` in the order of the defaults table. Secrets are not shown: the
        Slack webhook URL reads ``"<set, hidden>"`` and a Redis URL's password ``***``.
        An invalid value has source ``"error"`` and the error text as its value.
    """
    rows = []
    for name, value, source in settings.report():
        if name in _HIDDEN and value is not None:
            value = "<invalid, hidden>" if source == "error" else "<set, hidden>"
        elif name in _URLS_WITH_PASSWORDS and isinstance(value, str):
            value = "<invalid, hidden>" if source == "error" else _mask_password(value)
        rows.append({"name": name, "value": _jsonable(value), "source": source})
    return rows
