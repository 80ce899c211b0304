"""Decisions that now live in ``core/rules.py`` as pure functions: the 429 cascade's trip
(RL-3) and what a peer's propagated decision does (EM-6). The breaker applies their verdicts;
these tests pin the verdicts themselves, and that the breaker agrees with them."""

from __future__ import annotations

import itertools

import pytest

from baldur_django.core import rules
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import BreakerConfig
from baldur_django.core.events import EventBus
from baldur_django.core.stores.base import Record
from baldur_django.core.testing import FakeClock

CASCADE = dict(threshold=3, min_calls=10, min_ratio=20.0)


@pytest.mark.parametrize(
    ("state", "forced", "calls", "sightings", "expected"),
    [
        ("closed", None, 10, 3, 30.0),  # enough sightings, calls and share: trips
        ("closed", None, 10, 2, None),  # too few sightings
        ("closed", None, 9, 3, None),  # too few calls
        ("closed", None, 20, 3, None),  # 15 %: under the share
        ("closed", None, 15, 3, 20.0),  # exactly the share trips
        ("closed", "closed", 10, 5, None),  # a force refuses it
        ("open", None, 10, 5, None),  # only CLOSED trips
        ("half_open", None, 10, 5, None),
    ],
)
def test_rl3_cascade_rate_is_the_cascade_trip(state, forced, calls, sightings, expected):
    """RL-3: the cascade trips an unforced CLOSED breaker on enough sightings and calls and a
    large enough share; the verdict is that share in percent."""
    rate = rules.cascade_rate(state=state, forced=forced, calls=calls, sightings=sightings, **CASCADE)
    assert rate == expected


@pytest.mark.parametrize(
    ("state", "forced", "peer", "expected"),
    [
        ("closed", None, "open", rules.PEER_APPLIED),
        ("half_open", None, "open", rules.PEER_APPLIED),
        ("open", None, "open", rules.PEER_UNCHANGED),
        ("open", "open", "open", rules.PEER_UNCHANGED),
        ("closed", "closed", "open", rules.PEER_BLOCKED),
        ("closed", None, "closed", rules.PEER_UNCHANGED),
        ("closed", "closed", "closed", rules.PEER_UNCHANGED),
        ("open", None, "closed", rules.PEER_APPLIED),
        ("half_open", None, "closed", rules.PEER_APPLIED),
        ("open", "open", "closed", rules.PEER_LIFTED),
    ],
)
def test_em6_peer_verdict(state, forced, peer, expected):
    """EM-6: a peer's OPEN is refused by a forced closed breaker; a peer's CLOSED lifts a
    forced open; a breaker already in the peer's state is left alone."""
    assert rules.peer_verdict(state=state, forced=forced, peer=peer) == expected


@pytest.mark.parametrize(
    ("forced", "now", "frozen", "expected"),
    [
        (None, 10.0, True, "frozen"),  # Level 3 holds an automatic open past its time
        (None, 9.0, True, "open"),  # the open time still runs
        (None, 10.0, False, "open"),  # not frozen: a probe is due elsewhere, this is OPEN's refusal
        ("open", 10.0, True, "open"),  # a force holds it, whatever the level
    ],
)
def test_em2_open_refusal(forced, now, frozen, expected):
    """EM-2: an OPEN breaker refuses with ``frozen`` only while Level 3 holds an automatic open
    past its recovery timeout."""
    assert rules.open_refusal(forced=forced, now=now, until=10.0, frozen=frozen) == expected


@pytest.mark.parametrize(
    ("state", "forced", "frozen", "reopen", "expected"),
    [
        ("closed", None, False, False, rules.TRIPPED),
        ("closed", "closed", False, False, rules.BLOCKED),
        ("open", None, False, False, rules.ALREADY),
        ("closed", None, True, False, rules.ALREADY),
        ("half_open", None, False, True, rules.TRIPPED),  # a failed trial's re-open
        ("half_open", None, True, True, rules.ALREADY),  # held by Level 3
    ],
)
def test_em2_trip_verdict_holds_reopens_under_level_3_only(state, forced, frozen, reopen, expected):
    """EM-2, OP-2: a trip is refused by a force and held by Level 3; a failed trial's
    re-open only by Level 3."""
    assert rules.trip_verdict(state=state, forced=forced, frozen=frozen, reopen=reopen) == expected


def _breaker_in(state: str, forced: str | None, clock: FakeClock) -> CircuitBreaker:
    breaker = CircuitBreaker(
        "peer-rules",
        BreakerConfig(failure_threshold=1, minimum_calls=1, recovery_timeout=10),
        clock=clock,
        bus=EventBus(),
    )
    if forced is not None:
        (breaker.force_open if forced == "open" else breaker.force_close)(ttl_minutes=5)
    elif state != "closed":
        breaker.record_failure(breaker.acquire())
        if state == "half_open":
            clock.advance(10)
    assert (breaker.state.value, breaker.forced) == (state, forced)
    return breaker


@pytest.mark.parametrize(
    ("state", "forced", "peer"),
    [
        (state, forced, peer)
        for (state, forced), peer in itertools.product(
            [("closed", None), ("open", None), ("half_open", None), ("open", "open"), ("closed", "closed")],
            ["open", "closed"],
        )
    ],
)
def test_em6_the_breaker_applies_the_peer_verdict(state, forced, peer):
    """EM-6: ``apply_peer`` answers :func:`rules.peer_verdict`'s verdict and ends in the state
    it implies (a blocked or unchanged breaker keeps its state and force)."""
    breaker = _breaker_in(state, forced, FakeClock())
    expected = rules.peer_verdict(state=state, forced=forced, peer=peer)
    assert breaker.apply_peer(peer) == expected
    if expected in (rules.PEER_APPLIED, rules.PEER_LIFTED):
        assert (breaker.state.value, breaker.forced) == (peer, None)
    else:
        assert (breaker.state.value, breaker.forced) == (state, forced)


@pytest.mark.parametrize(
    ("state", "forced", "opened_at", "updated_at", "expected"),
    [
        ("open", None, 100.0, 150.0, 500.0),  # automatic: counted from its open
        ("open", None, 300.0, 300.0, None),  # open 300 s: not stuck yet
        ("open", "open", 100.0, 400.0, None),  # forced: counted from its last (re-)force
        ("open", "open", 100.0, 50.0, 500.0),
        ("open", None, None, 100.0, None),  # no open time known: never stuck
        ("closed", None, 100.0, 100.0, None),
        ("half_open", None, 100.0, 100.0, None),
    ],
)
def test_op_watchdog_stuck_open_rule(state, forced, opened_at, updated_at, expected):
    """The watchdog's rule: an OPEN record open for at least the stuck time (from its open, or
    a forced one from its last force) is stuck; the verdict is how long it has been open."""
    record = Record(state=state, forced=forced, opened_at=opened_at, updated_at=updated_at)
    assert rules.stuck_open_for(record, 600.0, 400.0) == expected
