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
import logging
import os
import threading
from typing import Any

from ..core.config import settings as default_settings
from ..core.errors import ConfigError
from ..core.events import EventBus
from ..core.events import bus as default_bus
from .propagation_wire import (
    DEFAULT_PREFIX,
    HEALTH_INTERVAL,
    MAX_MESSAGE_BYTES,
    VERSION,
    ClientFactory,
    channel_name,
    decision_of,
    decode,
    encode,
)
from .propagator import INSTANCES, Propagator

__all__ = [
    "SETTING",
    "DEFAULT_PREFIX",
    "HEALTH_INTERVAL",
    "VERSION",
    "MAX_MESSAGE_BYTES",
    "ClientFactory",
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
#: Settings whose change restarts the propagator (:func:`configure`).
RESTART_SETTINGS = (
    SETTING,
    "BALDUR_REDIS_URL",
    "BALDUR_REDIS_CACHE_ALIAS",
    "BALDUR_REDIS_SOCKET_TIMEOUT",
    "BALDUR_REDIS_CLUSTER",
)


# ------------------------------------------------------------ process-wide use

_propagator: Propagator | None = None
_signature: tuple[Any, ...] | None = None
_install_lock = threading.RLock()
_bus: EventBus = default_bus


def _after_fork_in_child() -> None:
    global _install_lock
    _install_lock = threading.RLock()  # the parent's may have been held by a thread that is gone
    for instance in list(INSTANCES):
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
