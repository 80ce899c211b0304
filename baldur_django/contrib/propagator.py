"""The :class:`Propagator`: one process's publisher and subscriber of breaker decisions
(see :mod:`baldur_django.contrib.propagation`)."""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
import uuid
import weakref
from typing import Any

from ..core.config import SettingsSource
from ..core.config import settings as default_settings
from ..core.control import PEER_APPLIED, PEER_BLOCKED, PEER_LIFTED, PEER_UNCHANGED
from ..core.errors import ConfigError
from ..core.events import Event
from ..core.log import log_event
from ..core.outbox import Outbox
from ..core.registry import Registry
from ..core.registry import registry as default_registry
from ..core.states import Trigger
from ..core.sync import describe
from .propagation_wire import (
    DEFAULT_PREFIX,
    HEALTH_INTERVAL,
    ClientFactory,
    channel_name,
    close_client,
    db_of,
    decision_of,
    decode,
    default_factory,
    encode,
    trigger_of,
)

_PING = "baldur-propagation"
_STOP = object()


class _ConnectionDead(Exception):
    """The subscriber's connection stopped answering (health check)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_options(max_queue: Any, health_interval: Any, backoff_initial: Any, backoff_max: Any) -> None:
    """Refuse a bad queue size or timing argument of :class:`Propagator` (ConfigError)."""
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ConfigError(f"max_queue={max_queue!r}: must be a whole number >= 1")
    for name, value in (("health_interval", health_interval), ("backoff_initial", backoff_initial)):
        if not _is_number(value) or not 0 < value <= HEALTH_INTERVAL:
            raise ConfigError(f"{name}={value!r}: must be more than 0 and at most {HEALTH_INTERVAL:g} seconds")
    if not _is_number(backoff_max) or backoff_max < backoff_initial:
        raise ConfigError(f"backoff_max={backoff_max!r}: must be a number of seconds >= backoff_initial")


def _channel_for(factory: ClientFactory, prefix: str, channel: str | None) -> str:
    """*channel* when given (a non-empty string), else the prefix's channel on the database
    that *factory*'s clients select (a client is built for that, no connection opened)."""
    if channel is None:
        probe = factory(None)
        try:
            return channel_name(prefix, db_of(probe))
        finally:
            close_client(probe)
    if not isinstance(channel, str) or not channel:
        raise ConfigError(f"channel={channel!r}: must be a non-empty string")
    return channel


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
        _check_options(max_queue, health_interval, backoff_initial, backoff_max)
        self._factory: ClientFactory = client_factory or default_factory
        self._registry = registry or default_registry
        self._source = source or default_settings
        self.max_queue = max_queue
        self.health_interval = float(health_interval)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self.channel = _channel_for(self._factory, prefix, channel)
        self.published = self.dropped = self.publish_failures = 0
        self.received = self.applied = self.unchanged = self.blocked = self.lifted = 0
        self.ignored = self.own = 0
        self.subscriptions = self.losses = self.failed_attempts = 0
        self._started = False
        self._init_runtime()
        INSTANCES.add(self)

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
            self.enqueue(event.service, state, trigger_of(event), event.at)
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
                    close_client(client)
                    client = self._pub_client = None
                    self._warn_drop(item[0], f"publish failed: {describe(exc)}")
                finally:
                    self.in_flight = False
                    q.task_done()
                if stop.is_set() and q.empty():
                    return
        finally:
            self._pub_client = None
            close_client(client)

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
                close_client(client)
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


#: Every propagator of this process (each restarts its own threads in a forked child).
INSTANCES: weakref.WeakSet[Propagator] = weakref.WeakSet()
