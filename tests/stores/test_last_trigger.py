"""OP-2: a breaker that never tripped shows no last trigger, on a shared store too."""

from __future__ import annotations

import baldur_django as baldur
from baldur_django.core.stores.memory import MemoryStore


def test_op2_never_tripped_breaker_on_a_shared_store_has_no_last_trigger(fresh_registry, clock):
    """OP-2: the first consult adopts the store's fresh CLOSED record; baldur_status's LAST TRIGGER
    column (the snapshot's last_trigger) must stay empty, not read 'adopted'."""
    fresh_registry.set_store(MemoryStore(now=clock.wall))
    assert baldur.protect("never-tripped", lambda: "ok") == "ok"
    breaker = baldur.get_breaker("never-tripped")
    breaker.sync()
    assert breaker.snapshot()["last_trigger"] is None


def test_op2_a_trip_is_still_the_last_trigger_after_the_record_closes(fresh_registry, clock):
    """OP-2: after a real trip, adopting the shared record keeps the trip's own trigger."""
    fresh_registry.set_store(MemoryStore(now=clock.wall))
    breaker = fresh_registry.get("tripped", {"failure_threshold": 1})

    def fail() -> None:
        raise ConnectionError("down")

    try:
        baldur.protect("tripped", fail)
    except ConnectionError:
        pass
    breaker.sync()
    assert breaker.snapshot()["last_trigger"] == "consecutive_failures"
