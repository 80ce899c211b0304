"""Build the configured shared store from settings (ST-2).

``BALDUR_STATE_BACKEND``: ``memory`` (no shared store), ``database`` (the Django
database) or ``redis`` (``BALDUR_REDIS_URL``, else the django-redis cache alias
``BALDUR_REDIS_CACHE_ALIAS`` through ``django_redis.get_redis_connection``).
"""

from __future__ import annotations

from typing import Any

from .conf import baldur_settings
from .core.errors import ConfigError

__all__ = ["build_store", "install_store", "redis_client"]


def redis_client(purpose: str = "BALDUR_STATE_BACKEND='redis'") -> Any:
    """The redis-py client the Redis settings name: ``BALDUR_REDIS_URL`` (with the package's
    timeouts and pool size), else the django-redis cache ``BALDUR_REDIS_CACHE_ALIAS``.

    Used by the redis state backend and by Emergency Mode's redis backend (EM-1).

    Args:
        purpose: what needs Redis, for the error message.

    Raises:
        ConfigError: neither a URL nor a usable django-redis alias.
    """
    from .core.stores.redis import connect

    url = baldur_settings.get("BALDUR_REDIS_URL")
    if url:
        return connect(
            url,
            socket_timeout=baldur_settings.get("BALDUR_REDIS_SOCKET_TIMEOUT"),
            max_connections=baldur_settings.get("BALDUR_REDIS_MAX_CONNECTIONS"),
        )
    alias = baldur_settings.get("BALDUR_REDIS_CACHE_ALIAS")
    try:
        from django_redis import get_redis_connection

        return get_redis_connection(alias)
    except Exception as exc:
        raise ConfigError(
            f"{purpose} needs BALDUR_REDIS_URL or a django-redis cache "
            f"BALDUR_REDIS_CACHE_ALIAS={alias!r}: {exc}"
        ) from exc


def build_store() -> Any:
    """The store for the current settings, or None for the memory backend.

    Raises:
        ConfigError: redis backend with neither a URL nor a usable django-redis alias.
    """
    backend = baldur_settings.get("BALDUR_STATE_BACKEND")
    if backend == "memory":
        return None
    if backend == "database":
        from .store_database import DatabaseStore

        return DatabaseStore()
    from .core.stores.redis import RedisStore

    return RedisStore(redis_client())


def install_store() -> None:
    """Build the store for the current settings and hand it to the registry."""
    from .core.registry import registry

    registry.set_store(build_store())
