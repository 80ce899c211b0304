"""What a breaker holds at rest (issue 21, memory per breaker): its fields are slots, equal
configurations are one shared immutable object, and what most breakers never use (the
delivery lock, the transitions table) is made on first use. The bytes themselves are a
benchmark figure (``./dev bench --memory``); these tests pin the behaviour the savings
must not change."""

from __future__ import annotations

import sys
import threading
import weakref

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker, core_of, shared_config
from baldur_django.core.config import BreakerConfig, build_config
from baldur_django.core.events import EventBus
from baldur_django.core.registry import registry
from baldur_django.core.testing import FakeClock, RecordingListener


def ok() -> int:
    return 1


def test_a_breakers_fields_are_slots_and_no_instance_dict_is_made():
    """Every field __init__ sets is a slot: a fresh, used breaker has an empty instance
    dict (a field missing from ``__slots__`` would bring the 1.6 KB dict back)."""
    func = baldur.circuit_breaker("mem.slots")(ok)
    assert func() == 1
    breaker = registry.get("mem.slots")
    breaker.force_open(ttl_minutes=1)
    breaker.release()
    assert breaker.snapshot()["state"] == "half_open"
    assert breaker.__dict__ == {}


def test_a_breaker_still_takes_ad_hoc_attributes_and_weak_references():
    """Tests and tools set attributes on breakers (a spy, a marker) and the Prometheus
    collector holds them weakly: both keep working with the slots."""
    breaker = registry.get("mem.adhoc")
    core = core_of(breaker)  # the spy goes on the part that admits
    calls: list[str] = []
    real = core.acquire_slow

    def spy(**kwargs: object):
        calls.append("slow")
        return real(**kwargs)

    core.acquire_slow = spy  # type: ignore[method-assign]
    breaker.force_open(ttl_minutes=1)
    with pytest.raises(baldur.CircuitOpenError):
        breaker.acquire()
    assert calls == ["slow"]
    ref = weakref.ref(breaker)
    assert ref() is breaker


def test_breakers_with_the_same_configuration_hold_one_config_object():
    """Equal effective configurations are one object; a different override, or the same
    override given for one breaker only, is a configuration of its own."""
    a, b = registry.get("mem.a"), registry.get("mem.b")
    assert a.config is b.config
    c = registry.get("mem.c", {"failure_threshold": 3})
    d = registry.get("mem.d", {"failure_threshold": 3})
    assert c.config is d.config
    assert c.config is not a.config
    assert c.config.failure_threshold == 3 and a.config.failure_threshold == 5
    e = registry.get("mem.e", {"failure_threshold": 5})  # the default's value, given explicitly
    assert e.config is not a.config
    assert dict(e.config.overrides) == {"failure_threshold": 5}


def test_a_reconfigured_breaker_leaves_the_others_configuration_alone():
    """CFG-2 swaps one breaker's configuration object; the breakers it shared the old one
    with keep it, unchanged, and judge by it."""
    a, b = registry.get("mem.r1"), registry.get("mem.r2")
    shared = a.config
    a.reconfigure(build_config("mem.r1", {"failure_threshold": 2}))
    assert a.config.failure_threshold == 2
    assert b.config is shared and b.config.failure_threshold == 5
    for breaker in (a, b):
        for _ in range(2):
            breaker.record_failure(breaker.acquire())
    assert a.state.value == "open"
    assert b.state.value == "closed"


def test_a_configuration_with_a_predicate_is_never_shared():
    """CB-18: the classifier's log throttle of a predicate's errors is its breaker's own,
    so such a configuration stays per breaker."""

    def is_outage(exc: BaseException) -> bool:
        return True

    for key, value in (
        ("failure_predicate", is_outage),
        ("result_predicate", lambda value: False),
        ("ignore_exceptions", (KeyError, is_outage)),
    ):
        a = registry.get(f"mem.p1.{key}", {key: value})
        b = registry.get(f"mem.p2.{key}", {key: value})
        assert a.config is not b.config
        assert a.config.classifier is not b.config.classifier
    # exception types alone judge nothing with a throttle: shared
    a = registry.get("mem.t1", {"ignore_exceptions": (KeyError,)})
    b = registry.get("mem.t2", {"ignore_exceptions": (KeyError,)})
    assert a.config is b.config


def test_configurations_of_different_clocks_or_value_types_are_not_shared():
    """The clock is compared by identity (it is no field of the comparison), and a value
    is shared only with one of the same type (60 and 60.0 stay apart)."""
    one, two = FakeClock(), FakeClock()
    a = CircuitBreaker("mem.k1", build_config("mem.k1", {}, clock=one), clock=one)
    b = CircuitBreaker("mem.k2", build_config("mem.k2", {}, clock=two), clock=two)
    c = CircuitBreaker("mem.k3", build_config("mem.k3", {}, clock=one), clock=one)
    assert a.config is not b.config
    assert a.config is c.config
    as_int = shared_config(BreakerConfig(recovery_timeout=60))
    as_float = shared_config(BreakerConfig(recovery_timeout=60.0))
    assert as_int is not as_float
    assert type(as_int.recovery_timeout) is int and type(as_float.recovery_timeout) is float
    assert shared_config(BreakerConfig(recovery_timeout=60.0)) is as_float


def test_the_shared_table_holds_configurations_weakly():
    """A configuration no breaker holds any more is not kept alive by the sharing."""
    config = shared_config(build_config("mem.w", {"failure_threshold": 7, "minimum_calls": 3}))
    ref = weakref.ref(config)
    del config
    assert ref() is None


def test_threads_delivering_a_breakers_first_events_share_one_delivery_lock():
    """CB-14 with the delivery lock made on first use: threads racing to deliver a fresh
    breaker's first events each deliver their own event exactly once, and the breaker
    ends up with one lock."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for round_ in range(30):
            bus = EventBus()
            listener = RecordingListener(bus)
            name = f"mem.drain.{round_}"
            breaker = CircuitBreaker(name, build_config(name, {}), bus=bus)
            barrier = threading.Barrier(4)

            def force(reason: str, breaker: CircuitBreaker = breaker, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                breaker.force_close(ttl_minutes=1, reason=reason)

            threads = [threading.Thread(target=force, args=(f"t{i}",)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sorted(e.reason for e in listener.events) == ["t0", "t1", "t2", "t3"]
    finally:
        sys.setswitchinterval(old)
