"""ST-2: the configured store is built from settings: the database, a Redis URL, or a
django-redis cache alias (through ``django_redis.get_redis_connection``)."""

from __future__ import annotations

import uuid

import pytest
from django.test import override_settings

from baldur_django.backends import build_store
from baldur_django.backends.database import DatabaseStore
from baldur_django.core.errors import ConfigError
from baldur_django.core.stores.redis import RedisStore
from tests.conftest import need_server
from tests.stores.conftest import REDIS_URL, reachable


def test_st2_memory_backend_builds_no_store():
    """ST-1: the memory backend has no shared store."""
    with override_settings(BALDUR_STATE_BACKEND="memory"):
        assert build_store() is None


def test_st2_database_backend_builds_the_orm_store():
    """ST-2: the database backend uses the Django database."""
    with override_settings(BALDUR_STATE_BACKEND="database"):
        store = build_store()
    assert isinstance(store, DatabaseStore) and store.alias == "default"


def test_st2_redis_url_builds_a_client_with_short_timeouts():
    """ST-2/ST-4: BALDUR_REDIS_URL gives a client of the package's own, with the socket
    timeout and pool size of the settings and no client-side retries."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    with override_settings(
        BALDUR_STATE_BACKEND="redis",
        BALDUR_REDIS_URL=REDIS_URL,
        BALDUR_REDIS_SOCKET_TIMEOUT=0.4,
        BALDUR_REDIS_MAX_CONNECTIONS=7,
    ):
        store = build_store()
    assert isinstance(store, RedisStore)
    kwargs = store.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.4 and kwargs["socket_connect_timeout"] == 0.4
    assert store.client.connection_pool.max_connections == 7
    assert store.client.ping()


def test_st2_django_redis_alias_is_used_when_no_url_is_set():
    """ST-2: without a URL, the django-redis cache named by BALDUR_REDIS_CACHE_ALIAS provides
    the connection; a force written through it is what another client reads."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "shared": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
    }
    with override_settings(CACHES=caches, BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_CACHE_ALIAS="shared"):
        from django_redis import get_redis_connection

        store = build_store()
        assert isinstance(store, RedisStore)
        assert store.client.connection_pool is get_redis_connection("shared").connection_pool
    name = f"alias-{uuid.uuid4().hex[:8]}"
    try:
        store.force(name, mode="open", ttl_seconds=60.0, reason="via django-redis", actor="ops")
        other = RedisStore(store.client.__class__.from_url(REDIS_URL))
        assert other.inspect(name).record.forced == "open"
    finally:
        store.reset(name)
        store.client.zrem(store.registry_key, name)


def test_cfg3_redis_backend_without_url_or_usable_alias_is_a_config_error():
    """CFG-3: the redis backend with neither a URL nor a django-redis alias says so."""
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with (
        override_settings(CACHES=caches, BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_CACHE_ALIAS="nope"),
        pytest.raises(ConfigError, match="BALDUR_REDIS_CACHE_ALIAS='nope'"),
    ):
        build_store()
