"""CB-14, CB-20, ST-2, OP-4: ``breaker.reset()`` on a shared store resets the shared record.

Before, a reset changed only the resetting worker's local state: the shared record stayed
OPEN (or forced), so the worker was OPEN again at its next consult and no peer followed.
Now the reset is one store operation (``clear``), every worker adopts it, and only the
resetting worker announces it. Each test runs on every store backend.
"""

from __future__ import annotations

import pytest

from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import SettingsSource, build_config
from baldur_django.core.errors import StoreError
from baldur_django.core.events import EventBus, Reset, StateChanged
from baldur_django.core.states import CircuitState
from baldur_django.core.stores.base import StoreUnavailable
from baldur_django.core.sync import StoreGuard
from baldur_django.core.testing import FakeClock, RecordingListener

SYNC = 5.0


class SwitchableStore:
    """Passes every call to *inner*; ``down = True`` makes every call fail."""

    def __init__(self, inner):
        self.inner = inner
        self.backend = inner.backend
        self.down = False

    def __getattr__(self, op):
        target = getattr(self.inner, op)

        def call(*args, **kwargs):
            if self.down:
                raise StoreUnavailable("simulated outage")
            return target(*args, **kwargs)

        return call


@pytest.fixture
def fleet(backend):
    """``fleet()`` makes one worker (a breaker with its own bus and guard) on *backend*'s store."""
    clock = FakeClock()
    store = SwitchableStore(backend.store)
    name = f"reset-{backend.name}"

    def worker():
        bus = EventBus()
        source = SettingsSource(environ={"BALDUR_CB_SYNC_INTERVAL_SECONDS": str(SYNC)})
        guard = StoreGuard(store, lambda: 60.0, bus.publish, clock.monotonic, clock.wall)
        config = build_config(name, {"failure_threshold": 2, "recovery_timeout": 600}, source)
        breaker = CircuitBreaker(name, config, clock=clock, bus=bus)
        breaker.use_store(guard)
        breaker.events = RecordingListener(bus)
        return breaker

    worker.clock = clock
    worker.store = store
    worker.name = name
    return worker


def trip(breaker):
    for _ in range(2):
        breaker.record_failure(breaker.acquire())
    assert breaker.state is CircuitState.OPEN


def test_cb20_reset_of_an_open_breaker_is_written_to_the_shared_record(fleet):
    """CB-20, ST-2: a reset worker stays CLOSED after its next consult, a peer follows it,
    and the shared record is a fresh CLOSED one; only the resetting worker announces it."""
    a, b = fleet(), fleet()
    trip(a)
    fleet.clock.advance(SYNC)
    assert b.refresh() is CircuitState.OPEN  # the peer adopted the trip at its consult
    a.reset()
    record = fleet.store.load(fleet.name).record
    assert (record.state, record.forced, record.opens, record.trigger) == ("closed", None, 0, "reset")
    fleet.clock.advance(SYNC)
    assert a.refresh() is CircuitState.CLOSED  # the next consult no longer reopens it
    assert b.refresh() is CircuitState.CLOSED
    assert a.acquire() is not None and b.acquire() is not None
    assert [(e.from_state, e.to_state) for e in a.events.events if isinstance(e, Reset)] == [("open", "closed")]
    assert not [e for e in b.events.events if isinstance(e, (Reset, StateChanged)) and e.to_state == "closed"]


def test_cb20_reset_clears_a_shared_force(fleet):
    """CB-20, OP-1: a reset removes a force held in the shared record, for every worker."""
    a, b = fleet(), fleet()
    b.force_open(ttl_minutes=5, reason="outage")
    a.reset()
    assert fleet.store.load(fleet.name).record.forced is None
    fleet.clock.advance(SYNC)
    assert (a.refresh(), b.refresh()) == (CircuitState.CLOSED, CircuitState.CLOSED)
    assert (a.forced, b.forced) == (None, None)
    (event,) = [e for e in a.events.events if isinstance(e, Reset)]
    assert (event.from_state, event.forced) == ("open", "open")


def test_op4_reset_store_failure_raises_and_changes_nothing(fleet):
    """OP-4: a reset whose store write fails raises StoreError; the worker stays OPEN and
    announces nothing."""
    a = fleet()
    trip(a)
    fleet.store.down = True
    with pytest.raises(StoreError, match="could not store the reset"):
        a.reset()
    assert a.state is CircuitState.OPEN
    assert not [e for e in a.events.events if isinstance(e, Reset)]
