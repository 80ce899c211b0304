"""Cluster state propagation: OPEN and CLOSED decisions shared over Redis pub/sub.

Without propagation every worker process has to see enough failures of its own before
its breaker trips. With it, the worker that decides an OPEN or a CLOSED (an automatic
transition, a force, the rare release or lapse that lands in one of the two) publishes
that decision on one Redis pub/sub channel, and every other process applies it to its
own breaker of the same name at once, with trigger ``propagated``
(:meth:`~baldur_django.core.breaker.CircuitBreaker.apply_peer`).

How it is built, and what it promises:

* **Publishing never touches the caller.** A listener on the event bus
  (:class:`Propagator` itself) turns a decision into a small tuple and hands it to a
  bounded queue with ``put_nowait``; a background thread publishes it. A full queue drops
  the decision (counted in :attr:`Propagator.dropped`, logged as
  ``circuit_breaker.propagation_dropped``); a failed publish drops it too (counted in
  :attr:`Propagator.publish_failures`). Nothing is retried or replayed.
* **One subscriber thread per process**, a daemon, started by :func:`install` (and so by
  ``BaldurDjangoConfig.ready()`` when ``BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED`` is
  on), never on a request. It waits for messages without a read timeout (a quiet
  channel is normal; ``BALDUR_REDIS_SOCKET_TIMEOUT`` does not apply): it sends its own
  ``PING`` after ``health_interval`` seconds of silence (at most 5 s) and gives the
  connection up when no answer comes within as long again (connecting and the
  connection handshake are bounded by the same interval). It then
  reconnects with capped, jittered exponential backoff and subscribes again. Losing the
  subscription is logged once (``circuit_breaker.propagation_lost``, WARNING), getting
  it back once (``circuit_breaker.propagation_restored``, INFO). Decisions published
  during the gap are not replayed: a shared store's sync interval covers them.
* **No echo.** Every process has an origin id (a fresh one after a fork) carried by its
  messages; a process skips its own messages, and a transition applied from a peer
  (trigger ``propagated``) is never published. One decision is one message.
* **Forces.** A peer's OPEN meets a local forced-closed breaker as a trip does: refused,
  ``circuit_breaker.trip_blocked`` (trigger ``propagated``). A peer's CLOSED is applied
  even over a local forced open (``circuit_breaker.propagation_lifted_force``, WARNING):
  the documented hazard. With a shared store the force also lives in the shared record
  and the worker takes it back on its next call; on the memory backend it is gone.
* **Emergency Level 3** does not stop a peer's decision from being applied: catching up
  with a decision already taken is adoption, not a new automatic decision.
* **Fork safety.** Threads do not survive ``fork()``. A process forked after its parent
  started propagation (gunicorn ``--preload``, Celery prefork) gets a new origin, a new
  queue and new locks, starts its own threads and opens its own connections; it never
  uses (nor closes) a connection its parent opened (``os.register_at_fork``, plus a pid
  check on the listener).
* **Malformed messages and unknown services** are ignored and logged at DEBUG
  (``circuit_breaker.propagation_ignored``); only breakers this process already knows
  are touched.

The channel is ``<prefix>:propagation:<db>`` (``baldur:propagation:0`` by default): the
Redis database number is part of it because pub/sub ignores databases, and deployments
that keep their state apart by database should not hear each other's decisions.

Message format (JSON, UTF-8): ``{"v": 1, "origin": <hex id of the sending process>,
"seq": <its message counter>, "service": <breaker name>, "state": "open" | "closed",
"trigger": <what caused the decision>, "at": <Unix time of the decision, seconds>}``.

Usable without Django: :func:`install` reads ``BALDUR_REDIS_URL`` from the environment
(``redis`` is imported only when a client is built).
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import random
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from ..core.breaker import PEER_APPLIED, PEER_BLOCKED, PEER_LIFTED, PEER_UNCHANGED
from ..core.config import SettingsSource
from ..core.config import settings as default_settings
from ..core.errors import ConfigError
from ..core.events import Event, EventBus, Forced, ForceLapsed, Released, StateChanged
from ..core.events import bus as default_bus
from ..core.log import log_event
from ..core.outbox import Outbox
from ..core.registry import Registry
from ..core.registry import registry as default_registry
from ..core.states import Trigger
from ..core.sync import describe

__all__ = [
    "SETTING",
    "DEFAULT_PREFIX",
    "HEALTH_INTERVAL",
    "Propagator",
    "channel_name",
    "decision_of",
    "encode",
    "decode",
    "install",
    "uninstall",
    "get_propagator",
    "configure",
    "configure_or_log",
]

_config_log = logging.getLogger("baldur.config")

SETTING = "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED"
#: Prefix of the channel name (``<prefix>:propagation:<db>``) used by :func:`configure`.
DEFAULT_PREFIX = "baldur"
#: Longest silence (seconds) before the subscriber checks its connection with a PING;
#: the answer must come within as long again.
HEALTH_INTERVAL = 5.0
#: Message format version; messages of another version are ignored.
VERSION = 1
#: Longer messages are ignored unread (a breaker name is at most a few hundred characters).
MAX_MESSAGE_BYTES = 65536
#: Settings whose change restarts the propagator (:func:`configure`).
RESTART_SETTINGS = (
    SETTING,
    "BALDUR_REDIS_URL",
    "BALDUR_REDIS_CACHE_ALIAS",
    "BALDUR_REDIS_SOCKET_TIMEOUT",
    "BALDUR_REDIS_CLUSTER",
)

_DECISIONS = ("open", "closed")
_PING = "baldur-propagation"
_STOP = object()

#: ``factory(read_timeout_seconds_or_None) -> redis.Redis``: a new client, no connection opened.
ClientFactory = Callable[[float | None], Any]


class _ConnectionDead(Exception):
    """The subscriber's connection stopped answering (health check)."""


# ------------------------------------------------------------------ the protocol


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
      closed stays CLOSED), and then nothing is published.
    """
    if isinstance(event, StateChanged):
        if event.trigger == Trigger.PROPAGATED:
            return None
        return event.to_state if event.to_state in _DECISIONS else None
    if isinstance(event, Forced):
        return event.to_state if event.to_state in _DECISIONS else None
    if isinstance(event, (Released, ForceLapsed)) and event.to_state != event.from_state:
        return event.to_state if event.to_state in _DECISIONS else None
    return None


def _trigger_of(event: Event) -> str:
    if isinstance(event, StateChanged):
        return event.trigger
    if isinstance(event, Forced):
        return Trigger.FORCED
    if isinstance(event, Released):
        return Trigger.RELEASED
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
    if state not in _DECISIONS:
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


def _db_of(client: Any) -> int:
    """The database number a redis-py client selects (0 when it cannot tell, e.g. a cluster)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    try:
        return int(kwargs.get("db") or 0)
    except (TypeError, ValueError):
        return 0


def _close(client: Any) -> None:
    """Close a client of this process (redis-py never shuts down a socket of another pid)."""
    if client is None:
        return
    try:
        client.close()
    except Exception:
        pass


def _default_factory(read_timeout: float | None) -> Any:
    from ..backends import pubsub_client

    return pubsub_client(read_timeout)


# ------------------------------------------------------------------ the propagator


class Propagator:
    """Publisher and subscriber of one process for cluster propagation.

    Subscribe an instance to an event bus (it is the listener) and :meth:`start` it;
    :func:`install` does both for the process-wide bus and registry.

    Args:
        client_factory: ``factory(socket_timeout) -> redis.Redis`` building a new client
            (no connection opened). The publisher's is called with
            ``BALDUR_REDIS_SOCKET_TIMEOUT``, like every connection the package opens. The
            subscriber's is called with *health_interval*: that bounds connecting and the
            connection handshake (a server that accepts and never answers), never the wait
            for a message, which polls the socket (a quiet channel is normal) and relies
            on the PING health check. Default: :func:`baldur_django.backends.pubsub_client`
            (``BALDUR_REDIS_URL`` or the django-redis alias).
        prefix (str): channel prefix, see :func:`channel_name`.
        channel (str | None): the exact channel name (overrides *prefix*).
        registry (Registry): where peers' decisions are applied (the process-wide one).
        source (SettingsSource): settings to read timeouts and warning intervals from.
        max_queue (int): decisions that may wait for the publisher; more are dropped.
        health_interval (float): seconds of silence before the subscriber's PING, and
            the time its answer may take; > 0 and at most 5.
        backoff_initial (float): first wait between reconnect attempts, seconds (then
            doubling, with jitter); > 0 and at most 5.
        backoff_max (float): longest wait between reconnect attempts, seconds.

    Raises:
        ConfigError: a bad argument, or no Redis configured (from the default factory).

    Attributes:
        origin (str): this process's id in messages (new after a fork).
        channel (str): the channel used.
        published, dropped, publish_failures (int): decisions sent, dropped on a full
            queue, lost to a failed publish.
        received, applied, unchanged, blocked, lifted, ignored, own (int): messages read,
            and what became of them (see :meth:`CircuitBreaker.apply_peer`; ``ignored``:
            malformed or unknown service; ``own``: this process's own, skipped).
        subscriptions, losses, failed_attempts (int): confirmed subscriptions, logged
            losses, and connection attempts that failed (backoff in between).
        subscriber_address (tuple | None): local address of the subscriber's socket while
            subscribed (diagnostics: find it in ``CLIENT LIST``).
    """

    wants_rejections = False  # decisions only: never asks the OPEN hot path for rejection events

    def __init__(
        self,
        client_factory: ClientFactory | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        channel: str | None = None,
        registry: Registry | None = None,
        source: SettingsSource | None = None,
        max_queue: int = 1000,
        health_interval: float = HEALTH_INTERVAL,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ConfigError(f"max_queue={max_queue!r}: must be a whole number >= 1")
        for name, value in (("health_interval", health_interval), ("backoff_initial", backoff_initial)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= HEALTH_INTERVAL:
                raise ConfigError(f"{name}={value!r}: must be more than 0 and at most {HEALTH_INTERVAL:g} seconds")
        if isinstance(backoff_max, bool) or not isinstance(backoff_max, (int, float)) or backoff_max < backoff_initial:
            raise ConfigError(f"backoff_max={backoff_max!r}: must be a number of seconds >= backoff_initial")
        self._factory: ClientFactory = client_factory or _default_factory
        self._registry = registry or default_registry
        self._source = source or default_settings
        self.max_queue = max_queue
        self.health_interval = float(health_interval)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        if channel is None:
            probe = self._factory(None)  # builds a client, opens no connection
            try:
                channel = channel_name(prefix, _db_of(probe))
            finally:
                _close(probe)
        elif not isinstance(channel, str) or not channel:
            raise ConfigError(f"channel={channel!r}: must be a non-empty string")
        self.channel = channel
        self.published = self.dropped = self.publish_failures = 0
        self.received = self.applied = self.unchanged = self.blocked = self.lifted = 0
        self.ignored = self.own = 0
        self.subscriptions = self.losses = self.failed_attempts = 0
        self._started = False
        self._init_runtime()
        _instances.add(self)

    def _init_runtime(self) -> None:
        """Everything that belongs to one process: ids, queue, locks, threads (new after a fork)."""
        self._pid = os.getpid()
        self.origin = uuid.uuid4().hex
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._queue = Outbox(self.max_queue)
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._sender: threading.Thread | None = None
        self._subscriber: threading.Thread | None = None
        self._sub_client: Any = None  # the subscriber's current client (of this process only)
        self._pub_client: Any = None  # the publisher's, likewise
        self._lost = False
        self._delay = self.backoff_initial
        self._warned_at: float | None = None
        self.in_flight = False  # the publisher is inside a publish round trip right now
        self.subscriber_address: tuple[Any, ...] | None = None

    def __repr__(self) -> str:
        return (
            f"<Propagator channel={self.channel!r} origin={self.origin[:8]} running={self.running} "
            f"published={self.published} applied={self.applied} dropped={self.dropped}>"
        )

    # ----------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        """True while this process's subscriber thread runs."""
        thread = self._subscriber
        return self._pid == os.getpid() and thread is not None and thread.is_alive()

    @property
    def connected(self) -> bool:
        """True while the subscriber holds a confirmed subscription."""
        return self._connected.is_set()

    def start(self) -> Propagator:
        """Start the publisher and the subscriber threads (idempotent). Opens no connection
        on the calling thread. Returns self."""
        if self._pid != os.getpid():
            self.after_fork()
        with self._lock:
            self._started = True
            self._stop.clear()
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(
                    target=self._send_loop, args=(self._queue, self._stop), name="baldur-propagation-publisher"
                )
                self._sender.daemon = True
                self._sender.start()
            if self._subscriber is None or not self._subscriber.is_alive():
                self._subscriber = threading.Thread(
                    target=self._listen_loop, args=(self._stop,), name="baldur-propagation-subscriber"
                )
                self._subscriber.daemon = True
                self._subscriber.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop both threads: decisions still queued are published first (within *timeout*
        seconds), the subscription is closed. Safe to call more than once."""
        if self._pid != os.getpid():
            self.after_fork()
            self._started = False
            return
        with self._lock:
            self._started = False
            sender, subscriber = self._sender, self._subscriber
        self.flush(timeout)
        self._stop.set()
        self._queue.offer(_STOP)  # when full, the sender sees the stop flag after its current item
        for client in (self._sub_client, self._pub_client):
            if client is not None:
                try:
                    client.connection_pool.disconnect()  # wakes a thread blocked in a read
                except Exception:
                    pass
        for thread in (sender, subscriber):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        self._connected.clear()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until the subscriber holds a confirmed subscription; False after *timeout* s."""
        return self._connected.wait(timeout)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued decision was published, failed or dropped.

        Returns:
            True when the queue drained within *timeout* seconds.
        """
        return self._queue.drained(timeout)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's threads, queue, locks and connections
        (never closing them: they belong to the parent) and, if the parent had started
        propagation, start this process's own."""
        was_started = self._started
        self._init_runtime()
        self._started = False
        if was_started:
            self.start()

    def stats(self) -> dict[str, Any]:
        """Counters and status as a dict (for ``baldur_status``-style reports and tests)."""
        return {
            "channel": self.channel,
            "origin": self.origin,
            "running": self.running,
            "connected": self.connected,
            "queued": self._queue.qsize(),
            "published": self.published,
            "dropped": self.dropped,
            "publish_failures": self.publish_failures,
            "received": self.received,
            "applied": self.applied,
            "unchanged": self.unchanged,
            "blocked": self.blocked,
            "lifted": self.lifted,
            "ignored": self.ignored,
            "own": self.own,
            "subscriptions": self.subscriptions,
            "losses": self.losses,
            "failed_attempts": self.failed_attempts,
        }

    # ---------------------------------------------------------------- publishing
    def __call__(self, event: Event) -> None:
        """Bus listener: queue this process's OPEN/CLOSED decisions. Never blocks, never raises."""
        try:
            state = decision_of(event)
            if state is None:
                return
            if self._pid != os.getpid():
                self.after_fork()
            self.enqueue(event.service, state, _trigger_of(event), event.at)
        except Exception as exc:  # the bus contains listener errors too; say which part failed
            log_event(logging.ERROR, "circuit_breaker.propagation_dropped", event.service, "error=%s", describe(exc))

    def enqueue(self, service: str, state: str, trigger: str = "", at: float | None = None) -> bool:
        """Hand one decision to the publisher thread (``put_nowait``).

        Args:
            service (str): breaker name.
            state (str): ``"open"`` or ``"closed"``.
            trigger (str): what caused it.
            at (float | None): Unix time of the decision; None: now.

        Returns:
            bool: False when the queue was full and the decision was dropped (counted, logged).
        """
        if not self._queue.offer((service, state, trigger, time.time() if at is None else at)):
            with self._lock:
                self.dropped += 1
            self._warn_drop(service, f"the publish queue is full ({self.max_queue} waiting)")
            return False
        return True

    def _send_loop(self, q: Outbox, stop: threading.Event) -> None:
        client: Any = None
        try:
            while True:
                item = q.get()
                if item is _STOP:
                    q.task_done()
                    return
                try:
                    if client is None:
                        client = self._factory(self._source.get("BALDUR_REDIS_SOCKET_TIMEOUT"))
                        self._pub_client = client
                    service, state, trigger, at = item
                    payload = encode(self.origin, next(self._seq), service, state, trigger, at)
                    self.in_flight = True
                    client.publish(self.channel, payload)
                    self.published += 1
                except Exception as exc:  # Redis down, timing out, refusing...: this decision is lost
                    self.publish_failures += 1
                    _close(client)
                    client = self._pub_client = None
                    self._warn_drop(item[0], f"publish failed: {describe(exc)}")
                finally:
                    self.in_flight = False
                    q.task_done()
                if stop.is_set() and q.empty():
                    return
        finally:
            self._pub_client = None
            _close(client)

    def _warn_drop(self, service: str, why: str) -> None:
        """``circuit_breaker.propagation_dropped`` at most once per
        ``BALDUR_STORE_WARNING_INTERVAL_SECONDS``."""
        now = time.monotonic()
        try:
            interval = float(self._source.get("BALDUR_STORE_WARNING_INTERVAL_SECONDS"))
        except ConfigError:
            interval = 60.0
        with self._lock:
            if self._warned_at is not None and now - self._warned_at < interval:
                return
            self._warned_at = now
        log_event(
            logging.WARNING,
            "circuit_breaker.propagation_dropped",
            service,
            "channel=%s reason=%s dropped=%d publish_failures=%d",
            self.channel,
            why,
            self.dropped,
            self.publish_failures,
            channel=self.channel,
        )

    # --------------------------------------------------------------- subscribing
    def _listen_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            client = pubsub = None
            try:
                client = self._factory(self.health_interval)  # bounds connecting, never a wait for messages
                self._sub_client = client
                if stop.is_set():
                    return
                pubsub = client.pubsub()
                pubsub.subscribe(self.channel)  # connects, then sends SUBSCRIBE (confirmed in _listen)
                self._listen(pubsub, stop)
            except Exception as exc:
                self._connected.clear()
                self.subscriber_address = None
                if stop.is_set():
                    return
                self.failed_attempts += 1
                self._on_lost(exc)
                stop.wait(self._delay * random.uniform(0.5, 1.0))
                self._delay = min(self._delay * 2, self.backoff_max)
            finally:
                self._sub_client = None
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        pass
                _close(client)
        self._connected.clear()

    def _listen(self, pubsub: Any, stop: threading.Event) -> None:
        """Read messages until stopped; raise when the connection is lost or stops answering."""
        interval = self.health_interval
        poll = min(0.5, interval / 2)
        heard = time.monotonic()
        pinged: float | None = None
        while not stop.is_set():
            message = pubsub.get_message(timeout=poll)
            now = time.monotonic()
            if message is not None:
                heard, pinged = now, None
                kind = message.get("type")
                if kind == "message":
                    self._receive(message.get("data"))
                elif kind == "subscribe":
                    self._on_subscribed(pubsub)
            elif pinged is None:
                if now - heard >= interval:
                    pubsub.ping(_PING)  # answered by a "pong" message
                    pinged = now
            elif now - pinged >= interval:
                raise _ConnectionDead(f"no answer to PING within {interval:g} s")

    def _on_subscribed(self, pubsub: Any) -> None:
        self.subscriptions += 1
        self._delay = self.backoff_initial
        try:
            # redis-py offers no public accessor for the subscriber's socket: the address is
            # informational only, and any change there lands in the except below
            sock = pubsub.connection._sock  # noqa: SLF001, RUF100
            self.subscriber_address = tuple(sock.getsockname()) if sock is not None else None
        except Exception:
            self.subscriber_address = None
        self._connected.set()
        if self._lost:
            self._lost = False
            log_event(
                logging.INFO,
                "circuit_breaker.propagation_restored",
                None,
                "channel=%s: subscribed again; decisions published meanwhile are not replayed",
                self.channel,
                channel=self.channel,
            )

    def _on_lost(self, exc: BaseException) -> None:
        if self._lost:
            return
        self._lost = True
        log_event(
            logging.WARNING,
            "circuit_breaker.propagation_lost",
            None,
            "channel=%s error=%s: peers' decisions are not received until the subscription is back",
            self.channel,
            describe(exc),
            channel=self.channel,
        )
        self.losses += 1  # after the line: whoever sees the count finds the loss logged

    def _receive(self, data: Any) -> None:
        """Apply one message from the channel (subscriber thread)."""
        self.received += 1
        try:
            message = decode(data)
        except ValueError as exc:
            self.ignored += 1
            log_event(logging.DEBUG, "circuit_breaker.propagation_ignored", None, "reason=%s", exc, reason=str(exc))
            return
        if message["origin"] == self.origin:
            self.own += 1
            return
        service = message["service"]
        try:
            breaker = self._registry.get(service, create=False)
            if breaker is None:
                self.ignored += 1
                log_event(
                    logging.DEBUG,
                    "circuit_breaker.propagation_ignored",
                    service,
                    "reason=unknown service",
                    reason="unknown service",
                )
                return
            outcome = breaker.apply_peer(message["state"])
        except Exception as exc:  # never let one message end the subscription
            self.ignored += 1
            log_event(logging.ERROR, "circuit_breaker.propagation_ignored", service, "error=%s", describe(exc))
            return
        if outcome == PEER_APPLIED:
            self.applied += 1
        elif outcome == PEER_UNCHANGED:
            self.unchanged += 1
        elif outcome == PEER_BLOCKED:
            self.blocked += 1
        elif outcome == PEER_LIFTED:
            self.lifted += 1
            log_event(
                logging.WARNING,
                "circuit_breaker.propagation_lifted_force",
                service,
                "origin=%s: a peer's CLOSED lifted this worker's forced open",
                message["origin"],
                from_state="open",
                to_state="closed",
                trigger=Trigger.PROPAGATED,
            )


# ------------------------------------------------------------ process-wide use

_instances: weakref.WeakSet[Propagator] = weakref.WeakSet()
_propagator: Propagator | None = None
_signature: tuple[Any, ...] | None = None
_install_lock = threading.RLock()
_bus: EventBus = default_bus


def _after_fork_in_child() -> None:
    global _install_lock
    _install_lock = threading.RLock()  # the parent's may have been held by a thread that is gone
    for instance in list(_instances):
        instance.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _flush_at_exit() -> None:
    propagator = _propagator
    if propagator is not None and propagator.running:
        propagator.flush(timeout=1.0)


atexit.register(_flush_at_exit)


def get_propagator() -> Propagator | None:
    """The process-wide propagator started by :func:`install` or :func:`configure`, or None."""
    return _propagator


def install(client_factory: ClientFactory | None = None, **options: Any) -> Propagator:
    """Start propagation for this process: a :class:`Propagator` subscribed to the
    process-wide event bus, applying peers' decisions to the process-wide registry.

    Replaces a propagator installed before. Use it directly in a plain Python process
    (``BALDUR_REDIS_URL`` in the environment); Django projects turn on
    ``BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED`` instead (:func:`configure`).

    Args:
        client_factory: see :class:`Propagator` (default: ``BALDUR_REDIS_URL`` or the
            django-redis alias).
        **options: further :class:`Propagator` arguments (``prefix``, ``channel``,
            ``max_queue``, ``health_interval``, ...).

    Returns:
        Propagator: running (its threads connect in the background).

    Raises:
        ConfigError: bad options, or no Redis configured; nothing is started.
    """
    global _propagator, _signature
    with _install_lock:
        fresh = Propagator(client_factory, **options)
        uninstall()
        _propagator = fresh
        _signature = None
        _bus.subscribe(fresh)
        return fresh.start()


def uninstall(timeout: float = 2.0) -> None:
    """Stop the process-wide propagator (if any) and unsubscribe it from the bus."""
    global _propagator, _signature
    with _install_lock:
        propagator, _propagator = _propagator, None
        _signature = None
    if propagator is not None:
        _bus.unsubscribe(propagator)
        propagator.stop(timeout)


def configure(client_factory: ClientFactory | None = None, *, prefix: str | None = None) -> Propagator | None:
    """Make this process follow ``BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED``.

    On: start propagation (restarted when a Redis setting changed since); off: stop it.
    ``BaldurDjangoConfig.ready()`` calls it at startup and after every settings reload.

    Args:
        client_factory: see :class:`Propagator`.
        prefix (str | None): channel prefix; None uses :data:`DEFAULT_PREFIX`.

    Returns:
        The running propagator, or None when the setting is off.

    Raises:
        ConfigError: the setting is on but no Redis is configured (system check
            ``baldur.E009`` says the same), or a setting is invalid.
    """
    global _signature
    source = default_settings
    with _install_lock:
        if not source.get(SETTING):
            uninstall()
            return None
        signature = (*(source.get(name) for name in RESTART_SETTINGS), prefix or DEFAULT_PREFIX, client_factory)
        current = _propagator
        if current is not None and current.running and signature == _signature:
            return current
        started = install(client_factory, prefix=prefix or DEFAULT_PREFIX)
        _signature = signature
        return started


def configure_or_log(client_factory: ClientFactory | None = None) -> Propagator | None:
    """:func:`configure`, logging a configuration problem (ERROR, logger ``baldur.config``)
    instead of raising: for ``AppConfig.ready()`` and the settings-reload hook. Returns
    the running propagator or None."""
    try:
        return configure(client_factory)
    except ConfigError as exc:
        uninstall()
        from ..conf import redact

        _config_log.error(
            "baldur_django cluster propagation is not running: %s. Run `manage.py check` for a hint.",
            redact(str(exc)),
            extra={"setting": SETTING},
        )
        return None
