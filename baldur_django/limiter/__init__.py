"""The package's own inbound rate limiter behind ``RateLimitMiddleware``.

Rules come from ``BALDUR_RATE_LIMIT_RULES``; every matching rule counts the request in
a fixed window of its own, in the Django cache ``BALDUR_RATE_LIMIT_CACHE_ALIAS``.

* A counter's cache key names its rule by path, key and period, never by the count, so
  a rate lowered at run time (``override_settings``) applies at once to the hits
  already counted in the current window.
* A request is admitted only when every matching rule has room; a refused request keeps
  no hit in any counter.
* On django-redis (``django_redis.cache.RedisCache`` with its default or Sentinel client)
  one Lua script counts every matching rule of a request: one round trip, atomic across
  processes, the refusal's hits never visible to anyone. Every other cache (local
  memory, database, memcached, Django's own Redis backend) is driven through the
  generic cache protocol: ``add`` + ``incr`` per rule, ``decr`` to give hits back.
* On a django-redis cache whose connection is a Redis Cluster client (a ``CLIENT_CLASS``
  that connects with ``redis.cluster.RedisCluster``), the counters of one request are
  grouped by hash slot: the client part of every key is a hash tag, so the rules of a
  request that share a client key are one slot and one atomic script as above; rules
  keyed by different clients (``ip`` and ``user``) are counted one slot after the other,
  and a refusal in one gives back what the slots before it took.

Client keys (``ip``, ``user``, a dotted path) and the compiled rules are in :mod:`.rules`;
the 429 the middleware answers with lives here.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..conf import baldur_settings
from .rules import Refusal, Rule, client_ip, compile_rules, normalise_ip

__all__ = [
    "MODE_HEADER",
    "LIMIT_HEADER",
    "REMAINING_HEADER",
    "MODE_VALUE",
    "normalise_ip",
    "client_ip",
    "Rule",
    "compile_rules",
    "Refusal",
    "RateLimiter",
    "COUNT_SCRIPT",
    "GIVE_BACK_SCRIPT",
    "rate_limited_response",
]

# The logger keeps the name it had when the limiter lived in ``baldur_django.inbound``:
# projects filter on it (docs/inbound.md).
_log = logging.getLogger("baldur.inbound")

#: Header every 429 of the package's own limiter carries; its presence on a 429 means
#: "this limit was imposed by our own app".
MODE_HEADER = "X-RateLimit-Mode"
LIMIT_HEADER = "X-RateLimit-Limit"
REMAINING_HEADER = "X-RateLimit-Remaining"
#: Value of :data:`MODE_HEADER` on the limiter's refusals: the rules were enforced.
MODE_VALUE = "enforce"

_SAFE = re.compile(r"^[A-Za-z0-9:._@-]{1,80}$")


def _cache_part(ident: str) -> str:
    # memcached refuses spaces, control characters and keys over 250 bytes
    if _SAFE.match(ident):
        return ident
    return "h:" + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:40]


#: The Lua script behind the django-redis path: one EVALSHA counts a request against every
#: matching rule. KEYS[i] is rule i's counter (already through the cache's ``make_key``),
#: ARGV[i] its limit, ARGV[n + i] its lifetime in seconds (set when the window's counter is
#: created). Returns the hits of every counter with this request included; when any of them
#: is over its limit every counter is taken back down before the script ends, so a refusal
#: never counts and nobody sees its hit. INCR replies are integers, and a key holding
#: something that is not one (another writer's value) aborts the script after giving back
#: what it took, so the caller fails open on the error.
COUNT_SCRIPT = """
local n = #KEYS
local hits = {}
local over = false
for i = 1, n do
  local h = redis.pcall('INCR', KEYS[i])
  if type(h) == 'table' and h.err then
    for j = 1, i - 1 do redis.call('DECR', KEYS[j]) end
    return redis.error_reply('baldur rate limit counter ' .. KEYS[i] .. ': ' .. h.err)
  end
  if h == 1 then redis.call('EXPIRE', KEYS[i], ARGV[n + i]) end
  hits[i] = h
  if h > tonumber(ARGV[i]) then over = true end
end
if over then
  for i = 1, n do redis.call('DECR', KEYS[i]) end
end
return hits
"""


#: Gives back one hit of every counter in KEYS that still exists (a counter that expired
#: meanwhile is not created again). Used on a Redis Cluster when a request's counters span
#: slots and a later slot refused: the slots counted before it take their hits back.
GIVE_BACK_SCRIPT = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('DECR', KEYS[i]) end
end
return #KEYS
"""


@dataclass(frozen=True)
class _Counter:
    key: str  # the cache key before the cache's own make_key
    rule: Rule  # the strictest rule counting on this key
    window_end: int  # Unix seconds
    ttl: int  # seconds the counter lives: to the window's end, plus one


_django_redis: tuple[Any, Any, tuple[type, ...]] | None = None


def _django_redis_parts() -> tuple[Any, Any, tuple[type, ...]] | None:
    """(RedisCache, get_redis_connection, client classes left to the generic protocol), or
    None without django-redis; imported once, on the first request that needs them."""
    global _django_redis
    if _django_redis is None:
        try:
            from django_redis import get_redis_connection
            from django_redis.cache import RedisCache
            from django_redis.client.herd import HerdClient
            from django_redis.client.sharded import ShardClient
        except ImportError:  # django-redis not installed: the generic protocol it is
            return None
        _django_redis = (RedisCache, get_redis_connection, (ShardClient, HerdClient))
    return _django_redis


def _is_cluster(connection: Any) -> bool:
    """True when the cache's Redis connection is a Redis Cluster client."""
    from ..core.stores.redis import is_cluster

    return is_cluster(connection)


def _script_client(cache: Any) -> bool:
    """True for a django-redis cache whose client can run one script over several keys."""
    parts = _django_redis_parts()
    if parts is None or not isinstance(cache, parts[0]):
        return False
    # A sharded client spreads the keys of one request over servers (one script cannot
    # reach them all) and the herd client wraps values: both get the generic protocol.
    return not isinstance(cache.client, parts[2])


class RateLimiter:
    """Fixed-window counting of ``BALDUR_RATE_LIMIT_RULES`` in a Django cache.

    Every rule whose path substring occurs in the request path applies with its own
    counter, keyed by the rule's path, key and period, the window and the client. A
    request is admitted only when every matching rule has budget left under its limit as
    configured now; a refused request keeps no hit in any counter, so refusals never use
    up budget.

    Counting: on django-redis one Lua script per request (one round trip, atomic across
    every process and host); on any other cache ``cache.add(key, 0)`` then
    ``cache.incr(key)`` per rule and ``cache.decr`` to give a refusal's hits back, which
    is atomic across processes with memcached and within a process with the local-memory
    cache.

    A cache that fails (server down) admits the request and logs a warning on
    ``baldur.inbound`` at most once a minute: the limiter never takes the site down with it.

    Args:
        time_func: returns the current Unix time in seconds; windows are aligned to it,
            so every process must use the same clock (tests pass a fake one).
        cache_alias: Django cache alias; defaults to ``BALDUR_RATE_LIMIT_CACHE_ALIAS``.
        rules: rule dicts to use instead of ``BALDUR_RATE_LIMIT_RULES`` (validated the
            same way).

    Raises:
        ConfigError: from the constructor (*rules*), :meth:`rules` or :meth:`check` when
            the rules are invalid.
    """

    def __init__(
        self,
        time_func: Callable[[], float] = time.time,
        cache_alias: str | None = None,
        rules: list[dict[str, Any]] | None = None,
    ) -> None:
        self.time_func = time_func
        self._alias = cache_alias
        self._fixed: tuple[Rule, ...] | None = None
        if rules is not None:
            from ..core.knobs import KNOBS

            self._fixed = compile_rules(KNOBS["BALDUR_RATE_LIMIT_RULES"].coerce(rules))
        self._compiled: tuple[int, tuple[Rule, ...]] = (-1, ())
        self._lock = threading.Lock()
        self._last_warning = 0.0
        self._script: Any = None  # redis-py Script, registered on first use
        self._give_back: Any = None  # likewise, only on a Redis Cluster

    # ------------------------------------------------------------------ config
    def rules(self) -> tuple[Rule, ...]:
        """The compiled rules, recompiled when Baldur settings change.

        Returns:
            tuple[Rule, ...]: the fixed rules, or those of ``BALDUR_RATE_LIMIT_RULES``.

        Raises:
            ConfigError: invalid ``BALDUR_RATE_LIMIT_RULES`` or a key path that does not import.
        """
        if self._fixed is not None:
            return self._fixed
        version, rules = self._compiled
        current = baldur_settings.version
        if version != current:
            with self._lock:
                rules = compile_rules(baldur_settings.get("BALDUR_RATE_LIMIT_RULES"))
                self._compiled = (current, rules)
        return rules

    def matching(self, path: str) -> tuple[Rule, ...]:
        """The rules that apply to *path* (a cheap check callers make before counting).

        Args:
            path: the request path.

        Returns:
            tuple[Rule, ...]: possibly empty.

        Raises:
            ConfigError: as :meth:`rules`.
        """
        return tuple(rule for rule in self.rules() if rule.path in path)

    def cache_alias(self) -> str:
        """The alias of the Django cache the counters live in."""
        return self._alias or baldur_settings.get("BALDUR_RATE_LIMIT_CACHE_ALIAS")

    def cache(self) -> Any:
        """The Django cache the counters live in (``caches[alias]``)."""
        from django.core.cache import caches

        return caches[self.cache_alias()]

    def key(self, rule: Rule, window: int, ident: str) -> str:
        """Cache key of one counter, before the cache's own prefix and version.

        Args:
            rule: the rule (its :attr:`Rule.ident` names path, key and period).
            window: the window number, ``int(unix_time // rule.period)``.
            ident: the client key the rule's key function returned.

        Returns:
            str: ``baldur:rl:<rule>:<window>:{<client>}``, safe for memcached; the braces
            make the client part a Redis Cluster hash tag, so the counters of one client
            share a slot.
        """
        return f"baldur:rl:{rule.ident}:{window}:{{{_cache_part(ident)}}}"

    # ---------------------------------------------------------------- counting
    def check(self, request: Any, rules: tuple[Rule, ...] | None = None) -> Refusal | None:
        """Count *request* against every matching rule.

        Args:
            request: a Django ``HttpRequest``.
            rules: the matching rules when the caller already has them.

        Returns:
            None when the request is admitted (it used one hit of every matching rule;
            also when the cache failed), else a :class:`Refusal` (no counter keeps a hit).

        Raises:
            ConfigError: invalid rules (see :meth:`rules`).
        """
        if rules is None:
            rules = self.matching(request.path)
        if not rules:
            return None
        now = float(self.time_func())
        counters: dict[str, _Counter] = {}
        for rule in rules:
            ident = rule.key_func(request)
            if ident is None:
                continue  # the key function exempts this request from this rule
            window = int(now // rule.period)
            window_end = (window + 1) * rule.period
            key = self.key(rule, window, str(ident))
            known = counters.get(key)
            # two rules with one path, key and period share their counter: the stricter counts
            if known is None or rule.limit < known.rule.limit:
                counters[key] = _Counter(key, rule, window_end, max(1, math.ceil(window_end - now)) + 1)
        if not counters:
            return None
        entries = list(counters.values())
        cache = self.cache()
        if _script_client(cache):
            hits = self._count_script(cache, entries)
        else:
            hits = self._count_generic(cache, entries)
        if hits is None:
            return None  # cache trouble: fail open
        over = [(entry, hit) for entry, hit in zip(entries, hits, strict=False) if hit > entry.rule.limit]
        if not over:
            return None
        # The refusal is lifted once every refusing rule is in a new window (the others
        # gave this request's hit back, so each has room for one more): the latest end.
        entry, hit = max(over, key=lambda item: item[0].window_end)
        retry_after = max(1, math.ceil(entry.window_end - now))
        remaining = max(0, entry.rule.limit - (hit - 1))
        return Refusal(entry.rule, retry_after, entry.rule.limit, remaining)

    def _count_script(self, cache: Any, entries: list[_Counter]) -> list[int] | None:
        """One EVALSHA of :data:`COUNT_SCRIPT` on the cache's own Redis connection (one per
        hash slot on a Redis Cluster: :meth:`_count_slots`)."""
        try:
            parts = _django_redis_parts()
            assert parts is not None  # _script_client() chose this path
            connection = parts[1](self.cache_alias())  # django_redis.get_redis_connection
            script = self._script
            if script is None:
                script = self._script = connection.register_script(COUNT_SCRIPT)
            keys = [cache.make_key(entry.key) for entry in entries]
            if len(keys) > 1 and _is_cluster(connection):
                return self._count_slots(connection, script, keys, entries)
            args = [entry.rule.limit for entry in entries] + [entry.ttl for entry in entries]
            # EVALSHA; on a server that lost the script (restart, SCRIPT FLUSH) redis-py
            # loads it and retries once
            return [int(hit) for hit in script(keys=keys, args=args, client=connection)]
        except Exception as exc:  # the server is down, or a key holds someone else's value
            self._warn("the cache is unavailable", exc)
            return None

    def _count_slots(self, connection: Any, script: Any, keys: list[str], entries: list[_Counter]) -> list[int]:
        """Redis Cluster: one :data:`COUNT_SCRIPT` per hash slot, in the order the counters
        come; the first slot with a counter over its limit has given its own hits back, the
        slots counted before it give theirs back (:data:`GIVE_BACK_SCRIPT`) and the rest are
        not counted. Each slot is atomic; across slots another request may briefly see the
        hits of a request that is then refused."""
        from redis.crc import key_slot

        groups: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key_slot(key.encode("utf-8", "surrogatepass")), []).append(index)
        hits = [0] * len(keys)
        counted: list[list[str]] = []
        for indexes in groups.values():
            args = [entries[i].rule.limit for i in indexes] + [entries[i].ttl for i in indexes]
            answer = script(keys=[keys[i] for i in indexes], args=args, client=connection)
            for i, hit in zip(indexes, answer, strict=True):
                hits[i] = int(hit)
            if any(hits[i] > entries[i].rule.limit for i in indexes):
                give_back = self._give_back
                if give_back is None:
                    give_back = self._give_back = connection.register_script(GIVE_BACK_SCRIPT)
                for group in counted:
                    give_back(keys=group, client=connection)
                break
            counted.append([keys[i] for i in indexes])
        return hits

    def _count_generic(self, cache: Any, entries: list[_Counter]) -> list[int] | None:
        """``add`` + ``incr`` per counter; ``decr`` every hit taken when one is over."""
        hits: list[int] = []
        taken: list[str] = []
        over = False
        for entry in entries:
            hit = self._incr(cache, entry.key, entry.ttl)
            if hit is None:
                hits.append(0)  # this counter's cache trouble: not counted, not refusing
                continue
            taken.append(entry.key)
            hits.append(hit)
            over = over or hit > entry.rule.limit
        if not taken:
            return None
        if over:
            for key in taken:
                self._decr(cache, key)
        return hits

    def _incr(self, cache: Any, key: str, timeout: int) -> int | None:
        try:
            for _ in range(2):
                cache.add(key, 0, timeout)
                try:
                    return int(cache.incr(key))
                except ValueError:
                    continue  # expired between add and incr: add it again
            self._warn("the cache alias refuses add/incr (a dummy cache?)", None)
        except Exception as exc:  # the cache server is down: fail open
            self._warn("the cache is unavailable", exc)
        return None

    def _decr(self, cache: Any, key: str) -> None:
        try:
            cache.decr(key)
        except ValueError:
            pass  # the window's counter expired meanwhile: nothing to give back
        except Exception as exc:
            self._warn("the cache is unavailable", exc)

    def _warn(self, what: str, exc: BaseException | None) -> None:
        now = time.monotonic()
        if now - self._last_warning < 60.0 and self._last_warning:
            return
        self._last_warning = now
        _log.warning("baldur.rate_limit_unavailable: %s; requests are admitted uncounted (%s)", what, exc)


def rate_limited_response(refusal: Refusal) -> Any:
    """The 429 ``HttpResponse`` for a :class:`Refusal`.

    Args:
        refusal: what :meth:`RateLimiter.check` returned.

    Returns:
        django.http.HttpResponse: status 429 with ``Retry-After`` (whole seconds, >= 1),
        ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` (never negative: ``0``) and
        ``X-RateLimit-Mode`` (``enforce``), which marks it as the package's own answer.
    """
    from django.http import HttpResponse

    response = HttpResponse(
        f"Too many requests: the limit is {refusal.limit} per {_unit(refusal.rule.period)}. "
        f"Try again in {refusal.retry_after} s.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response.headers["Retry-After"] = str(refusal.retry_after)
    response.headers[LIMIT_HEADER] = str(refusal.limit)
    response.headers[REMAINING_HEADER] = str(max(0, refusal.remaining))
    response.headers[MODE_HEADER] = MODE_VALUE
    return response


def _unit(period: int) -> str:
    return {1: "second", 60: "minute", 3600: "hour"}.get(period, f"{period} s")
