"""The wire format of cluster propagation: the channel name, which events publish a
decision, and the encoding and checking of one message (see
:mod:`baldur_django.contrib.propagation`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..core.errors import ConfigError
from ..core.events import Event, Forced, ForceLapsed, Released, Reset, StateChanged
from ..core.states import Trigger

#: Prefix of the channel name (``<prefix>:propagation:<db>``) used by :func:`configure`.
DEFAULT_PREFIX = "baldur"
#: Longest silence (seconds) before the subscriber checks its connection with a PING;
#: the answer must come within as long again.
HEALTH_INTERVAL = 5.0
#: Message format version; messages of another version are ignored.
VERSION = 1
#: Longer messages are ignored unread (a breaker name is at most a few hundred characters).
MAX_MESSAGE_BYTES = 65536
#: The states a message may carry.
DECISIONS = ("open", "closed")

#: ``factory(read_timeout_seconds_or_None) -> redis.Redis``: a new client, no connection opened.
ClientFactory = Callable[[float | None], Any]


def channel_name(prefix: str = DEFAULT_PREFIX, db: int = 0) -> str:
    """The pub/sub channel of a deployment: ``<prefix>:propagation:<db>``.

    Args:
        prefix (str): a non-empty name shared by every process of the deployment.
        db (int): the Redis database number of the configured connection.

    Raises:
        ConfigError: empty or non-string prefix.
    """
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"prefix={prefix!r}: the propagation channel prefix must be a non-empty string")
    return f"{prefix}:propagation:{int(db)}"


def decision_of(event: Event) -> str | None:
    """The decision an event of this process publishes: ``"open"``, ``"closed"`` or None.

    * a transition (``StateChanged``) into OPEN or CLOSED, unless it was itself applied
      from a peer (trigger ``propagated``): those are never sent on (no echo);
    * a force (``Forced``): the state it left the breaker in;
    * a release or a lapse (``Released``, ``ForceLapsed``) only when it moved the breaker
      into OPEN or CLOSED; usually it does not (a forced open goes to HALF_OPEN, a forced
      closed stays CLOSED), and then nothing is published;
    * a reset (``Reset``) of a breaker that was not CLOSED: ``"closed"``.
    """
    if isinstance(event, StateChanged):
        if event.trigger == Trigger.PROPAGATED:
            return None
        return event.to_state if event.to_state in DECISIONS else None
    if isinstance(event, Forced):
        return event.to_state if event.to_state in DECISIONS else None
    if isinstance(event, (Released, ForceLapsed, Reset)) and event.to_state != event.from_state:
        return event.to_state if event.to_state in DECISIONS else None
    return None


def trigger_of(event: Event) -> str:
    if isinstance(event, StateChanged):
        return event.trigger
    if isinstance(event, Forced):
        return Trigger.FORCED
    if isinstance(event, Released):
        return Trigger.RELEASED
    if isinstance(event, Reset):
        return Trigger.RESET
    return Trigger.FORCE_LAPSED


def encode(origin: str, seq: int, service: str, state: str, trigger: str, at: float) -> bytes:
    """One message of the format in the module docstring, as UTF-8 JSON bytes."""
    return json.dumps(
        {"v": VERSION, "origin": origin, "seq": seq, "service": service, "state": state, "trigger": trigger, "at": at},
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")


def decode(data: Any) -> dict[str, Any]:
    """Parse and check one message (bytes or str).

    Returns:
        dict: at least ``origin`` (str), ``service`` (non-empty str), ``state``
        (``"open"``/``"closed"``), ``trigger`` (str) and ``at`` (float or None).

    Raises:
        ValueError: not a message of this format; the text says what is wrong.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"payload of type {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"payload of {len(data)} bytes, more than {MAX_MESSAGE_BYTES}")
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(message, dict):
        raise ValueError(f"a JSON {type(message).__name__}, not an object")
    if message.get("v") != VERSION:
        raise ValueError(f"format version {message.get('v')!r}, expected {VERSION}")
    origin, service, state = message.get("origin"), message.get("service"), message.get("state")
    if not isinstance(origin, str) or not origin:
        raise ValueError("no origin")
    if not isinstance(service, str) or not service:
        raise ValueError("no service name")
    if state not in DECISIONS:
        raise ValueError(f"state {state!r}, expected 'open' or 'closed'")
    trigger = message.get("trigger")
    at = message.get("at")
    return {
        "origin": origin,
        "service": service,
        "state": state,
        "trigger": trigger if isinstance(trigger, str) else "",
        "at": float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
        "seq": message.get("seq"),
    }


def db_of(client: Any) -> int:
    """The database number a redis-py client selects (0 when it cannot tell, e.g. a cluster)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    try:
        return int(kwargs.get("db") or 0)
    except (TypeError, ValueError):
        return 0


def close_client(client: Any) -> None:
    """Close a client of this process (redis-py never shuts down a socket of another pid)."""
    if client is None:
        return
    try:
        client.close()
    except Exception:
        pass


def default_factory(read_timeout: float | None) -> Any:
    from ..backends import pubsub_client

    return pubsub_client(read_timeout)
