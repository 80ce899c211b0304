"""RateLimitMiddleware on a real Redis through django-redis (IN-4; issue 12's one round trip).

The limiter counts a request against every matching rule with one Lua script on the
cache's own Redis connection. These tests drive ``RateLimitMiddleware`` with a settable
clock against:

* the shared server 127.0.0.1:6379, DB 14, under a key prefix of each test's own (its
  keys are deleted afterwards, never the database);
* a private ``redis-server`` the test starts, where ``INFO commandstats`` is the test's
  alone and is asserted exactly, and where the client's commands and round trips are
  counted on the connection itself (``benchmarks.stores.counting_client``'s class).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
import redis
from django.core.cache import caches
from django.http import HttpResponse
from django.test import RequestFactory
from django_redis import get_redis_connection

from baldur_django.core.marks import is_marked
from baldur_django.limiter import RateLimiter
from baldur_django.middleware import RateLimitMiddleware
from tests.conftest import need_server
from tests.stores.conftest import reachable
from tests.stores.redis_tools import REDIS_SERVER, Counter, RedisServer, commandstats, counting_client, delta, free_port

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

DB14 = "redis://127.0.0.1:6379/14"
MINUTE = 1_440_000.0  # a multiple of 3600 (so of 60): a minute (and an hour) window starts here


class Now:
    """A settable time function (Unix seconds) for the limiter's windows."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _caches(
    location: str,
    prefix: str,
    version: int = 1,
    options: dict | None = None,
    backend: str = "django_redis.cache.RedisCache",
) -> dict:
    if backend.startswith("django_redis."):
        timeouts = {"SOCKET_TIMEOUT": 2, "SOCKET_CONNECT_TIMEOUT": 2}
    else:  # Django's own backend hands OPTIONS to redis-py's connection pool
        timeouts = {"socket_timeout": 2, "socket_connect_timeout": 2}
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "limits": {
            "BACKEND": backend,
            "LOCATION": location,
            "KEY_PREFIX": prefix,
            "VERSION": version,
            "OPTIONS": {**timeouts, **(options or {})},
        },
    }


class Site:
    """``RateLimitMiddleware`` in front of a view that answers 200, counting in the ``limits`` cache."""

    def __init__(self, configure, rules: list, now: Now) -> None:
        configure(BALDUR_RATE_LIMIT_RULES=rules, BALDUR_RATE_LIMIT_CACHE_ALIAS="limits")
        self.configure = configure
        self.now = now
        self.limiter = RateLimiter(time_func=now)
        self.middleware = RateLimitMiddleware(lambda request: HttpResponse("ok"), limiter=self.limiter)
        self.factory = RequestFactory()

    def get(self, path: str = "/api/orders/", **meta):
        request = self.factory.get(path, REMOTE_ADDR=meta.pop("REMOTE_ADDR", "198.51.100.7"), **meta)
        response = self.middleware(request)
        response.request_marked = is_marked(request)
        return response

    def statuses(self, n: int, **kw) -> list[int]:
        return [self.get(**kw).status_code for _ in range(n)]

    def key(self, index: int = 0, ident: str = "ip:198.51.100.7") -> str:
        rule = self.limiter.rules()[index]
        return self.limiter.key(rule, int(self.now.t // rule.period), ident)


@pytest.fixture
def shared_redis(configure):
    """``build(rules, now, **cache)`` -> :class:`Site` on the shared server's DB 14 under a
    private key prefix (the test's keys are deleted afterwards, not the database)."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    prefix = f"rl-{uuid.uuid4().hex[:12]}"
    admin = redis.Redis.from_url(DB14, socket_timeout=5)

    def build(rules, now, version=1, backend="django_redis.cache.RedisCache", location=DB14):
        configure(CACHES=_caches(location, prefix, version, backend=backend))
        site = Site(configure, rules, now)
        site.admin = admin
        site.prefix = prefix
        return site

    yield build
    for key in admin.scan_iter(f"{prefix}:*"):
        admin.delete(key)
    admin.close()


@pytest.fixture
def private_redis(configure):
    """``build(rules, now)`` -> :class:`Site` on a private redis-server, whose connections count
    every command and round trip they send (``site.counter``); ``site.admin`` reads commandstats."""
    need_server("redis-server binary (a private server is started)", REDIS_SERVER is not None, "install redis-server")
    server = RedisServer().start()
    counter = Counter()
    # the connection class of a counting client, handed to django-redis's pool; the private
    # server's URL is unique, so django-redis builds a pool of its own for it
    connection_class = counting_client(server.url(), counter).connection_pool.connection_class
    admin = redis.Redis.from_url(server.url())

    def build(rules, now):
        options = {"CONNECTION_POOL_KWARGS": {"connection_class": connection_class}}
        configure(CACHES=_caches(server.url(), "priv", options=options))
        site = Site(configure, rules, now)
        site.admin, site.counter, site.server = admin, counter, server
        return site

    yield build
    admin.close()
    server.stop()


# ------------------------------------------------------------------ IN-4 on django-redis
def test_in4_django_redis_lowered_rate_applies_at_once(shared_redis, configure):
    """IN-4, CFG-2 on django-redis: a client at 8 hits of 10/m, the rate lowered to 5/m with
    override_settings: the next request is refused with X-RateLimit-Remaining 0; the counter in
    Redis stays at 8 while refusals go on; raising the rate back gives exactly the old room."""
    site = shared_redis([{"path": "/api/", "rate": "10/m", "key": "ip"}], Now(MINUTE + 10))
    assert site.statuses(8) == [200] * 8
    raw = caches["limits"].make_key(site.key())
    assert site.admin.get(raw) == b"8"
    configure(BALDUR_RATE_LIMIT_RULES=[{"path": "/api/", "rate": "5/m", "key": "ip"}])
    refused = site.get()
    assert refused.status_code == 429
    assert (refused.headers["X-RateLimit-Remaining"], refused.headers["X-RateLimit-Limit"]) == ("0", "5")
    assert (refused.headers["Retry-After"], refused.headers["X-RateLimit-Mode"]) == ("50", "enforce")
    assert refused.request_marked is True
    assert site.statuses(5) == [429] * 5
    assert site.admin.get(raw) == b"8"  # refusals did not count
    configure(BALDUR_RATE_LIMIT_RULES=[{"path": "/api/", "rate": "10/m", "key": "ip"}])
    assert site.statuses(3) == [200, 200, 429]
    assert site.admin.get(raw) == b"10"


def test_in4_django_redis_keys_use_the_caches_prefix_and_version_and_expire(shared_redis):
    """IN-4: the script's keys go through the cache's own make_key (KEY_PREFIX and VERSION), so
    ``cache.get`` reads the counter; it expires with its window (TTL at most the rest of the window + 1 s)."""
    site = shared_redis([{"path": "/api/", "rate": "3/m", "key": "ip"}], Now(MINUTE + 45.5), version=7)
    assert site.statuses(4) == [200, 200, 200, 429]
    raw = caches["limits"].make_key(site.key())
    assert raw.startswith(f"{site.prefix}:7:baldur:rl:")
    assert [k.decode() for k in site.admin.scan_iter(f"{site.prefix}:*")] == [raw]
    assert caches["limits"].get(site.key()) == 3
    assert 1 <= site.admin.ttl(raw) <= 16  # 14.5 s left in the window, rounded up, plus one


def test_in4_django_redis_every_matching_rule_and_honest_retry_after(shared_redis):
    """IN-4 on django-redis: each matching rule has its own counter, a request refused by one rule
    costs no other, and Retry-After waits for every rule that refused (a request then is admitted)."""
    now = Now(MINUTE + 30)
    site = shared_redis(
        [{"path": "/api/", "rate": "2/m", "key": "ip"}, {"path": "/api/", "rate": "4/h", "key": "ip"}], now
    )
    assert site.statuses(3) == [200, 200, 429]
    assert [caches["limits"].get(site.key(i)) for i in (0, 1)] == [2, 2]  # the refusal gave its hit back
    now.t += 30
    assert site.statuses(2) == [200, 200]
    refused = site.get()  # both rules over
    assert (refused.headers["X-RateLimit-Limit"], refused.headers["Retry-After"]) == ("4", str(3600 - 60))
    now.t += 3600 - 60
    assert site.get().status_code == 200


def test_in4_django_redis_async_chain(shared_redis):
    """IN-4: the async middleware counts on django-redis the same way (the script runs in a worker thread)."""
    site = shared_redis([{"path": "/api/", "rate": "2/m", "key": "ip"}], Now(MINUTE))

    async def view(request):
        return HttpResponse("ok")

    middleware = RateLimitMiddleware(view, limiter=site.limiter)

    async def go():
        return [
            (await middleware(site.factory.get("/api/x/", REMOTE_ADDR="203.0.113.5"))).status_code for _ in range(4)
        ]

    assert asyncio.run(go()) == [200, 200, 429, 429]
    assert caches["limits"].get(site.key(ident="ip:203.0.113.5")) == 2


def test_in4_django_redis_key_holding_another_value_fails_open_and_keeps_no_hit(shared_redis, caplog):
    """IN-4: when a counter key holds something that is not a count (another writer's value) the
    script gives back the hits it already took and the request is admitted with a warning."""
    site = shared_redis(
        [{"path": "/api/", "rate": "5/m", "key": "ip"}, {"path": "/api/orders/", "rate": "5/h", "key": "ip"}],
        Now(MINUTE),
    )
    caches["limits"].set(site.key(1), "not a count", 600)
    with caplog.at_level(logging.WARNING, logger="baldur.inbound"):
        assert site.statuses(2) == [200, 200]
    assert caches["limits"].get(site.key(0)) == 0  # taken, then given back inside the script
    assert site.admin.ttl(caches["limits"].make_key(site.key(0))) > 0  # and it still expires
    assert [r.name for r in caplog.records if "rate_limit_unavailable" in r.getMessage()] == ["baldur.inbound"]


def test_in4_django_redis_server_down_admits_and_warns_once(shared_redis, caplog):
    """IN-4: a django-redis cache whose server does not answer admits requests uncounted, one warning."""
    site = shared_redis(
        [{"path": "/api/", "rate": "1/m", "key": "ip"}], Now(MINUTE), location=f"redis://127.0.0.1:{free_port()}/0"
    )
    with caplog.at_level(logging.WARNING, logger="baldur.inbound"):
        assert site.statuses(4) == [200] * 4
    warnings = [r for r in caplog.records if r.name == "baldur.inbound"]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()


def test_in4_djangos_own_redis_backend_uses_the_generic_protocol(shared_redis, configure):
    """IN-4: another backend on the same server (Django's own RedisCache) is counted through the
    generic cache protocol, with the same results: lowered rate at once, refusals not counted."""
    site = shared_redis(
        [{"path": "/api/", "rate": "10/m", "key": "ip"}],
        Now(MINUTE + 10),
        backend="django.core.cache.backends.redis.RedisCache",
    )
    assert site.statuses(8) == [200] * 8
    configure(BALDUR_RATE_LIMIT_RULES=[{"path": "/api/", "rate": "5/m", "key": "ip"}])
    refused = site.get()
    assert (refused.status_code, refused.headers["X-RateLimit-Remaining"]) == (429, "0")
    assert site.statuses(3) == [429] * 3
    assert caches["limits"].get(site.key()) == 8


# ------------------------------------------------------------- one round trip (issue 12)
def _measure(site, requests: int, **kw) -> tuple[list[int], int, int, dict, dict]:
    site.counter.names.clear()
    commands0, trips0 = site.counter.snapshot()
    before = commandstats(site.admin)
    codes = site.statuses(requests, **kw)
    server = delta(before, commandstats(site.admin))
    commands, trips = site.counter.snapshot()
    return codes, commands - commands0, trips - trips0, dict(site.counter.names), server


def test_in4_django_redis_one_round_trip_per_admitted_request(private_redis):
    """IN-4, issue 12: on django-redis an admitted request costs one round trip carrying one
    command (EVALSHA of the counting script), counted on the client's connection, and
    ``INFO commandstats`` on a private server shows exactly one EVALSHA per request plus the one
    INCR the script runs per matching rule (the generic protocol cost SET NX, EVAL, EXISTS and
    INCRBY: four). The first request of a window also sets the counter's expiry; a server that
    lost the script gets it loaded once and the request still counts."""
    site = private_redis([{"path": "/api/", "rate": "1000/m", "key": "ip"}], Now(MINUTE))
    get_redis_connection("limits").ping()  # open the pooled connection: its handshake is not limiter traffic
    codes, commands, trips, names, server = _measure(site, 1)  # first use: NOSCRIPT, SCRIPT LOAD, EVALSHA
    assert codes == [200]
    assert server == {"evalsha": 2, "script|load": 1, "incr": 1, "expire": 1}

    codes, commands, trips, names, server = _measure(site, 50)
    assert codes == [200] * 50
    assert (commands, trips) == (50, 50)  # one command, one round trip per admitted request
    assert names == {"evalsha": 50}
    assert server == {"evalsha": 50, "incr": 50}
    assert caches["limits"].get(site.key()) == 51

    site.admin.script_flush()  # a restarted server: the script is loaded again, once
    codes, commands, trips, names, server = _measure(site, 2)
    assert codes == [200, 200]
    assert names == {"evalsha": 3, "script": 1} and trips == 4
    assert caches["limits"].get(site.key()) == 53


def test_in4_django_redis_several_rules_still_one_round_trip_refusal_leaves_no_hit(private_redis):
    """IN-4, issue 12: with two matching rules a request is still one EVALSHA (one round trip);
    a refusal is one too, and its INCRs are taken back inside the same script (DECR), so the
    counters never show its hits."""
    site = private_redis(
        [{"path": "/api/", "rate": "100/m", "key": "ip"}, {"path": "/api/orders/", "rate": "3/m", "key": "ip"}],
        Now(MINUTE),
    )
    assert site.statuses(1) == [200]  # loads the script, creates both counters
    codes, commands, trips, names, server = _measure(site, 2)
    assert codes == [200, 200]
    assert (commands, trips, names) == (2, 2, {"evalsha": 2})
    assert server == {"evalsha": 2, "incr": 4}
    codes, commands, trips, names, server = _measure(site, 3)
    assert codes == [429] * 3
    assert (commands, trips, names) == (3, 3, {"evalsha": 3})
    assert server == {"evalsha": 3, "incr": 6, "decr": 6}
    assert [caches["limits"].get(site.key(i)) for i in (0, 1)] == [3, 3]
