"""The load-aware stages of one service (breaker), shared by every call site of it.

A service's Retry-After gate, adaptive throttle, bulkhead and retry budget are one set per
breaker, not per decorated function: two functions protected by the same breaker share one
bulkhead of N slots and one retry budget. :class:`ServiceStages` holds that set;
:func:`service_stages` returns it for a breaker's core, building it on first use and again
whenever the breaker's configuration object or its store link changes (identity compared,
so a reconfiguration gives fresh stages, with the new limits); :func:`stages_of` only reads.

The holders are kept beside the breakers (a weak map keyed by the breaker's core), never
on them: a breaker dropped by the registry takes its stages with it.

Scope ``"fleet"`` (bulkhead, retry budget) and the gate of a breaker sharing a Redis store
use the client and key prefix of that store; without a Redis store the bulkhead and the
budget keep to this worker (logged once per service and configuration, as
``circuit_breaker.stage_scope_worker``). The gate of a breaker sharing a store that keeps
gates itself (the database store: a :class:`~.fleet_gate.GateStore`) is the fleet's too.
A fleet gate is learnt by reading the store: the first call after each sync interval
(``BALDUR_CB_SYNC_INTERVAL_SECONDS``) past the previous read asks the store for the
service's gate end (one round trip; :meth:`ServiceStages.learn`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..breaker import CircuitBreaker, core_of
from ..config import BreakerConfig
from ..log import log_event
from ..stores.base import StoreUnavailable
from .budget import RetryBudget
from .bulkhead import Bulkhead
from .fleet_bulkhead import FleetBulkhead
from .fleet_gate import FleetGate, GateStore, RedisGateStore, gate_ends
from .gate import RetryAfterGate
from .throttle import AdaptiveThrottle

if TYPE_CHECKING:
    from ..calls import BreakerCore

__all__ = ["ServiceStages", "stages_of", "service_stages", "budget_of", "wants_stages", "redis_of"]

_FLEET = "fleet"


def wants_stages(config: BreakerConfig) -> bool:
    """True when *config* turns on a stage this module holds (gate, throttle, bulkhead,
    budget); the deadline needs no holder."""
    return (
        config.honor_retry_after
        or config.max_concurrent_calls is not None
        or config.retry_budget_ratio is not None
        or config.adaptive_throttling_k is not None
    )


def redis_of(core: BreakerCore) -> tuple[Any, str] | None:
    """The redis-py client and key prefix of the Redis store *core* shares its state
    through, or None (memory backend, database store, no store)."""
    store = _store_of(core)
    client = getattr(store, "client", None)
    if client is None or getattr(store, "backend", None) != "redis":
        return None
    return client, str(getattr(store, "prefix", "baldur"))


class ServiceStages:
    """The stages of one service, built from one configuration.

    Attributes:
        service (str): the breaker's name.
        config (BreakerConfig): the configuration they were built from.
        sync (object): the breaker's store link at that time (compared by identity).
        gate: ``RetryAfterGate`` (``FleetGate`` with a Redis or database store) or None.
        throttle: ``AdaptiveThrottle`` or None.
        bulkhead: ``Bulkhead`` or ``FleetBulkhead`` (``bulkhead_scope="fleet"``) or None.
        budget: ``RetryBudget`` or ``FleetRetryBudget`` (``retry_budget_scope="fleet"``) or None.
        fleet_gate (bool): the gate's end is shared through the store.
        per_attempt (bool): a stage runs around each attempt (gate, throttle or bulkhead).
        clock (Clock): the breaker's clock.
    """

    __slots__ = (
        "service",
        "config",
        "sync",
        "gate",
        "throttle",
        "bulkhead",
        "budget",
        "fleet_gate",
        "clock",
        "per_attempt",
        "_next_read",
    )

    def __init__(self, core: BreakerCore) -> None:
        config = core.config
        self.service = core.name
        self.config = config
        self.sync: object = core.sync
        self.clock = core.clock
        redis = redis_of(core)
        self.gate: RetryAfterGate | FleetGate | None = _gate(core, config, redis)
        self.fleet_gate = isinstance(self.gate, FleetGate)
        self.throttle: AdaptiveThrottle | None = None
        if config.adaptive_throttling_k is not None:
            self.throttle = AdaptiveThrottle(
                core.name, config.adaptive_throttling_k, config.adaptive_throttling_window, core.clock
            )
        self.bulkhead: Bulkhead | FleetBulkhead | None = _bulkhead(core, config, redis)
        self.budget: Any = _budget(core, config, redis)
        self.per_attempt = self.gate is not None or self.throttle is not None or self.bulkhead is not None
        self._next_read = float("-inf")

    def __repr__(self) -> str:
        built = [n for n in ("gate", "throttle", "bulkhead", "budget") if getattr(self, n) is not None]
        return f"<ServiceStages {self.service!r} {' '.join(built) or 'none'}>"

    def current(self, core: BreakerCore) -> bool:
        """True while *core*'s configuration and store link are the ones these stages were
        built from."""
        return core.config is self.config and core.sync is self.sync

    def read_due(self, now: float) -> bool:
        """True when a fleet gate's read of the store is due at *now* (monotonic seconds)."""
        return self.fleet_gate and now >= self._next_read

    def learn(self, now: float, interval: float) -> None:
        """Adopt the fleet's gate end for the service when a read is due: at most one store
        read (one round trip) per *interval* seconds; nothing without a fleet gate.

        Args:
            now: this process's monotonic time, seconds.
            interval: seconds between two reads (the breaker's sync interval).

        A store that does not answer changes nothing (the local gate keeps working).
        """
        if not self.read_due(now):
            return
        self._next_read = now + interval  # before the read: one thread reads, the others go on
        gate = self.gate
        assert isinstance(gate, FleetGate)
        try:
            ends = gate_ends(gate.store, (self.service,), self.clock)
        except StoreUnavailable:
            return
        end = ends.get(self.service)
        if end is not None:
            gate.close_until(end)


def _gate(core: BreakerCore, config: BreakerConfig, redis: tuple[Any, str] | None) -> RetryAfterGate | FleetGate | None:
    if not config.honor_retry_after:
        return None
    local = RetryAfterGate(core.name, core.clock, config.max_cooldown, rate_limit_codes=config.rate_limit_codes)
    if redis is not None:
        client, prefix = redis
        return FleetGate(local, RedisGateStore(client, prefix))
    store = _store_of(core)
    if isinstance(store, GateStore):  # the database store keeps the fleet's gates in a table
        return FleetGate(local, store)
    return local


def _store_of(core: BreakerCore) -> object:
    """The store *core* shares its state through, or None."""
    return getattr(getattr(core.sync, "guard", None), "store", None)


def _bulkhead(
    core: BreakerCore, config: BreakerConfig, redis: tuple[Any, str] | None
) -> Bulkhead | FleetBulkhead | None:
    limit = config.max_concurrent_calls
    if limit is None:
        return None
    if config.bulkhead_scope == _FLEET:
        if redis is not None:
            client, prefix = redis
            return FleetBulkhead(
                core.name, limit, config.max_wait, config.bulkhead_lease, client, core.clock, prefix=prefix
            )
        _worker_scope(core.name, "bulkhead_scope")
    return Bulkhead(core.name, limit, config.max_wait, core.clock)


def _budget(core: BreakerCore, config: BreakerConfig, redis: tuple[Any, str] | None) -> Any:
    ratio = config.retry_budget_ratio
    if ratio is None:
        return None
    if config.retry_budget_scope == _FLEET:
        if redis is not None:
            from .fleet_budget import FleetRetryBudget

            client, prefix = redis
            return FleetRetryBudget(
                core.name, ratio, config.retry_budget_min_per_second, core.clock, client, prefix=prefix
            )
        _worker_scope(core.name, "retry_budget_scope")
    return RetryBudget(core.name, ratio, config.retry_budget_min_per_second, core.clock)


def _worker_scope(service: str, knob: str) -> None:
    log_event(
        logging.WARNING,
        "circuit_breaker.stage_scope_worker",
        service,
        "%s='fleet' without a Redis state store: this worker keeps its own count",
        knob,
        knob=knob,
    )


#: a breaker's core -> its stages (the latest built)
_held: weakref.WeakKeyDictionary[BreakerCore, ServiceStages] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def service_stages(core: BreakerCore) -> ServiceStages | None:
    """The stages of *core*'s service for its current configuration: built on first use and
    rebuilt after the configuration or the store link changed; None when the configuration
    turns on none of them.

    Raises:
        ConfigError: a stage's knob is out of range (the components check their arguments).
    """
    held = _held.get(core)
    if held is not None and held.current(core):
        return held
    if not wants_stages(core.config):
        return None
    with _lock:
        held = _held.get(core)
        if held is None or not held.current(core):
            held = _held[core] = ServiceStages(core)
        return held


def stages_of(breaker: CircuitBreaker) -> ServiceStages | None:
    """The stages *breaker*'s calls use now, for reading (figures, status pages); builds
    nothing.

    Returns:
        The holder, or None when the breaker's configuration turns on no stage, or no call
        has gone through them since the configuration (or the store) last changed.
    """
    core = core_of(breaker)
    held = _held.get(core)
    if held is None or not held.current(core):
        return None
    return held


def budget_of(core: BreakerCore) -> Any:
    """The retry budget *core*'s calls spend now (``try_retry()``), or None: no budget, or
    no staged call has begun under the current configuration. A cheap read, never builds."""
    held = _held.get(core)
    if held is None or not held.current(core):
        return None
    return held.budget
