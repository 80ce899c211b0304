"""What the outbound HTTP adapters share: breaker names, argument checks, routes.

:mod:`baldur_django.contrib.requests` and :mod:`baldur_django.contrib.httpx` are thin
shells over the decorators' engine: each request goes through a
:class:`~baldur_django.core.routes.Route` built by the same checks ``protect()`` runs
(:func:`~baldur_django.core.routes.protect_route`), so admission, recording, the
classifier (failure statuses, 429 with ``Retry-After``), the retry stage, the fallback,
forces, the emergency freeze and the metrics are the decorators' own. This module only
decides which breaker a request belongs to and which of its two routes (with or without
the retry stage) it takes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.breaker import CircuitBreaker, core_of
from ..core.config import OVERRIDE_NAMES, settings, validate_overrides
from ..core.errors import ConfigError
from ..core.lease import enter_call_bound, leave_call_bound
from ..core.names import name_problem, show_name
from ..core.registry import registry
from ..core.retry import RetryPolicy, coerce_retry
from ..core.routes import Route, aprotect_route, protect_route
from ..core.stages.deadline import enter, in_force, leave, time_left
from ..core.states import CircuitState

__all__ = [
    "IDEMPOTENT_METHODS",
    "DEFAULT_PORTS",
    "HTTPRetryPolicy",
    "NotAnOutcome",
    "canonical_host",
    "host_breaker_name",
    "Breakers",
    "timeout_bound",
    "sequence_bound",
    "clipped_timeout",
]

#: Methods retried by default (RFC 9110 idempotent methods); a policy with a ``methods``
#: attribute names its own set instead.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})

#: Ports left out of a per-host breaker name for their scheme.
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True)
class HTTPRetryPolicy(RetryPolicy):
    """A :class:`~baldur_django.RetryPolicy` that also names the HTTP methods it retries.

    Args:
        methods (frozenset[str]): methods whose requests are retried, any case (default
            :data:`IDEMPOTENT_METHODS`); e.g. ``{"GET", "POST"}`` for a POST endpoint that
            is safe to repeat (an idempotency key). Every other argument is
            :class:`~baldur_django.RetryPolicy`'s.

    Raises:
        ConfigError: a bad value, naming it.
    """

    methods: frozenset[str] = IDEMPOTENT_METHODS

    def __post_init__(self) -> None:
        super().__post_init__()
        methods = self.methods
        if not isinstance(methods, (set, frozenset, list, tuple)) or not all(
            isinstance(m, str) and m.strip() for m in methods
        ):
            raise ConfigError(f"HTTPRetryPolicy methods={methods!r}: expected a set of HTTP method names")
        object.__setattr__(self, "methods", frozenset(m.strip().upper() for m in methods))


class NotAnOutcome(BaseException):
    """Carries a client-side error (an invalid URL, an unsupported scheme) through the
    engine: it is a ``BaseException`` that is not an ``Exception``, which the engine
    records as neither success nor failure and never retries or hands to a fallback. The adapter re-raises :attr:`error` itself, unchanged.

    Attributes:
        error (Exception): the client's own exception.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def canonical_host(host: str) -> str:
    """The one spelling of *host* that names its breaker, whichever client read the URL.

    An internationalised name is written as it goes on the wire: its IDNA ASCII form
    (``"Bücher.example"`` -> ``"xn--bcher-kva.example"``), as requests already hands it
    over and httpx does not. Every host is lowercased. A name the IDNA rules refuse is
    kept as given, lowercased (the client itself refuses such a URL).

    Args:
        host: a URL's host, any case, Unicode or ASCII.

    Returns:
        str: the lowercase ASCII host (or the lowercased *host* when it cannot be encoded).
    """
    if host.isascii():
        return host.lower()
    try:
        try:
            import idna  # a dependency of both requests and httpx: IDNA 2008 with UTS 46 mapping
        except ImportError:  # pragma: no cover - neither client installed: the stdlib's IDNA 2003
            return host.encode("idna").decode("ascii").lower()
        return idna.encode(host, uts46=True).decode("ascii").lower()
    except UnicodeError:  # idna.IDNAError included
        return host.lower()


def host_breaker_name(owner: str, url: str, scheme: str | None, host: str | None, port: int | None) -> str:
    """The per-host breaker name of a request: ``"api.example.com"``, or
    ``"api.example.com:8443"`` when the port is not the scheme's default.

    Args:
        owner: the adapter's name, for messages.
        url: the request URL, for messages.
        scheme: the URL's scheme (any case), or None.
        host: the URL's host (any case; an IPv6 address without brackets), or None.
        port: the URL's explicit port, or None.

    Returns:
        str: the host as :func:`canonical_host` writes it (an IPv6 address in brackets),
        with ``:port`` when the port is given and not 80 for http/ws or 443 for https/wss.

    Raises:
        ConfigError: the URL has no host.
    """
    if not host:
        raise ConfigError(f"{owner}: the URL {url!r} names no host, so no breaker can be chosen for it")
    name = canonical_host(host)
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"
    if port is not None and port != DEFAULT_PORTS.get((scheme or "").lower()):
        name = f"{name}:{port}"
    return name if name_problem(name) is None else _odd_host_name(name)


def _odd_host_name(name: str) -> str:
    """A valid breaker name for a host that cannot be one as it is (control characters,
    whitespace at an end, more than 1,000 characters): the host with its odd characters
    escaped and, when long, cut short and followed by a digest of the whole, so the request
    is still protected, by a breaker whose name shows what is odd and never collides."""
    shown = repr(name)[1:-1].strip() or "?"  # escapes control characters, keeps the rest
    if len(shown) > 200 or shown != name:
        shown = f"{shown[:200]}~{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"
    return shown


_MAX_HOSTS = 4096  # cached per-host names per adapter


def timeout_bound(timeout: Any) -> float | None:
    """How long one attempt of a request can take at most, from the client's timeout
    (seconds): a number, or the sum of a ``(connect, read)`` pair or of the phases of a
    mapping (httpx's ``connect``, ``read``, ``write``, ``pool``). None when any part is
    unbounded (None) or not a number: then nothing shorter than the setting is known."""
    if isinstance(timeout, dict):
        timeout = tuple(timeout.values())
    parts = timeout if isinstance(timeout, (tuple, list)) else (timeout,)
    total = 0.0
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (int, float)) or not part >= 0:
            return None
        total += part
    return total if parts and total > 0 else None


def sequence_bound(timeout: Any) -> float | None:
    """How long a request's retry sequence may run in all when no deadline is set: its
    timeout in seconds (a number), the read timeout of a ``(connect, read)`` pair, or the
    ``read`` entry of httpx's mapping; None when unbounded or not a number."""
    if isinstance(timeout, dict):
        timeout = timeout.get("read")
    elif isinstance(timeout, (tuple, list)):
        timeout = timeout[-1] if len(timeout) == 2 else None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return None
    return float(timeout)


def clipped_timeout(timeout: Any) -> Any:
    """*timeout* (None, seconds, a ``(connect, read)`` pair or httpx's mapping of phases)
    with every part at most the time the current deadline leaves; unchanged without one."""
    left = time_left()
    if left is None:
        return timeout
    left = max(left, 0.001)  # the transport refuses 0; the attempt was allowed to start

    def clip(part: Any) -> Any:
        if part is None:
            return left
        if isinstance(part, bool) or not isinstance(part, (int, float)):
            return part
        return min(part, left)

    if isinstance(timeout, dict):
        return {key: clip(value) for key, value in timeout.items()}
    if isinstance(timeout, (tuple, list)):
        return type(timeout)(clip(part) for part in timeout)
    return clip(timeout)


class _Entry:
    """The two routes of one breaker: without and with the retry stage."""

    __slots__ = ("breaker", "plain", "retrying")

    def __init__(self, plain: Route, retrying: Route | None) -> None:
        self.breaker = plain.breaker
        self.plain = plain
        self.retrying = retrying


def _probe() -> None:
    """Stands for the request in protect_route's checks (a plain function: accepted)."""


async def _aprobe() -> None:
    """Stands for the request in aprotect_route's checks (a coroutine function: accepted)."""


def _policy_of(owner: str, retry: Any) -> RetryPolicy | None:
    """The retry policy an adapter's *retry* argument names (as the decorators read it: None/False
    none, True the default); a bad one is a ConfigError naming the adapter."""
    try:
        return coerce_retry(retry)
    except ConfigError:
        raise ConfigError(
            f"{owner}(retry={retry!r}): expected a baldur_django.RetryPolicy (or True, or None)"
        ) from None


class Breakers:
    """The breakers one adapter or transport uses, with their routes.

    Args:
        owner: the wrapper's class name, for messages (``"BreakerAdapter"``).
        service: a breaker name (non-empty str), a callable of the request returning
            one, or None for one breaker per host.
        retry: None/False (no retry stage), True (``RetryPolicy()``) or a
            :class:`~baldur_django.RetryPolicy`.
        fallback: None, or a callable of the request.
        overrides: the per-call knobs of the decorators, validated now (no breaker is
            created until a request needs one).
        is_async: build ``aprotect`` routes (awaiting each attempt) instead of ``protect`` ones.
        max_hosts: per-host breakers kept at most (None: ``BALDUR_ADAPTER_MAX_HOSTS``, read
            now); past it the least recently used CLOSED, unforced one is let go, never an
            OPEN, half-open or forced one.

    Raises:
        ConfigError: a bad *service*, *retry*, *fallback* or override, naming it.
    """

    def __init__(
        self,
        owner: str,
        service: Any,
        retry: Any,
        fallback: Any,
        overrides: dict[str, Any],
        *,
        is_async: bool = False,
        max_hosts: int | None = None,
    ) -> None:
        if service is not None and not callable(service) and name_problem(service) is not None:
            raise ConfigError(
                f"{owner}(service={show_name(service, limit=60)}): expected a breaker name ({name_problem(service)}), "
                "a callable of the request returning one, or None for one breaker per host"
            )
        policy = _policy_of(owner, retry)
        if fallback is not None and not callable(fallback):
            raise ConfigError(f"{owner}(fallback={fallback!r}): expected a callable of the request, or None")
        unknown = sorted(set(overrides) - set(OVERRIDE_NAMES))
        if unknown:
            raise ConfigError(f"{owner}: unknown argument(s) {unknown}; known: {', '.join(OVERRIDE_NAMES)}")
        given = {key: value for key, value in overrides.items() if value is not None}
        validate_overrides(owner, given)  # bad values fail here, before any request
        self.owner = owner
        self.service = service
        self.policy = policy
        methods = getattr(policy, "methods", None)
        self.methods = IDEMPOTENT_METHODS if methods is None else frozenset(str(m).upper() for m in methods)
        self.fallback: Callable[[Any], Any] | None = fallback
        self.overrides = given
        self.is_async = is_async
        if max_hosts is None:
            max_hosts = settings.get("BALDUR_ADAPTER_MAX_HOSTS")
        elif isinstance(max_hosts, bool) or not isinstance(max_hosts, int) or max_hosts < 1:
            raise ConfigError(f"{owner}(max_hosts={max_hosts!r}): expected a whole number of at least 1")
        self.max_hosts: int = max_hosts
        #: name -> routes, least recently used first
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.hosts: dict[Any, str] = {}  # origin -> per-host breaker name
        registry.watchers.add(self)  # told when its breakers leave the registry (idle)

    def named(
        self, request: Any, origin: Any, url: Callable[[], tuple[str, str | None, str | None, int | None]]
    ) -> str:
        """The breaker name for *request*.

        Args:
            request: the client's request object, handed to a *service* callable.
            origin: a cheap key of the URL's scheme and authority (``("https",
                "api.example.com:8443")``): per-host names are cached by it.
            url: returns ``(url, scheme, host, port)`` of the request, parsed (called for
                a per-host name not cached yet).

        Raises:
            ConfigError: a host-less URL, or a *service* callable that raised or returned
                something other than a non-empty string.
        """
        service = self.service
        if service is None:
            hosts = self.hosts
            name = hosts.get(origin)
            if name is None:
                name = host_breaker_name(self.owner, *url())
                if len(hosts) >= _MAX_HOSTS:
                    hosts.clear()  # a crawler's worth of hosts: start over rather than grow
                hosts[origin] = name
            return name
        if type(service) is str:
            return service
        try:
            name = service(request)
        except Exception as exc:
            raise ConfigError(f"{self.owner}: the service callable {service!r} raised {exc!r}") from exc
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"{self.owner}: the service callable {service!r} returned {name!r}; expected a non-empty breaker name"
            )
        return name

    def entry(self, name: str) -> _Entry:
        """The routes of breaker *name*, built on first use through the decorators' checks
        and rebuilt when the registry forgot the breaker (``registry.clear()``, tests)."""
        entries = self.entries
        entry = entries.get(name)
        if entry is not None and registry.get(name, create=False) is entry.breaker:
            try:
                entries.move_to_end(name)  # least recently used leave first
            except KeyError:  # let go by another thread meanwhile: still usable this time
                pass
            return entry
        build = aprotect_route if self.is_async else protect_route
        probe = _aprobe if self.is_async else _probe
        plain = build(name, probe, None, None, dict(self.overrides))
        retrying = None if self.policy is None else build(name, probe, self.policy, None, dict(self.overrides))
        entry = _Entry(plain, retrying)
        entries[name] = entry  # one assignment: other threads see the old entry or this one
        if len(entries) > self.max_hosts:
            self._over_cap(entry)
        return entry

    def _over_cap(self, keep: _Entry) -> None:
        """More breakers than :attr:`max_hosts`: let the least recently used CLOSED, unforced
        ones go (from here and from the registry), oldest first; an OPEN, half-open or
        forced one is kept (moved to the recent end, so it is not looked at again soon)."""
        entries = self.entries
        for _ in range(len(entries)):
            if len(entries) <= self.max_hosts:
                return
            try:
                name, entry = next(iter(entries.items()))
            except (StopIteration, RuntimeError):  # emptied or changed by another thread
                return
            if entry is keep:
                entries.move_to_end(name)
                continue
            view = core_of(entry.breaker).view()
            if view.forced is None and view.state is CircuitState.CLOSED:
                entries.pop(name, None)  # its cached host name stays: a string, capped apart
                registry.drop_idle(name, entry.breaker)
            else:
                entries.move_to_end(name)

    def _forget_hosts(self, names: set[str]) -> None:
        """Drop the cached per-host names that name one of *names*."""
        hosts = self.hosts
        for origin in [origin for origin, name in list(hosts.items()) if name in names]:
            hosts.pop(origin, None)

    def let_go(self, gone: dict[str, CircuitBreaker]) -> None:
        """The registry let the breakers in *gone* go (idle): drop their routes, so the
        breakers can be freed; a later request builds them again."""
        dropped = set()
        for name, breaker in gone.items():
            entry = self.entries.get(name)
            if entry is not None and entry.breaker is breaker:
                self.entries.pop(name, None)
                dropped.add(name)
        if dropped:
            self._forget_hosts(dropped)

    def bound_sequence(self, route: Route, timeout: Any) -> Any:
        """With no deadline in force, make the request's own timeout the deadline of its
        retry sequence (:func:`sequence_bound`), so retries never outlast it.

        Returns:
            The token to give :func:`~baldur_django.core.stages.deadline.leave`, or None
            (a deadline is in force already, the route does not retry, or no bound).
        """
        if route.policy is None or in_force() is not None:
            return None
        seconds = sequence_bound(timeout)
        if seconds is None:
            return None
        return enter(seconds, core_of(route.breaker).clock)

    def enter_bounds(self, route: Route, timeout: Any) -> tuple[Any, Any]:
        """What a request's *timeout* bounds, entered: a half-open trial's lease in a shared
        store (:func:`~baldur_django.core.lease.enter_call_bound`) and, with no deadline in
        force, its retry sequence (:meth:`bound_sequence`). Pair with :meth:`leave_bounds`."""
        return enter_call_bound(timeout_bound(timeout)), self.bound_sequence(route, timeout)

    @staticmethod
    def leave_bounds(bounds: tuple[Any, Any]) -> None:
        """Undo :meth:`enter_bounds`."""
        leave_call_bound(bounds[0])
        leave(bounds[1])

    def route(self, entry: _Entry, method: str | None, replayable: bool) -> Route:
        """The route of one request: with the retry stage only for a method the policy
        retries and a body that can be sent again."""
        if entry.retrying is not None and replayable and (method or "").upper() in self.methods:
            return entry.retrying
        return entry.plain
