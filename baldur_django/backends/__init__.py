"""State backends: build the configured shared store and hand it to the registry.

Like django-axes' ``handlers``: this package decides *where breaker state lives*.

* ``BALDUR_STATE_BACKEND = "memory"``: no shared store; every process keeps its own
  breakers.
* ``"database"``: :class:`baldur_django.backends.database.DatabaseStore`, the store
  protocol on the Django ORM (tables in :mod:`baldur_django.backends.models`, reachable
  from ``baldur_django.models`` for migrations).
* ``"redis"``: :class:`baldur_django.core.stores.redis.RedisStore` on ``BALDUR_REDIS_URL``,
  else on the django-redis cache alias ``BALDUR_REDIS_CACHE_ALIAS`` through
  ``django_redis.get_redis_connection``. With ``BALDUR_REDIS_CLUSTER``, ``BALDUR_REDIS_URL``
  names one node of a Redis Cluster and the client is redis-py's ``RedisCluster`` (the
  django-redis alias is not used: its clients do not speak the cluster protocol).
* any other value is the dotted path of a store class (``"myproject.stores.MyStore"``),
  imported with Django's ``import_string`` like a cache backend and called with no
  arguments. ``docs/stores.md`` describes the protocol such a class implements and
  how to run the contract suite against it.

:func:`install_store` is the one way a store is installed: ``BaldurDjangoConfig.ready()``
and the settings reload both call it. It reads settings from the core's settings
object directly, so ``conf`` imports this package and not the other way round.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.config import settings as baldur_settings
from ..core.errors import ConfigError

__all__ = [
    "STORE_SETTINGS",
    "BUNDLED_BACKENDS",
    "build_store",
    "install_store",
    "redis_client",
    "pubsub_client",
    "store_changed",
    "store_class",
]

#: The ``BALDUR_STATE_BACKEND`` values that name a bundled store; anything else is a dotted path.
BUNDLED_BACKENDS = ("memory", "database", "redis")

#: The knobs that decide which shared store the breakers use.
STORE_SETTINGS = (
    "BALDUR_STATE_BACKEND",
    "BALDUR_REDIS_URL",
    "BALDUR_REDIS_CACHE_ALIAS",
    "BALDUR_REDIS_SOCKET_TIMEOUT",
    "BALDUR_REDIS_MAX_CONNECTIONS",
    "BALDUR_REDIS_CLUSTER",
)
_lock = threading.RLock()
_installed: tuple[Any, ...] | None = None  # STORE_SETTINGS values of the store in use


def build_store() -> Any:
    """The store for the current settings, or None for the memory backend. Opens no connection.

    Returns:
        A ``StateStore`` (database, Redis or the class a dotted path names), or None for
        ``"memory"``.

    Raises:
        ConfigError: a store setting is invalid, the redis backend has neither a URL nor
            a usable django-redis alias, or a dotted path cannot be imported, is not a store
            class, or its class fails when called.
    """
    backend = baldur_settings.get("BALDUR_STATE_BACKEND")
    if backend == "memory":
        return None
    if backend == "database":
        from .database import DatabaseStore

        return DatabaseStore(record_ttl=baldur_settings.get("BALDUR_REGISTRY_IDLE_SECONDS"))
    if backend == "redis":
        from ..core.stores.redis import RedisStore

        return RedisStore(redis_client(), record_ttl=baldur_settings.get("BALDUR_REGISTRY_IDLE_SECONDS"))
    from django.utils.module_loading import import_string

    from ..core.stores.base import make_store

    return make_store(backend, importer=import_string)


def redis_client(purpose: str = "BALDUR_STATE_BACKEND='redis'") -> Any:
    """The redis-py client the Redis settings name: ``BALDUR_REDIS_URL`` (with the package's
    timeouts and pool size; a Redis Cluster client when ``BALDUR_REDIS_CLUSTER`` is true),
    else the django-redis cache ``BALDUR_REDIS_CACHE_ALIAS``. Opens no connection.

    Used by the redis state backend and by Emergency Mode's redis backend.

    Args:
        purpose (str): what needs Redis, for the error message.

    Returns:
        ``redis.Redis``, or a :class:`baldur_django.core.stores.redis.ClusterClient`.

    Raises:
        ConfigError: neither a URL nor a usable django-redis alias; ``BALDUR_REDIS_CLUSTER``
            without ``BALDUR_REDIS_URL``; a cluster URL that is a socket or names a
            database other than 0.
    """
    from ..core.stores.redis import connect

    url = baldur_settings.get("BALDUR_REDIS_URL")
    cluster = baldur_settings.get("BALDUR_REDIS_CLUSTER")
    if url:
        return connect(
            url,
            socket_timeout=baldur_settings.get("BALDUR_REDIS_SOCKET_TIMEOUT"),
            max_connections=baldur_settings.get("BALDUR_REDIS_MAX_CONNECTIONS"),
            cluster=cluster,
        )
    if cluster:
        raise ConfigError(
            f"{purpose} with BALDUR_REDIS_CLUSTER=True needs BALDUR_REDIS_URL naming one node of the cluster "
            "(a django-redis cache alias is not a cluster client)"
        )
    alias = baldur_settings.get("BALDUR_REDIS_CACHE_ALIAS")
    try:
        from django_redis import get_redis_connection

        return get_redis_connection(alias)
    except Exception as exc:
        raise ConfigError(
            f"{purpose} needs BALDUR_REDIS_URL or a django-redis cache BALDUR_REDIS_CACHE_ALIAS={alias!r}: {exc}"
        ) from exc


#: Seconds a pub/sub connection may take to connect (TCP). Reads are not bounded by it.
PUBSUB_CONNECT_TIMEOUT = 5.0


def pubsub_client(socket_timeout: float | None = None) -> Any:
    """A redis-py client of its own for cluster propagation, separate from the store's pool.

    Built from ``BALDUR_REDIS_URL``, else from the connection parameters (host or socket
    path, port, database, credentials, TLS) of the django-redis cache
    ``BALDUR_REDIS_CACHE_ALIAS``, whatever ``BALDUR_STATE_BACKEND`` says. With
    ``BALDUR_REDIS_CLUSTER`` it is a plain client of the node ``BALDUR_REDIS_URL`` names:
    classic pub/sub reaches every node of a cluster from any one of them. Opens no
    connection. The client has a small pool of its own, connects within
    :data:`PUBSUB_CONNECT_TIMEOUT` seconds, lets TCP keepalive find a vanished host, and
    makes no retries of its own (the caller reconnects with backoff).

    Args:
        socket_timeout (float | None): socket timeout in seconds; None (the default): no
            read timeout at all. The publisher passes ``BALDUR_REDIS_SOCKET_TIMEOUT``, like
            every other connection the package opens. The subscriber passes its health
            interval (at most 5 s), which only bounds its connection handshake: it waits
            for messages by polling the socket, so a quiet channel never times out, and
            checks the link with its own PING instead.

    Returns:
        redis.Redis: a client (``publish``, ``pubsub``).

    Raises:
        ConfigError: neither ``BALDUR_REDIS_URL`` nor a usable django-redis alias.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": PUBSUB_CONNECT_TIMEOUT,
        "socket_keepalive": True,
        "socket_keepalive_options": _keepalive_options(),
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "max_connections": 2,
    }
    url = baldur_settings.get("BALDUR_REDIS_URL")
    purpose = "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED"
    if url:
        if url.lower().startswith("unix:"):
            _no_keepalive(options)
        # on a Redis Cluster too: classic pub/sub crosses the cluster bus, so a plain
        # connection to the node the URL names hears (and reaches) every node's subscribers
        return redis.Redis.from_url(url, **options)
    if baldur_settings.get("BALDUR_REDIS_CLUSTER"):
        raise ConfigError(f"{purpose} with BALDUR_REDIS_CLUSTER=True needs BALDUR_REDIS_URL naming one node")
    return _client_like_cache(options, purpose)


def _client_like_cache(options: dict[str, Any], purpose: str) -> Any:
    """A client with the connection parameters of the django-redis cache
    ``BALDUR_REDIS_CACHE_ALIAS`` and the pub/sub *options* (ConfigError when they cannot be copied)."""
    import redis

    alias = baldur_settings.get("BALDUR_REDIS_CACHE_ALIAS")
    try:
        from django_redis import get_redis_connection

        borrowed = get_redis_connection(alias)
    except Exception as exc:
        raise ConfigError(
            f"{purpose} needs BALDUR_REDIS_URL or a django-redis cache BALDUR_REDIS_CACHE_ALIAS={alias!r}: {exc}"
        ) from exc
    pool = getattr(borrowed, "connection_pool", None)
    kwargs = dict(getattr(pool, "connection_kwargs", None) or {})
    connection_class = getattr(pool, "connection_class", None)
    plain = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)
    if not kwargs or connection_class not in plain:
        raise ConfigError(
            f"{purpose}: the django-redis cache {alias!r} uses a {type(pool).__name__} whose connection "
            "parameters cannot be copied; set BALDUR_REDIS_URL instead"
        )
    kwargs.update(options)
    if connection_class is redis.UnixDomainSocketConnection:
        _no_keepalive(kwargs)
    max_connections = kwargs.pop("max_connections")
    return redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=connection_class, max_connections=max_connections, **kwargs
        )
    )


def _no_keepalive(options: dict[str, Any]) -> None:
    """A Unix socket has no TCP keepalive: drop those options (redis-py refuses them there)."""
    options.pop("socket_keepalive", None)
    options.pop("socket_keepalive_options", None)


def _keepalive_options() -> dict[int, int]:
    """TCP keepalive tuned to notice a vanished Redis host within about half a minute,
    where the platform lets us say so (Linux); elsewhere the system's defaults."""
    import socket

    wanted = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def _signature() -> tuple[Any, ...]:
    return tuple(baldur_settings.get(name) for name in STORE_SETTINGS)


def store_changed() -> bool:
    """True when the store settings differ from those of the installed store.

    Raises:
        ConfigError: a store setting is invalid.
    """
    return _signature() != _installed


def install_store(*, force: bool = False, before: Any = None) -> bool:
    """Hand the registry the shared store the settings ask for.

    Breakers that already exist switch strategy in place (``CircuitBreaker.use_store``).
    No connection is opened here.

    Args:
        force (bool): rebuild even when the store settings did not change.
        before (Callable[[], None] | None): run after the new store was built and before
            it is installed (the settings reload re-resolves every breaker there), so a
            failure in either leaves everything as it was.

    Returns:
        bool: True when a store (or the memory backend) was installed, False when the
        settings had not changed since the last install (``before`` still runs).

    Raises:
        ConfigError: a store setting is invalid, or the redis backend has neither
            ``BALDUR_REDIS_URL`` nor a usable django-redis cache alias. Nothing changes.
    """
    global _installed
    from ..core.registry import registry

    with _lock:
        signature = _signature()
        changed = force or signature != _installed
        store = build_store() if changed else None
        if before is not None:
            before()
        if not changed:
            return False
        registry.set_store(store)
        _installed = signature
        return True


def store_class(path: str) -> Any:
    """Import the store class that ``BALDUR_STATE_BACKEND`` names by dotted path.

    Uses Django's ``import_string``, as cache and session backends do; the class is not
    called (the system check uses this: building a store may connect).

    Args:
        path (str): a dotted path such as ``"myproject.stores.MyStore"``.

    Returns:
        The imported class.

    Raises:
        ConfigError: the path cannot be imported, or what it names is not a store class;
            the message starts with ``BALDUR_STATE_BACKEND=<path>`` and says which.
    """
    from django.utils.module_loading import import_string

    from ..core.stores.base import import_store_class

    return import_store_class(path, importer=import_string)
