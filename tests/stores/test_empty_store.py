"""ST-4: a store that comes back empty never lets a call reach a dependency the worker knows
is down, through any path that reads the store.

A worker trips (the trip is written), then the store loses every record (a Redis restarted
empty: the test's keys are deleted on the real server; the memory store is swapped for an
empty one). Whichever operation reads the store next gets a fresh CLOSED record older than
the one the worker adopted: the first-use-or-interval consult, the probe request when the
worker's open time is over, a trial's outcome, an explicit ``sync()`` and the sweep of a
state read. In every case the worker keeps its own OPEN or HALF_OPEN judgement, writes its
open back as a trip (the store holds OPEN again), and the dependency sees no call.
The worker's clock is a FakeClock; the memory store runs on it too.
"""

from __future__ import annotations

import threading

import pytest

import baldur_django as baldur
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.stores.base import decode
from baldur_django.core.stores.redis import RedisStore
from tests.stores.conftest import _shift
from tests.stores.test_outage_reopen import SwitchedStore

pytestmark = [pytest.mark.redis]

RECOVERY = 10.0


class DependencyDown(Exception):
    """The protected dependency's own failure."""


class Emptied:
    """One store under test: ``wipe()`` empties it as a restart would; ``state(name)`` reads
    the stored record's state without normalising it; ``age(name, seconds)`` lets that much
    time pass for a stored record (the memory store runs on the test's FakeClock already)."""

    def __init__(self, store, wipe, state, age=lambda name, seconds: None) -> None:
        self.store, self.wipe, self.state, self.age = store, wipe, state, age


@pytest.fixture(params=["memory", "redis"])
def emptied(request, fresh_registry, clock):
    if request.param == "memory":
        switched = SwitchedStore(clock)
        yield Emptied(switched, switched.wipe, lambda name: switched.inner.raw(name).state)
    else:
        client = request.getfixturevalue("redis_client")
        store = RedisStore(client, prefix=client.test_prefix)

        def wipe() -> None:
            for key in client.scan_iter(f"{client.test_prefix}:*"):
                client.delete(key)

        def age(name: str, seconds: float) -> None:
            key = store.key(name)
            client.set(key, _shift(client.get(key), seconds))

        yield Emptied(store, wipe, lambda name: decode(client.get(store.key(name))).state, age)


def worker(fresh_registry, monkeypatch, emptied, name: str, *, sync: float, max_calls: int = 1):
    """A worker's breaker on the store (sync interval *sync* seconds, 0 = events only) and
    the dependency it protects, counting its calls; fails while ``down[0]``."""
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", str(sync))
    baldur_settings.reset()
    fresh_registry.set_store(emptied.store)
    calls: list[str] = []
    down = [True]
    before: list = []  # run inside the next call, before it fails or succeeds

    @baldur.circuit_breaker(
        name, failure_threshold=1, recovery_timeout=RECOVERY, half_open_max_calls=max_calls, failure_rate_threshold=0
    )
    def dependency() -> str:
        calls.append("call")
        while before:
            before.pop(0)()
        if down[0]:
            raise DependencyDown("down")
        return "ok"

    dependency.calls, dependency.down, dependency.before = calls, down, before
    return dependency


def trip(dependency, emptied, name: str, *, wipe: bool = True) -> None:
    """One failed call opens the breaker (written to the store); then the store empties."""
    with pytest.raises(DependencyDown):
        dependency()
    assert emptied.state(name) == "open"
    if wipe:
        emptied.wipe()


def refused_while(dependency, clock, seconds: float, step: float = 0.5) -> None:
    """Every call in the next *seconds* is refused."""
    for _ in range(int(seconds / step)):
        clock.advance(step)
        with pytest.raises(baldur.CircuitOpenError):
            dependency()


def test_st4_consult_past_the_open_time_keeps_the_open(emptied, fresh_registry, monkeypatch, clock):
    """ST-4: the interval's consult reads the empty store after the worker's open time is over:
    the open is written back, no call reaches the dependency."""
    name = "empty-consult"
    dependency = worker(fresh_registry, monkeypatch, emptied, name, sync=2)
    trip(dependency, emptied, name)
    clock.advance(RECOVERY + 0.5)  # consult due and open time over
    with pytest.raises(baldur.CircuitOpenError):
        dependency()
    assert emptied.state(name) == "open"
    refused_while(dependency, clock, RECOVERY - 1)
    assert dependency.calls == ["call"]


def test_st4_probe_request_to_an_empty_store_keeps_the_open(emptied, fresh_registry, monkeypatch, clock):
    """ST-4: no consult is due (events only); the worker's open time is over and it asks the
    empty store for a probe: the CLOSED answer is not adopted, the open is written back."""
    name = "empty-probe"
    dependency = worker(fresh_registry, monkeypatch, emptied, name, sync=0)
    trip(dependency, emptied, name)
    clock.advance(RECOVERY + 0.5)
    for _ in range(5):
        with pytest.raises(baldur.CircuitOpenError):
            dependency()
    assert emptied.state(name) == "open"
    assert dependency.calls == ["call"]


def test_st4_probe_request_in_half_open_to_an_empty_store(emptied, fresh_registry, monkeypatch, clock):
    """ST-4: the worker is HALF_OPEN with a trial in flight when the store empties; the next
    caller's probe request gets a CLOSED answer: not adopted, nothing else gets through."""
    name = "empty-half-open"
    dependency = worker(fresh_registry, monkeypatch, emptied, name, sync=0, max_calls=2)
    with pytest.raises(DependencyDown):
        dependency()
    clock.advance(RECOVERY + 0.5)
    emptied.age(name, RECOVERY + 0.5)
    inside: list[int] = []

    def others() -> None:
        for _ in range(5):
            try:
                dependency()
            except baldur.CircuitOpenError:
                inside.append(0)
            except DependencyDown:
                inside.append(1)

    def more_callers() -> None:  # run inside the trial: the store empties, other threads call
        emptied.wipe()
        thread = threading.Thread(target=others)  # not nested in the trial (CB-19)
        thread.start()
        thread.join(10)

    dependency.before.append(more_callers)
    with pytest.raises(DependencyDown):
        dependency()  # the trial
    assert inside == [0] * 5, "no call during the trial reached the dependency"
    assert dependency.calls == ["call", "call"]
    refused_while(dependency, clock, RECOVERY - 1)
    assert dependency.calls == ["call", "call"]


@pytest.mark.parametrize("outcome", ["failure", "success"])
def test_st4_trial_outcome_written_to_an_empty_store_keeps_the_open(
    emptied, fresh_registry, monkeypatch, clock, outcome
):
    """ST-4: the store empties while a trial runs; the trial's outcome is written to the empty
    store, whose CLOSED answer is not adopted (a failed trial re-opens; a lone success of a
    round of two decides nothing): the next callers are refused."""
    name = f"empty-trial-{outcome}"
    dependency = worker(fresh_registry, monkeypatch, emptied, name, sync=0, max_calls=2)
    trip(dependency, emptied, name, wipe=False)
    clock.advance(RECOVERY + 0.5)
    emptied.age(name, RECOVERY + 0.5)
    dependency.down[0] = outcome == "failure"
    dependency.before.append(emptied.wipe)
    if outcome == "failure":
        with pytest.raises(DependencyDown):
            dependency()  # the trial, admitted by the store
    else:
        assert dependency() == "ok"
    assert emptied.state(name) == "open"
    for _ in range(5):
        with pytest.raises(baldur.CircuitOpenError):
            dependency()
    assert dependency.calls == ["call", "call"]


def test_st4_explicit_sync_after_the_open_time_keeps_the_open(emptied, fresh_registry, monkeypatch, clock):
    """ST-4: ``sync()`` reads the empty store after the open time is over: the open stays."""
    name = "empty-sync"
    dependency = worker(fresh_registry, monkeypatch, emptied, name, sync=0)
    trip(dependency, emptied, name)
    clock.advance(RECOVERY + 0.5)
    dependency.breaker.sync()
    assert emptied.state(name) == "open"
    assert dependency.breaker.state is baldur.CircuitState.OPEN
    with pytest.raises(baldur.CircuitOpenError):
        dependency()
    assert dependency.calls == ["call"]


def test_st4_state_read_sweep_of_an_empty_store_keeps_the_open(emptied, fresh_registry, monkeypatch, clock):
    """ST-4: a ``refresh()`` after the open time sweeps the record (reading ``state`` does no
    store I/O); the empty store's CLOSED answer is not adopted: the state reads OPEN and the
    next call is refused."""
    name = "empty-sweep"
    dependency = worker(fresh_registry, monkeypatch, emptied, name, sync=0)
    trip(dependency, emptied, name)
    clock.advance(RECOVERY + 0.5)
    assert dependency.breaker.refresh() is baldur.CircuitState.OPEN
    assert dependency.breaker.state is baldur.CircuitState.OPEN
    assert emptied.state(name) == "open"
    with pytest.raises(baldur.CircuitOpenError):
        dependency()
    assert dependency.calls == ["call"]


def test_st4_store_back_empty_before_the_open_time_ends_with_no_consult_since_the_outage(
    fresh_registry, monkeypatch, clock
):
    """ST-4 (issue 27, rehearsal at a 30 s recovery): the worker trips, the store goes down
    and the worker's consult finds it down (it judges alone); the store comes back empty
    2.25 s before the open time ends, and no consult is due before it ends. The call made
    when the open time is over reaches the store, not the dependency: the open is written back."""
    from tests.stores.test_outage_reopen import SwitchedStore

    store = SwitchedStore(clock)
    dependency = worker(fresh_registry, monkeypatch, Emptied(store, store.wipe, lambda n: "?"), "empty-alone", sync=5)
    with pytest.raises(DependencyDown):
        dependency()  # the trip, written to the store
    store.down = True
    clock.advance(5.5)  # the consult is due: the store does not answer, the worker judges alone
    with pytest.raises(baldur.CircuitOpenError):
        dependency()
    clock.advance(RECOVERY - 2.25 - 5.5)
    store.wipe()  # back, empty, 2.25 s before the open time ends
    store.down = False
    clock.advance(2.25 + 0.1)  # the open time is over; the next consult is due 0.4 s later
    with pytest.raises(baldur.CircuitOpenError):
        dependency()
    assert dependency.calls == ["call"]
    assert store.inner.raw("empty-alone").state == "open"


def trip_alone_then_meet_an_empty_store(dependency, store, clock) -> None:
    """With *store* down: a failed call trips the worker alone and the next is refused; the
    store comes back empty 2.25 s before the open time ends; the call made once the open
    time is over is refused too (the dependency sees no call)."""
    with pytest.raises(DependencyDown):
        dependency()
    with pytest.raises(baldur.CircuitOpenError):
        dependency()
    clock.advance(RECOVERY - 2.25)
    store.wipe()  # back, empty, 2.25 s before the open time ends
    store.down = False
    clock.advance(2.25 + 0.1)  # the open time is over
    with pytest.raises(baldur.CircuitOpenError):
        dependency()


def test_st4_open_decided_while_the_store_was_down_is_written_back_to_the_empty_store(
    fresh_registry, monkeypatch, clock
):
    """ST-4 (found by the chaos test's invariant 9): the store is down from the worker's
    first call, so the worker has adopted no record when it trips alone; the store comes
    back empty before its open time ends. The call made when the open time is over asks the
    store for a probe and gets a fresh CLOSED record (version 0, like the worker's own count):
    it is not taken as CLOSED. The open is written back and the dependency sees no call."""
    store = SwitchedStore(clock)
    store.down = True
    dependency = worker(fresh_registry, monkeypatch, Emptied(store, store.wipe, lambda n: "?"), "down-first", sync=5)
    trip_alone_then_meet_an_empty_store(dependency, store, clock)  # first use: no answer
    assert dependency.calls == ["call"]
    assert store.inner.raw("down-first").state == "open"


def test_st4_open_decided_alone_after_adopting_an_empty_record_is_written_back(fresh_registry, monkeypatch, clock):
    """ST-4 (the chaos test's invariant 9, seed 1536549398): the worker's first call adopts the
    empty store's fresh CLOSED record (version 0); the store goes down and the worker trips
    alone; it comes back empty before the open time ends. The call made when the open time is
    over asks for a probe (no consult is due: the sync interval is longer than the open time)
    and gets version 0 again, the version the worker holds: a record never written is no
    close, so it is not taken as CLOSED; the open is written back."""
    store = SwitchedStore(clock)
    dependency = worker(fresh_registry, monkeypatch, Emptied(store, store.wipe, lambda n: "?"), "v0-first", sync=30)
    dependency.down[0] = False
    assert dependency() == "ok"  # first use: the empty store's version 0 adopted
    dependency.down[0] = True
    store.down = True
    trip_alone_then_meet_an_empty_store(dependency, store, clock)
    assert dependency.calls == ["call", "call"]
    assert store.inner.raw("v0-first").state == "open"
