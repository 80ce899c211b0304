"""Process-wide registry of named breakers, and the operator functions on top of it.

Breakers are identified by name: the first registration's overrides win; a
later registration with different overrides logs ``circuit_breaker.config_conflict``
once. The Django layer hooks in through :func:`set_backend` (shared stores) and calls
:func:`reconfigure_all` when settings change.

Idle breakers leave: one that stayed CLOSED and unforced with no call for
``BALDUR_REGISTRY_IDLE_SECONDS`` is dropped by :meth:`Registry.sweep`, which runs now and
then when a breaker is created and when the metrics are read (never on a call's path). A
dropped breaker that something still holds (a decorated function, an adapter) is not lost:
the registry keeps a weak reference to it, and the next lookup of its name, or the next
sweep that sees it used, puts the same object back.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from .breaker import CircuitBreaker, core_of
from .clock import SYSTEM_CLOCK, Clock
from .config import SettingsSource, build_config, settings, validate_overrides
from .errors import ConfigError
from .events import bus
from .log import LoggingListener, log_event
from .names import check_name, show_name
from .readings import after_fork, metric_values
from .states import CircuitState
from .stores.base import StateStore
from .sync import StoreGuard

__all__ = [
    "Registry",
    "registry",
    "get_breaker",
    "force_open_circuit",
    "force_close_circuit",
    "release_circuit",
    "record_rate_limit",
    "Watcher",
    "activity",
]

#: Longest time between two sweeps for idle breakers (seconds); shorter when the idle time is short.
SWEEP_EVERY = 60.0


class Watcher(Protocol):
    """Something that keeps breakers of its own (an HTTP adapter's routes, the metrics'
    series) and lets them go when the registry does."""

    def let_go(self, gone: dict[str, CircuitBreaker]) -> None:
        """Drop what is kept for the breakers in *gone* (name -> the breaker that left)."""


def activity(breaker: CircuitBreaker) -> tuple[int, int]:
    """``(calls, others)``: two numbers that grow with every call, and with every rejection
    and transition, of *breaker*; two equal readings mean nothing happened in between.
    Reads the breaker's counts (its lock, no I/O)."""
    core = core_of(breaker)
    _, counts, _ = metric_values(core)
    return sum(counts[:4]), sum(counts[4:]) + core.generation


def _last_active(
    breaker: CircuitBreaker, seen: tuple[Any, float] | None, reading: tuple[int, int], moment: float
) -> float:
    """When *breaker* was last active, as a sweep at monotonic *moment* that finds *reading*
    different from *seen* can tell without a clock read on the call path. A change made of
    calls alone ended before the end of the cascade's newest second (every call is counted
    there, at most a second before that end), so the idle time counts from there, not from
    this sweep, however long nothing looked; any other change (a rejection, a transition)
    counts from *moment*."""
    if seen is None or not isinstance(seen[0], tuple) or seen[0][1] != reading[1]:
        return moment
    end = core_of(breaker).cascade.bucket_end
    return max(seen[1], min(moment, end))


def _idle_state(breaker: CircuitBreaker) -> bool:
    """True while *breaker* is CLOSED and unforced as this process holds it (no I/O)."""
    view = core_of(breaker).view(locked=True)
    return view.state is CircuitState.CLOSED and view.forced is None


class Registry:
    """name -> :class:`CircuitBreaker`, created on first use with the resolved config.

    Args:
        source: settings to resolve configurations from.
        clock: time source handed to every breaker.
    """

    def __init__(self, source: SettingsSource = settings, clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self.clock = clock
        self.guard: StoreGuard | None = None  # set when a shared store is configured
        self.store_configured = False  # set by set_store(); else the first breaker builds one from settings
        self._breakers: dict[str, CircuitBreaker] = {}
        #: Per-name caches other modules keep for these breakers (``protect()``'s routes,
        #: ``core/hotpath.py``): emptied with the breakers by :meth:`clear`.
        self.name_caches: list[dict[str, Any]] = []
        self._overrides: dict[str, dict[str, Any] | None] = {}
        self._conflicts: set[str] = set()
        self._lock = threading.RLock()
        # Idle tracking, read only by sweep(): name -> (activity reading, monotonic time it
        # last changed); None as the reading means "not read yet".
        self._seen: dict[str, tuple[tuple[int, int] | None, float]] = {}
        # Breakers a sweep let go that something still holds (a weak reference each, gone
        # with the breaker), their overrides, and their activity when they left.
        self._left: weakref.WeakValueDictionary[str, CircuitBreaker] = weakref.WeakValueDictionary()
        self._left_overrides: dict[str, tuple[dict[str, Any] | None, tuple[int, int] | None]] = {}
        self._swept_at = clock.monotonic()
        # (settings source, its version, seconds between sweeps) as last read by _sweep_due()
        self._sweep_gap: tuple[SettingsSource | None, int, float] = (None, -1, 0.0)
        #: Objects told which breakers left (:class:`Watcher`), held weakly.
        self.watchers: weakref.WeakSet[Any] = weakref.WeakSet()

    def __iter__(self) -> Iterator[CircuitBreaker]:
        return iter(list(self._breakers.values()))

    def __len__(self) -> int:
        return len(self._breakers)

    def names(self) -> list[str]:
        """Names of the breakers known to this process, sorted."""
        return sorted(self._breakers)

    def get(self, name: str, overrides: dict[str, Any] | None = None, *, create: bool = True) -> CircuitBreaker | None:
        """Return the breaker called *name*, creating it when *create*.

        Args:
            name: service name: a non-empty string of at most 1,000 characters, without
                control characters or whitespace at either end (checked when the breaker
                is created; a lookup with *create* False of any other string finds nothing).
            overrides: per-call overrides, validated (None registers none).
            create: when False, return None for an unknown name.

        Raises:
            ConfigError: an invalid name (the message says what is wrong with it), or a
                bad override or setting.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"breaker name {name!r}: must be a non-empty string")
        breaker = self._breakers.get(name)
        if breaker is None and name in self._left_overrides:  # a plain dict: cheaper than asking _left
            breaker = self._return(name)
        if breaker is not None and overrides is None:
            return breaker
        if breaker is None and not create:
            return None
        # A new name is checked once, by the breaker's constructor, before anything is
        # registered; a mistake found first in the overrides or the store settings is
        # reported after the name's own, as if the name had been checked first.
        try:
            checked = validate_overrides(name, overrides) if overrides else ({} if overrides is not None else None)
            if not self.store_configured:
                self._store_from_settings()
        except ConfigError:
            check_name(name)
            raise
        return self._register(name, checked)

    def _register(self, name: str, checked: dict[str, Any] | None) -> CircuitBreaker:
        """The breaker *name*, registered now if new (or put back if it left), with its
        checked overrides met."""
        made_at = None
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None and name in self._left_overrides:
                breaker = self._return(name)
            if breaker is None:
                made_at = self.clock.monotonic()
                breaker = self._create(name, checked, made_at)
            elif checked is not None:
                self._meet_overrides(name, breaker, checked)
        if made_at is not None and self._sweep_due(made_at):
            try:
                self.sweep()  # at most once per sweep interval: creations are what make a registry grow
            except ConfigError:  # a bad idle setting: the system checks report it; creating goes on
                pass
        return breaker

    def _return(self, name: str) -> CircuitBreaker | None:
        """Put back breaker *name* that a sweep let go while something still holds it (the
        same object, with its state and counts); None when it is gone."""
        with self._lock:
            if name not in self._left_overrides:  # every name in _left has its entry there
                return self._breakers.get(name)
            breaker = self._left.pop(name, None)
            overrides, _ = self._left_overrides.pop(name, (None, 0))
            if breaker is None or name in self._breakers:
                return self._breakers.get(name)
            self._breakers[name] = breaker
            self._overrides[name] = overrides
            self._seen[name] = (None, self.clock.monotonic())
        return breaker

    def _create(self, name: str, checked: dict[str, Any] | None, moment: float) -> CircuitBreaker:
        """Build and register breaker *name* with its checked overrides (lock held); *moment*
        is the monotonic time now. The breaker's constructor refuses a bad name (ConfigError)
        before anything is registered."""
        config = build_config(name, checked or {}, self.source, self.clock)
        breaker = CircuitBreaker(name, config, clock=self.clock, bus=bus)
        if self.guard is not None:
            breaker.use_store(self.guard)
        self._breakers[name] = breaker
        if checked is not None:  # an absent entry reads None
            self._overrides[name] = checked
        self._seen[name] = ((0, 0), moment)  # a new breaker has done nothing yet
        return breaker

    def _meet_overrides(self, name: str, breaker: CircuitBreaker, checked: dict[str, Any]) -> None:
        """A registered breaker asked for with overrides (lock held): the first overrides
        given are adopted; different ones later are ignored, with one warning per name."""
        known = self._overrides.get(name)
        if known is None:
            # created by get_breaker()/an operator before any decorator: adopt these
            self._overrides[name] = checked
            breaker.reconfigure(build_config(name, checked, self.source, self.clock))
        elif known != checked and name not in self._conflicts:
            self._conflicts.add(name)
            log_event(logging.WARNING, "circuit_breaker.config_conflict", name, "kept=%r ignored=%r", known, checked)

    # ------------------------------------------------------------- idle breakers
    def sweep(self, *, now: bool = False) -> list[str]:
        """Let go of the breakers that stayed idle for ``BALDUR_REGISTRY_IDLE_SECONDS``.

        Idle means CLOSED, unforced, and no call, rejection or transition since an earlier
        sweep at least that long ago (or since the breaker was made). Each one leaves this
        registry, the cached routes and every :class:`Watcher`; one that something still
        holds comes back, the same object, on the next lookup of its name or on the first
        sweep that sees it used. A breaker that left and was used meanwhile is put back.
        Runs at most once per sweep interval (a sixtieth of the idle time, at most
        :data:`SWEEP_EVERY` seconds) unless *now*; does nothing when the setting is 0. Reads
        each breaker's counts under its own lock; no store I/O.

        Args:
            now: sweep whatever the time since the last sweep.

        Returns:
            list[str]: the names that left, sorted.
        """
        idle = float(self.source.get("BALDUR_REGISTRY_IDLE_SECONDS") or 0.0)
        if idle <= 0:
            return []
        moment = self.clock.monotonic()
        if not now and 0 <= moment - self._swept_at < min(idle / 60.0, SWEEP_EVERY):
            return []
        self._swept_at = moment
        self._take_back_used()
        idle_now: list[tuple[str, CircuitBreaker, tuple[int, int]]] = []
        for name, breaker in list(self._breakers.items()):
            reading = activity(breaker)
            seen = self._seen.get(name)
            if seen is None or seen[0] != reading:
                since = _last_active(breaker, seen, reading, moment)
                self._seen[name] = (reading, since)
            else:
                since = seen[1]
            if moment - since >= idle and _idle_state(breaker):
                idle_now.append((name, breaker, reading))
        gone = self._let_go(idle_now)
        return sorted(gone)

    def _sweep_due(self, moment: float) -> bool:
        """False when :meth:`sweep` (not *now*) would certainly do nothing at *moment*, so a
        creation need not call it: the sweep interval, from the idle setting, is read once
        per settings version (every settings change makes a new one). True also when the
        setting is bad, so that :meth:`sweep` raises it."""
        source = self.source
        held, version, every = self._sweep_gap
        if held is not source or version != source.version:
            version = source.version  # read before the value, as build_config() does
            try:
                idle = float(source.get("BALDUR_REGISTRY_IDLE_SECONDS") or 0.0)
            except ConfigError:
                return True
            every = min(idle / 60.0, SWEEP_EVERY) if idle > 0 else math.inf
            self._sweep_gap = (source, version, every)
        return not 0 <= moment - self._swept_at < every

    def _take_back_used(self) -> None:
        """Put back every breaker that left and was used since (a decorated function's)."""
        for name, breaker in list(self._left.items()):
            _, reading = self._left_overrides.get(name, (None, None))
            if activity(breaker) != reading:
                self._return(name)
        with self._lock:  # overrides of breakers that are gone for good
            for name in [name for name in self._left_overrides if name not in self._left]:
                del self._left_overrides[name]

    def _let_go(self, idle: list[tuple[str, CircuitBreaker, tuple[int, int]]]) -> dict[str, CircuitBreaker]:
        """Drop the breakers in *idle* that are still registered and still idle, then tell
        the watchers (outside the lock)."""
        gone: dict[str, CircuitBreaker] = {}
        with self._lock:
            for name, breaker, reading in idle:
                if self._breakers.get(name) is not breaker:
                    continue
                del self._breakers[name]
                self._left_overrides[name] = (self._overrides.pop(name, None), reading)
                self._left[name] = breaker
                self._seen.pop(name, None)
                self._conflicts.discard(name)
                for cache in self.name_caches:
                    cache.pop(name, None)
                gone[name] = breaker
        if gone:
            for watcher in list(self.watchers):
                watcher.let_go(gone)
        return gone

    def holds(self, name: str, breaker: CircuitBreaker) -> bool:
        """True while *breaker* is the one registered as *name* (a dictionary read: no
        lock, nothing put back or created).

        Args:
            name (str): the breaker's name.
            breaker (CircuitBreaker): the object to look for.

        Returns:
            bool: False also when the breaker left (a sweep let it go) or was forgotten.
        """
        return self._breakers.get(name) is breaker

    def drop_idle(self, name: str, breaker: CircuitBreaker) -> bool:
        """Drop *breaker* now if it is the one registered as *name* and CLOSED and unforced
        (an adapter over its cap of hosts): as :meth:`sweep` drops an idle one.

        Returns:
            bool: True when it left.
        """
        if self._breakers.get(name) is not breaker or not _idle_state(breaker):
            return False
        return bool(self._let_go([(name, breaker, activity(breaker))]))

    def everyone(self) -> list[CircuitBreaker]:
        """Every breaker this process may still use: the registered ones and those a sweep
        let go while something still holds them."""
        return [*self._breakers.values(), *self._left.values()]

    def set_store(self, store: StateStore | None) -> None:
        """Share every breaker's state through *store* (None: back to process-local).

        Each breaker swaps the store strategy it holds (never its class), so functions
        decorated before the store was configured keep working.
        """
        with self._lock:
            self.store_configured = True
            if store is None:
                self.guard = None
                for breaker in self.everyone():
                    breaker.use_store(None)
                return
            self.guard = StoreGuard(
                store,
                interval=lambda: self.source.get("BALDUR_STORE_WARNING_INTERVAL_SECONDS"),
                publish=bus.publish,
                monotonic=self.clock.monotonic,
                wall=self.clock.wall,
            )
            for breaker in self.everyone():
                breaker.use_store(self.guard)

    def _store_from_settings(self) -> None:
        """Plain-Python use (no Django app): build the Redis store, or the store class a dotted
        path names, from environment settings."""
        with self._lock:
            if self.store_configured:
                return
            backend = self.source.get("BALDUR_STATE_BACKEND")
            store: StateStore | None = None
            if backend == "redis":
                url = self.source.get("BALDUR_REDIS_URL")
                if not url:
                    raise ConfigError("BALDUR_STATE_BACKEND='redis' without Django needs BALDUR_REDIS_URL")
                from .stores.redis import RedisStore, connect

                store = RedisStore(
                    connect(
                        url,
                        self.source.get("BALDUR_REDIS_SOCKET_TIMEOUT"),
                        self.source.get("BALDUR_REDIS_MAX_CONNECTIONS"),
                        cluster=self.source.get("BALDUR_REDIS_CLUSTER"),
                    ),
                    record_ttl=self.source.get("BALDUR_REGISTRY_IDLE_SECONDS"),
                )
            elif backend == "database":
                raise ConfigError(
                    "BALDUR_STATE_BACKEND='database' needs the Django app (add 'baldur_django' to INSTALLED_APPS)"
                )
            elif backend != "memory":  # the dotted path of a store class
                from .stores.base import make_store

                store = make_store(backend)
            self.set_store(store)

    @property
    def store(self) -> StateStore | None:
        """The shared store in use, or None (memory backend)."""
        return None if self.guard is None else self.guard.store

    def reconfigure_all(self) -> None:
        """Re-resolve every breaker's configuration from current settings.

        Per-call overrides are kept; a bad new setting raises ConfigError and leaves
        every breaker on its previous configuration.
        """
        with self._lock:
            held = {**{name: b for name, b in self._left.items()}, **self._breakers}
            overrides = {name: pair[0] for name, pair in self._left_overrides.items()}
            overrides.update(self._overrides)
            fresh = {name: build_config(name, overrides.get(name) or {}, self.source, self.clock) for name in held}
            for name, config in fresh.items():
                held[name].reconfigure(config)

    def forget(self, name: str) -> bool:
        """Drop breaker *name* from this process, with its overrides and cached routes.

        Only this process: the shared record is the store's business. A later use builds
        a fresh breaker.

        Returns:
            bool: True when this process knew the breaker.
        """
        with self._lock:
            known = self._breakers.pop(name, None) is not None
            self._left.pop(name, None)
            self._left_overrides.pop(name, None)
            self._seen.pop(name, None)
            self._overrides.pop(name, None)
            self._conflicts.discard(name)
            for cache in self.name_caches:
                cache.pop(name, None)
        return known

    def clear(self) -> None:
        """Forget every breaker (tests; a new process)."""
        with self._lock:
            self._breakers.clear()
            self._left.clear()
            self._left_overrides.clear()
            self._seen.clear()
            self._overrides.clear()
            self._conflicts.clear()
            for cache in self.name_caches:
                cache.clear()


#: The process-wide registry used by the facade.
registry = Registry()


def _after_fork_in_child() -> None:
    """A forked child (gunicorn ``--preload``, Celery prefork) counts its own calls: each
    breaker's metrics start from what it inherited, so the parent's counts are never
    reported again by every child."""
    for breaker in registry.everyone():
        try:
            after_fork(core_of(breaker))
        except Exception:  # pragma: no cover - never fail a fork
            logging.getLogger("baldur.metrics").exception("metrics.fork_failed service=%s", show_name(breaker.name))


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)

_logging_listener = LoggingListener(lambda: settings.get("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL"))
bus.subscribe(_logging_listener)


def get_breaker(service: str) -> CircuitBreaker:
    """Return the breaker for *service*, registering it with default settings if new.

    Returns:
        CircuitBreaker: ``.state`` is a :class:`CircuitState`; ``.snapshot()`` a dict.

    Raises:
        ConfigError: *service* is not a valid name: not a string, empty, longer than
            1,000 characters, with a control character or whitespace at an end.
    """
    return registry.get(service)  # type: ignore[return-value]  # create=True: never None


def force_open_circuit(
    service: str, ttl_minutes: float | None = None, reason: str = "", actor: str | None = None
) -> None:
    """Force *service* OPEN for *ttl_minutes* minutes (None: the default lifetime).

    Raises:
        ConfigError: bad lifetime (<= 0, > 1440, not a number) or name; nothing is written.
    """
    get_breaker(service).force_open(ttl_minutes, reason, actor)


def force_close_circuit(
    service: str, ttl_minutes: float | None = None, reason: str = "", actor: str | None = None
) -> None:
    """Force *service* CLOSED for *ttl_minutes* minutes (None: the default lifetime).

    Raises:
        ConfigError: bad lifetime or name; nothing is written.
    """
    get_breaker(service).force_close(ttl_minutes, reason, actor)


def release_circuit(service: str, actor: str | None = None) -> bool:
    """Return *service* to automatic judgement.

    Returns:
        bool: False when nothing was forced (a no-op).
    """
    return get_breaker(service).release(actor=actor)


def record_rate_limit(service: str, retry_after: Any = None) -> None:
    """Report a 429 seen outside a protected call.

    Records a breaker failure, a cascade sighting counted as a call, and a cooldown.

    Args:
        service: breaker name.
        retry_after: seconds (int/float) or a ``Retry-After`` header string; None uses
            ``BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS``.
    """
    get_breaker(service).report_rate_limit(retry_after)
