"""RS-3: the fleet's Retry-After gate on the memory gate store (core/stages/fleet_gate.py):
one write per answer, never per call; other workers refuse once they have read the store;
a store that does not answer drops the write with one log line and the local gate works.
"""

from __future__ import annotations

import logging

import pytest
import requests

from baldur_django.core.errors import RateLimitCooldownError
from baldur_django.core.stages.fleet_gate import FleetGate, MemoryGateStore, gate_ends
from baldur_django.core.stages.gate import RetryAfterGate
from baldur_django.core.stores.base import StoreUnavailable
from baldur_django.core.testing import FakeClock

CAP = 3600.0


def answer(status: int, retry_after: str | None = None) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    if retry_after is not None:
        response.headers["Retry-After"] = retry_after
    return response


class CountingStore(MemoryGateStore):
    """The memory store, counting its writes and reads."""

    def __init__(self, now) -> None:
        super().__init__(now)
        self.writes: list[tuple[str, float]] = []
        self.reads = 0

    def close_gate(self, service, seconds):
        self.writes.append((service, seconds))
        return super().close_gate(service, seconds)

    def gates_left(self, services):
        self.reads += 1
        return super().gates_left(services)


class DownStore:
    """A gate store whose server never answers."""

    def __init__(self) -> None:
        self.down = True
        self.inner = MemoryGateStore()

    def close_gate(self, service, seconds):
        if self.down:
            raise StoreUnavailable("redis gate write failed: ConnectionError: refused")
        return self.inner.close_gate(service, seconds)

    def gates_left(self, services):
        raise StoreUnavailable("redis gate read failed: ConnectionError: refused")


@pytest.fixture
def fake():
    return FakeClock()


@pytest.fixture
def store(fake):
    # the store's clock is another host's: a different origin from the workers' monotonic clocks
    return CountingStore(now=lambda: fake.monotonic() + 5_000.0)


def worker(service: str, store, clock: FakeClock) -> FleetGate:
    return FleetGate(RetryAfterGate(service, clock, CAP), store)


def test_rs3_one_write_per_answer_never_per_call(store, fake):
    gate = worker("payments", store, fake)
    for _ in range(50):
        gate.check()
        gate.observe(answer(200))
    assert store.writes == []  # ordinary answers and open checks write nothing
    assert gate.observe(answer(429, "30")) == 30.0
    for _ in range(50):
        with pytest.raises(RateLimitCooldownError):
            gate.check()
    assert store.writes == [("payments", 30.0)]
    gate.observe(answer(503, "10"))  # a second such answer: its own write
    assert store.writes == [("payments", 30.0), ("payments", 10.0)]
    assert store.reads == 0


def test_rs3_another_worker_refuses_from_its_next_call_after_it_reads_the_store(store, fake):
    other_clock = FakeClock(start=77.0)  # another process: its own monotonic origin
    here, there = worker("payments", store, fake), worker("payments", store, other_clock)
    here.observe(answer(429, "30"))
    there.check()  # it has not learned of it yet
    ends = gate_ends(store, ["payments", "search"], other_clock)
    assert ends == {"payments": pytest.approx(77.0 + 30.0)}
    assert store.reads == 1
    there.close_until(ends["payments"])
    with pytest.raises(RateLimitCooldownError) as caught:
        there.check()
    assert caught.value.reason == "retry_after" and caught.value.retry_after == pytest.approx(30.0)
    assert len(store.writes) == 1  # learning writes nothing


def test_rs3_a_shorter_answer_elsewhere_never_shortens_the_fleets_gate(store, fake):
    here, there = worker("payments", store, fake), worker("payments", store, fake)
    here.observe(answer(429, "60"))
    fake.advance(10)
    there.observe(answer(429, "5"))  # its write answers the stored, later end
    assert there.remaining() == pytest.approx(50.0)
    assert gate_ends(store, ["payments"], fake) == {"payments": pytest.approx(fake.monotonic() + 50.0)}


def test_rs3_fleet_writes_are_capped_like_the_local_gate(store, fake):
    gate = FleetGate(RetryAfterGate("payments", fake, 100.0), store)
    gate.close_for(10_000)
    assert store.writes == [("payments", 100.0)]
    assert gate.remaining() == 100.0


def test_rs3_gate_ends_forgets_expired_gates_and_reads_nothing_for_no_names(store, fake):
    worker("a", store, fake).close_for(5)
    worker("b", store, fake).close_for(50)
    fake.advance(6)
    assert gate_ends(store, ["a", "b", "c"], fake) == {"b": pytest.approx(fake.monotonic() + 44)}
    assert gate_ends(store, [], fake) == {}


def test_rs3_the_fleet_gate_keeps_the_precedence_rules(store, fake):
    gate = worker("payments", store, fake)
    gate.close_for(30)
    gate.check(forced_closed=True)
    with pytest.raises(RateLimitCooldownError):
        gate.check()


def test_rs3_an_unreachable_store_drops_the_write_with_one_log_line(fake, caplog):
    store = DownStore()
    gate = worker("payments", store, fake)
    with caplog.at_level(logging.WARNING, logger="baldur.circuit_breaker"):
        assert gate.observe(answer(429, "30")) == 30.0
        assert gate.observe(answer(429, "40")) == 40.0
    lines = [r for r in caplog.records if r.name == "baldur.circuit_breaker"]
    assert len(lines) == 1
    assert lines[0].getMessage().startswith("circuit_breaker.store_unavailable service=payments")
    assert "retry_after_gate_write_dropped" in lines[0].getMessage()
    assert lines[0].event == "circuit_breaker.store_unavailable" and lines[0].service == "payments"
    with pytest.raises(RateLimitCooldownError):  # the local gate works all the same
        gate.check()
    assert gate.remaining() == 40.0
    # the store answers again: the next write lands; the next outage logs once more
    store.down = False
    assert gate.publish(1.0) is True
    store.down = True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="baldur.circuit_breaker"):
        assert gate.publish(1.0) is False
        assert gate.publish(1.0) is False
    assert len([r for r in caplog.records if r.name == "baldur.circuit_breaker"]) == 1


def test_rs3_gate_ends_raises_store_unavailable_for_the_caller_to_judge(fake):
    with pytest.raises(StoreUnavailable):
        gate_ends(DownStore(), ["payments"], fake)


def test_rs3_each_write_the_store_took_is_announced_for_propagation(store, fake):
    heard: list[tuple[str, float]] = []
    gate = FleetGate(RetryAfterGate("payments", fake, CAP), store, announce=lambda s, left: heard.append((s, left)))
    gate.check()
    gate.observe(answer(200))
    assert heard == []
    gate.observe(answer(429, "30"))
    fake.advance(10)
    gate.observe(answer(429, "5"))  # announced with the stored, later end
    assert heard == [("payments", 30.0), ("payments", pytest.approx(20.0))]
    dropped = FleetGate(
        RetryAfterGate("payments", fake, CAP), DownStore(), announce=lambda s, left: heard.append((s, left))
    )
    dropped.observe(answer(429, "30"))
    assert len(heard) == 2  # a dropped write is not announced
