"""The inbound side's building blocks: request marks, client keys and the fixed-window limiter.

Three things live here and are shared by :mod:`baldur_django.middleware` and
:mod:`baldur_django.contrib.drf`:

* :func:`mark_rate_limited` / :func:`is_marked`: an app-side limiter (the DRF throttle
  bridge, a hand-written check) marks the request it refused, so the circuit-breaker
  middleware leaves that 429 out (IN-3).
* :func:`own_rate_limit` / :func:`is_shed`: recognise the answers the package produced
  itself, which never count against a breaker (IN-1, IN-3).
* :class:`RateLimiter`: the package's own inbound limiter behind ``RateLimitMiddleware``
  (IN-4): rules from ``BALDUR_RATE_LIMIT_RULES``, fixed windows, atomic counting in a
  Django cache, client keys by IP, user or a function of your own.

This module imports Django only inside the functions that need it, so
``import baldur_django`` (which re-exports :func:`mark_rate_limited`) still works in a
process without Django.
"""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .conf import baldur_settings
from .core.errors import ConfigError

__all__ = [
    "MARK_ATTRIBUTE",
    "MODE_HEADER",
    "LIMIT_HEADER",
    "REMAINING_HEADER",
    "SHED_HEADER",
    "MODE_VALUE",
    "mark_rate_limited",
    "is_marked",
    "own_rate_limit",
    "is_shed",
    "normalise_ip",
    "client_ip",
    "Rule",
    "compile_rules",
    "Refusal",
    "RateLimiter",
    "rate_limited_response",
]

_log = logging.getLogger("baldur.inbound")

#: Attribute set on the underlying ``HttpRequest`` by :func:`mark_rate_limited`.
MARK_ATTRIBUTE = "baldur_rate_limited"
#: Header every 429 of the package's own limiter carries; its presence on a 429 means
#: "this limit was imposed by our own app" (IN-3, IN-6).
MODE_HEADER = "X-RateLimit-Mode"
LIMIT_HEADER = "X-RateLimit-Limit"
REMAINING_HEADER = "X-RateLimit-Remaining"
#: Value of :data:`MODE_HEADER` on the limiter's refusals: the rules were enforced.
MODE_VALUE = "enforce"
#: Header on the 503 the circuit-breaker middleware answers with while shedding load;
#: its value is the denial reason (``open``, ``half_open_full``, ``frozen``).
SHED_HEADER = "X-Baldur-Shed"

_PERIODS = {"s": 1, "m": 60, "h": 3600}


# --------------------------------------------------------------------------- marks
def _underlying(request: Any) -> Any:
    # DRF's Request forwards attribute reads to the HttpRequest but keeps writes on
    # itself, and middleware only ever sees the HttpRequest: always use the inner one.
    inner = getattr(request, "_request", None)
    return inner if inner is not None else request


def mark_rate_limited(request: Any) -> None:
    """Mark *request* as refused by the application's own rate limiter (IN-3).

    The circuit-breaker middleware then leaves the request's 429 out of every count.

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request`` (the mark is set on the
            underlying ``HttpRequest``, the object middleware sees).

    Returns:
        None.
    """
    setattr(_underlying(request), MARK_ATTRIBUTE, True)


def is_marked(request: Any) -> bool:
    """True when :func:`mark_rate_limited` was called for *request* (IN-3).

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request``.
    """
    return getattr(_underlying(request), MARK_ATTRIBUTE, False) is True


def _header(response: Any, name: str) -> Any:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        return headers.get(name)
    except Exception:
        return None


def own_rate_limit(request: Any, response: Any, *, mode_only: bool = False) -> bool:
    """True when a rate-limit answer came from the application itself (IN-3, IN-6).

    Call it only for a response whose status is a rate-limit status; it does not look
    at the status.

    Args:
        request: the request (None outside Django); a marked request counts as own.
        response: any object with a ``headers`` mapping.
        mode_only: look only at ``X-RateLimit-Mode`` (the Flask and ASGI middlewares),
            not at ``X-RateLimit-Limit`` or the request mark.
    """
    if _header(response, MODE_HEADER) is not None:
        return True
    if mode_only:
        return False
    if _header(response, LIMIT_HEADER) is not None:
        return True
    return request is not None and is_marked(request)


def is_shed(response: Any) -> bool:
    """True for the 503 the circuit-breaker middleware answers with while shedding load."""
    return _header(response, SHED_HEADER) is not None


# ----------------------------------------------------------------------- client keys
def normalise_ip(text: Any) -> str | None:
    """Return the canonical text of an IP address, or None when *text* is not one.

    Accepts the forms proxies write: surrounding spaces, ``[v6]:port``, ``v4:port`` and
    a ``%zone`` suffix. IPv6 is compressed and lower-cased; an IPv4-mapped IPv6 address
    (``::ffff:192.0.2.1``) becomes the IPv4 address, so both spellings share a counter
    (IN-4).

    Args:
        text: a string (anything else gives None).
    """
    if not isinstance(text, str):
        return None
    value = text.strip()
    if not value:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return None
        value = value[1:end]
    elif value.count(":") == 1:
        value = value.partition(":")[0]  # v4 with a port
    value = value.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.compressed


def client_ip(request: Any, *, trust_forwarded_for: bool | None = None, trusted_proxies: int | None = None) -> str:
    """The client's IP address for rate limiting (IN-4).

    ``REMOTE_ADDR`` unless ``X-Forwarded-For`` is trusted; then the entry
    *trusted_proxies* places from the right (each trusted proxy appends the address it
    saw), or the leftmost entry when the header is shorter than that. A missing or
    malformed forwarded entry falls back to ``REMOTE_ADDR``.

    Args:
        request: a Django ``HttpRequest``.
        trust_forwarded_for: defaults to ``BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR``.
        trusted_proxies: defaults to ``BALDUR_RATE_LIMIT_TRUSTED_PROXIES`` (>= 1).

    Returns:
        The normalised address, or the raw ``REMOTE_ADDR`` text (possibly ``""``) when it
        is not an IP address (a Unix socket, a test).
    """
    if trust_forwarded_for is None:
        trust_forwarded_for = baldur_settings.get("BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR")
    meta = getattr(request, "META", {})
    if trust_forwarded_for:
        forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
        entries = [part.strip() for part in forwarded.split(",") if part.strip()]
        if entries:
            if trusted_proxies is None:
                trusted_proxies = baldur_settings.get("BALDUR_RATE_LIMIT_TRUSTED_PROXIES")
            chosen = normalise_ip(entries[max(0, len(entries) - int(trusted_proxies))])
            if chosen is not None:
                return chosen
    remote = meta.get("REMOTE_ADDR", "") or ""
    return normalise_ip(remote) or str(remote)


def _ip_key(request: Any) -> str:
    return "ip:" + client_ip(request)


def _user_key(request: Any) -> str:
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return _ip_key(request)


def _import_key(setting: str, dotted: str) -> Callable[[Any], Any]:
    module_path, _, name = dotted.rpartition(".")
    if not module_path:
        raise ConfigError(f"{setting}={dotted!r}: expected 'ip', 'user' or a dotted path such as 'myapp.keys.by_tenant'")
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ConfigError(f"{setting}={dotted!r}: cannot import module {module_path!r} ({exc})") from exc
    try:
        func = getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{setting}={dotted!r}: module {module_path!r} has no attribute {name!r}") from None
    if not callable(func):
        raise ConfigError(f"{setting}={dotted!r}: {dotted} is not callable")
    return func


# ----------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    """One compiled entry of ``BALDUR_RATE_LIMIT_RULES``.

    Attributes:
        index (int): position in the setting.
        path (str): path substring the rule applies to (``""`` matches every path).
        limit (int): requests admitted per window.
        period (int): window length in seconds (1, 60 or 3600).
        key (str): ``"ip"``, ``"user"`` or the dotted path as written.
        key_func (callable): ``request -> str | None``; None exempts the request.
        ident (str): names the rule in cache keys, changes when the rule changes.
    """

    index: int
    path: str
    limit: int
    period: int
    key: str
    key_func: Callable[[Any], Any]
    ident: str

    def matches(self, path: str) -> bool:
        return self.path in path


def compile_rules(raw: list[dict[str, Any]], setting: str = "BALDUR_RATE_LIMIT_RULES") -> tuple[Rule, ...]:
    """Turn validated rule dicts (``{"path", "rate", "key"}``) into :class:`Rule` objects (IN-4).

    Args:
        raw: the parsed value of ``BALDUR_RATE_LIMIT_RULES``.
        setting: the setting name used in error messages.

    Raises:
        ConfigError: a rate that is not ``N/s``, ``N/m`` or ``N/h``, or a ``key`` dotted
            path that cannot be imported (the message names the setting and the rule).
    """
    rules = []
    for index, entry in enumerate(raw):
        where = f"{setting}[{index}]"
        rate = str(entry.get("rate", ""))
        count, _, unit = rate.partition("/")
        if not count.isdigit() or int(count) < 1 or unit not in _PERIODS:
            raise ConfigError(f"{where}['rate']={rate!r}: expected 'N/s', 'N/m' or 'N/h' with N >= 1")
        key = entry.get("key", "ip") or "ip"
        if key == "ip":
            func: Callable[[Any], Any] = _ip_key
        elif key == "user":
            func = _user_key
        else:
            func = _import_key(f"{where}['key']", key)
        path = entry.get("path", "")
        digest = hashlib.sha1(f"{path}\0{rate}\0{key}".encode()).hexdigest()[:10]
        rules.append(Rule(index, path, int(count), _PERIODS[unit], key, func, f"{index}-{digest}"))
    return tuple(rules)


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused by :class:`RateLimiter`.

    Attributes:
        rule (Rule): the rule whose budget is spent.
        retry_after (int): whole seconds until that rule's window ends, at least 1.
        limit (int): the rule's requests per window.
    """

    rule: Rule
    retry_after: int
    limit: int


_SAFE = re.compile(r"^[A-Za-z0-9:._@-]{1,80}$")


def _cache_part(ident: str) -> str:
    # memcached refuses spaces, control characters and keys over 250 bytes
    if _SAFE.match(ident):
        return ident
    return "h:" + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class RateLimiter:
    """Fixed-window counting of ``BALDUR_RATE_LIMIT_RULES`` in a Django cache (IN-4).

    Every rule whose path substring occurs in the request path applies with its own
    counter. A request is admitted only when every matching rule has budget left; a
    refused request takes its hits back from every counter it touched, so refusals never
    use up budget. Counting is ``cache.add(key, 0)`` then ``cache.incr(key)``: atomic
    across processes and threads with Redis (django-redis) and memcached, and within a
    process with the local-memory cache.

    A cache that fails (server down) admits the request and logs a warning at most
    once a minute: the limiter never takes the site down with it.

    Args:
        time_func: returns the current Unix time in seconds; windows are aligned to it,
            so every process must use the same clock (tests pass a fake one).
        cache_alias: Django cache alias; defaults to ``BALDUR_RATE_LIMIT_CACHE_ALIAS``.
        rules: rule dicts to use instead of ``BALDUR_RATE_LIMIT_RULES`` (validated the
            same way).

    Raises:
        ConfigError: from :meth:`rules` or :meth:`check` when the setting is invalid.
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
            from .core.knobs import KNOBS

            self._fixed = compile_rules(KNOBS["BALDUR_RATE_LIMIT_RULES"].coerce(rules))
        self._compiled: tuple[int, tuple[Rule, ...]] = (-1, ())
        self._lock = threading.Lock()
        self._last_warning = 0.0

    # ------------------------------------------------------------------ config
    def rules(self) -> tuple[Rule, ...]:
        """The compiled rules, recompiled when Baldur settings change (CFG-2).

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
        """The rules that apply to *path* (a cheap check callers make before counting)."""
        return tuple(rule for rule in self.rules() if rule.path in path)

    def cache(self) -> Any:
        """The Django cache the counters live in."""
        from django.core.cache import caches

        alias = self._alias or baldur_settings.get("BALDUR_RATE_LIMIT_CACHE_ALIAS")
        return caches[alias]

    def key(self, rule: Rule, window: int, ident: str) -> str:
        """Cache key of one counter: names the rule, the window and the client."""
        return f"baldur:rl:{rule.ident}:{window}:{_cache_part(ident)}"

    # ---------------------------------------------------------------- counting
    def check(self, request: Any, rules: tuple[Rule, ...] | None = None) -> Refusal | None:
        """Count *request* against every matching rule (IN-4).

        Args:
            request: a Django ``HttpRequest``.
            rules: the matching rules when the caller already has them.

        Returns:
            None when the request is admitted (it used one hit of every matching rule),
            else a :class:`Refusal` (no counter keeps a hit of it).
        """
        if rules is None:
            rules = self.matching(request.path)
        if not rules:
            return None
        now = float(self.time_func())
        cache = None
        taken: list[str] = []
        for rule in rules:
            ident = rule.key_func(request)
            if ident is None:
                continue  # the key function exempts this request from this rule
            window = int(now // rule.period)
            window_end = (window + 1) * rule.period
            timeout = max(1, math.ceil(window_end - now)) + 1
            key = self.key(rule, window, str(ident))
            if cache is None:
                cache = self.cache()
            hits = self._incr(cache, key, timeout)
            if hits is None:
                continue  # cache trouble: fail open
            taken.append(key)
            if hits > rule.limit:
                for done in taken:
                    self._decr(cache, done)
                return Refusal(rule, max(1, math.ceil(window_end - now)), rule.limit)
        return None

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
    """The 429 ``HttpResponse`` for a :class:`Refusal` (IN-4).

    Carries ``Retry-After`` (whole seconds, >= 1), ``X-RateLimit-Limit``,
    ``X-RateLimit-Remaining`` (``0``) and ``X-RateLimit-Mode`` (``enforce``), which marks
    it as the package's own answer (IN-3).
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
    response.headers[REMAINING_HEADER] = "0"
    response.headers[MODE_HEADER] = MODE_VALUE
    return response


def _unit(period: int) -> str:
    return {1: "second", 60: "minute", 3600: "hour"}.get(period, f"{period} s")
