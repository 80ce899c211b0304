"""RL-3 cascade trigger, RL-4 its log lines, RL-5/FAC-2 cascade per attempt under retry."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

import baldur_django as baldur

from .helpers import cascade_totals
from .upstream import too_many

LOGGER = "baldur.circuit_breaker"
STORM = ("200*5", too_many("0"))  # five successes then a 429, cycled: 1 sighting in 6 calls
NO_BACKOFF = baldur.RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)


def _storm(upstream, session, clock, service="payments", calls=80, step=0.5, **options):
    """Call through ``protected`` up to *calls* times, *step* fake seconds apart, until the
    breaker opens. Returns ``(call_number_that_opened or None, states_before)``."""
    upstream.script(*STORM, cycle=True)

    @baldur.protected(service, **options)
    def charge():
        return session.get(upstream.endpoint(), timeout=5)

    breaker = baldur.get_breaker(service)
    for n in range(1, calls + 1):
        assert breaker.state is baldur.CircuitState.CLOSED
        response = charge()
        assert response.status_code in (200, 429)  # a returned 429 is never raised
        clock.advance(step)
        if breaker.state is baldur.CircuitState.OPEN:
            return n
    return None


def _records(caplog):
    return [r for r in caplog.records if r.name == LOGGER]


# ---------------------------------------------------------------------------- RL-3
def test_rl3_storm_below_failure_rate_opens_via_cascade(upstream, session, clock, events):
    """RL-3: 429s at every sixth call (never 5 in a row, 17 % < 50 %) open the breaker at the
    10th sighting through the cascade only; the consecutive and rate triggers never fire."""
    opened_at = _storm(upstream, session, clock)
    assert opened_at == 60  # 10 sightings, 60 calls, 30 fake seconds
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]
    snap = baldur.get_breaker("payments").snapshot()
    assert snap["state"] == "open" and snap["last_trigger"] == "rate_limit_cascade"
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (1, 60, 10)
    assert upstream.hits == 60
    # an ordinary automatic OPEN: rejected without contacting the server
    with pytest.raises(baldur.CircuitOpenError) as info:
        baldur.protect("payments", lambda: session.get(upstream.endpoint(), timeout=5))
    assert info.value.reason == "open"
    assert upstream.hits == 60


def test_rl3_open_then_recovers_like_any_automatic_open(upstream, session, clock, events):
    """RL-3: the cascade OPEN moves to HALF_OPEN after recovery_timeout and closes on
    successful probes, like an ordinary automatic OPEN."""
    assert _storm(upstream, session, clock, recovery_timeout=30) == 60
    clock.advance(30)
    upstream.script("200")
    breaker = baldur.get_breaker("payments")
    assert breaker.state is baldur.CircuitState.HALF_OPEN
    for _ in range(3):
        baldur.protect("payments", lambda: session.get(upstream.endpoint(), timeout=5))
    assert breaker.state is baldur.CircuitState.CLOSED
    assert [t[1:] for t in events.transitions()] == [
        ("open", "rate_limit_cascade"),
        ("half_open", "recovery_timeout"),
        ("closed", "half_open_success"),
    ]


def test_rl3_min_calls_gate_boundary(upstream, session, clock):
    """RL-3: 10 sightings among 19 calls stay CLOSED; the 429 that is call 20 opens."""
    upstream.script("429*10", "200*9", "429")
    call = baldur.protected("svc", failure_threshold=100, failure_rate_threshold=0)(
        lambda: session.get(upstream.endpoint(), timeout=5)
    )
    breaker = baldur.get_breaker("svc")
    for n in range(1, 21):
        call()
        clock.advance(0.1)
        assert (breaker.state is baldur.CircuitState.OPEN) is (n == 20), n


@pytest.mark.parametrize("successes, opens", [(90, True), (91, False)])
def test_rl3_min_ratio_boundary(successes, opens, upstream, session, clock):
    """RL-3: sightings must be at least 10 % of the window's calls: 10 of 100 opens, 10 of
    101 (9.9 %) does not."""
    upstream.script(f"200*{successes}", "429")
    call = baldur.protected("svc", failure_threshold=100, failure_rate_threshold=0)(
        lambda: session.get(upstream.endpoint(), timeout=5)
    )
    for _ in range(successes + 10):
        call()
        clock.advance(0.05)
    breaker = baldur.get_breaker("svc")
    assert (breaker.state is baldur.CircuitState.OPEN) is opens


@pytest.mark.parametrize("gap, opens", [(59.0, True), (61.0, False)])
def test_rl3_window_forgets_old_sightings(gap, opens, upstream, session, clock):
    """RL-3: only sightings within the last 60 s count: 9 sightings, then after *gap* seconds
    a 10th (with enough calls) opens at 59 s but not at 61 s."""
    upstream.script("429*9", "200*11", "200*20", "429")
    call = baldur.protected("svc", failure_threshold=100, failure_rate_threshold=0)(
        lambda: session.get(upstream.endpoint(), timeout=5)
    )
    for _ in range(20):  # t = 1000.0: 9 sightings among 20 calls
        call()
    assert baldur.get_breaker("svc").state is baldur.CircuitState.CLOSED
    clock.advance(gap)
    for _ in range(21):  # 20 successes and the 10th sighting
        call()
    assert (baldur.get_breaker("svc").state is baldur.CircuitState.OPEN) is opens


def test_rl3_window_is_exact_sixty_seconds(upstream, session, clock):
    """RL-3: a sighting 60.5 s old is outside the 60-s window and must not count."""
    upstream.script("429*9", "200*11", "200*20", "429")
    call = baldur.protected("svc", failure_threshold=100, failure_rate_threshold=0)(
        lambda: session.get(upstream.endpoint(), timeout=5)
    )
    for _ in range(20):
        call()
    clock.advance(60.5)
    for _ in range(21):
        call()
    assert baldur.get_breaker("svc").state is baldur.CircuitState.CLOSED


def test_rl3_not_while_forced_closed(upstream, session, clock, events, caplog):
    """RL-3, OP-2: forced closed, a storm of 14 sightings in 42 calls never opens the
    breaker and logs no storm; failures are still recorded. After release, the next
    sighting evaluates the cascade over the kept window (OP-3)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    baldur.force_close_circuit("payments", ttl_minutes=10)
    upstream.script("429,200,200", cycle=True)
    for _ in range(42):
        baldur.protect("payments", lambda: session.get(upstream.endpoint(), timeout=5))
        clock.advance(0.5)
    breaker = baldur.get_breaker("payments")
    assert breaker.state is baldur.CircuitState.CLOSED
    assert breaker.snapshot()["window_failures"] == 14
    assert not [
        r for r in _records(caplog) if r.event in ("circuit_breaker.rate_limit_storm", "circuit_breaker.opened")
    ]
    assert all(t[1] != "open" for t in events.transitions())
    assert baldur.release_circuit("payments") is True
    upstream.script("429")
    baldur.protect("payments", lambda: session.get(upstream.endpoint(), timeout=5))
    assert breaker.state is baldur.CircuitState.OPEN
    assert events.transitions()[-1] == ("closed", "open", "rate_limit_cascade")


def test_rl3_record_rate_limit_storm_not_while_forced_closed(clock):
    """RL-3, RL-9: reported sightings do not trip a forced-closed breaker either."""
    baldur.force_close_circuit("payments", ttl_minutes=5)
    for _ in range(30):
        baldur.record_rate_limit("payments")
    assert baldur.get_breaker("payments").state is baldur.CircuitState.CLOSED


def test_rl3_cascade_settings_move_the_thresholds(upstream, session, clock, env, events):
    """RL-3: with threshold 3, window 10 s, ratio 50 %, min calls 4, the 3rd sighting of
    '200,429,200,429,429' opens (3 of 5 = 60 %), which the defaults would never do."""
    env(
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=3,
        BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS=10,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO=50,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=4,
    )
    upstream.script("200,429,200,429,429")
    breaker = baldur.get_breaker("svc")
    for n in range(1, 6):
        baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5))
        assert (breaker.state is baldur.CircuitState.OPEN) is (n == 5), n
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]


def test_rl3_cascade_settings_ratio_blocks(upstream, session, clock, env):
    """RL-3: the same sequence with ratio 70 % stays CLOSED (3 of 5 = 60 %)."""
    env(
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=3,
        BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS=10,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO=70,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=4,
    )
    upstream.script("200,429,200,429,429")
    for _ in range(5):
        baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5))
    assert baldur.get_breaker("svc").state is baldur.CircuitState.CLOSED


def test_rl3_shorter_cascade_window(upstream, session, clock, env):
    """RL-3: with a 10-s window, sightings 11 s apart never add up."""
    env(
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=2,
        BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS=10,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=1,
    )
    upstream.script("429")
    call = baldur.protected("svc", failure_threshold=100, failure_rate_threshold=0)(
        lambda: session.get(upstream.endpoint(), timeout=5)
    )
    breaker = baldur.get_breaker("svc")
    for _ in range(4):
        call()
        clock.advance(11)
    assert breaker.state is baldur.CircuitState.CLOSED
    call()
    clock.advance(5)
    call()
    assert breaker.state is baldur.CircuitState.OPEN


# ---------------------------------------------------------------------------- RL-4
def test_rl4_cascade_logs_three_warnings(upstream, session, clock, caplog):
    """RL-4: a cascade open logs rate_limit_storm (count and rate), opened (trigger
    rate_limit_cascade) and auto_opened, all WARNING; at the default level WARNING the
    'opened' line is also the state-change line (no fourth line)."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert _storm(upstream, session, clock) == 60
    records = _records(caplog)
    assert [(r.levelno, r.event) for r in records] == [
        (logging.WARNING, "circuit_breaker.rate_limit_storm"),
        (logging.WARNING, "circuit_breaker.opened"),
        (logging.WARNING, "circuit_breaker.auto_opened"),
    ]
    storm, opened, auto = records
    assert storm.getMessage().startswith("circuit_breaker.rate_limit_storm")
    assert storm.count == 10
    assert storm.rate == pytest.approx(100 * 10 / 60)
    assert "count=10" in storm.getMessage() and "16.7%" in storm.getMessage()
    for record in (opened, auto):
        assert record.getMessage().startswith(record.event)
        assert record.trigger == "rate_limit_cascade"
        assert (record.service, record.from_state, record.to_state) == ("payments", "closed", "open")
    assert "rate_limit_cascade" in opened.getMessage()


@pytest.mark.parametrize("level", ["INFO", "ERROR"])
def test_rl4_state_change_line_at_configured_level(level, upstream, session, clock, caplog, env):
    """RL-4, CB-13: with BALDUR_EVENT_LOGGING_CB_LOG_LEVEL set to another level, the three
    warnings stay and one more 'opened' line appears at that level."""
    env(BALDUR_EVENT_LOGGING_CB_LOG_LEVEL=level)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert _storm(upstream, session, clock) == 60
    records = _records(caplog)
    warnings = [r.event for r in records if r.levelno == logging.WARNING]
    assert warnings == [
        "circuit_breaker.rate_limit_storm",
        "circuit_breaker.opened",
        "circuit_breaker.auto_opened",
    ]
    extra = [r for r in records if r.levelno == getattr(logging, level)]
    assert [(r.event, r.trigger) for r in extra] == [("circuit_breaker.opened", "rate_limit_cascade")]


def test_rl4_ordinary_open_logs_no_storm_lines(upstream, session, clock, caplog):
    """RL-4 (negative): a consecutive-failure open logs neither rate_limit_storm nor auto_opened."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    upstream.script("503")
    for _ in range(5):
        baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5))
    events = [r.event for r in _records(caplog)]
    assert events == ["circuit_breaker.opened"]
    assert _records(caplog)[0].trigger == "consecutive_failures"


# ---------------------------------------------------------------------- RL-5 FAC-2
def test_rl5_fac2_retried_storm_ends_as_successes_yet_opens(upstream, session, clock, events):
    """RL-5, FAC-2: every third call meets one 429 (Retry-After 1) that a retry overcomes.
    The breaker's counters see only final successes, while the cascade counts every attempt
    and opens at the 10th sighting (call 30, attempt 39); that call's retry is not made."""
    upstream.script("200", "200", too_many("1"), "200", cycle=True)

    @baldur.protected("payments", retry=NO_BACKOFF)
    def charge():
        return session.get(upstream.endpoint(), timeout=5)

    breaker = baldur.get_breaker("payments")
    for n in range(1, 30):
        assert charge().status_code == 200
        snap = breaker.snapshot()
        assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, n, 0)
        clock.advance(0.2)
    assert cascade_totals(breaker) == (38, 9)
    last = charge()  # the 10th sighting: the cascade opens, the retry stops
    assert last.status_code == 429
    assert breaker.state is baldur.CircuitState.OPEN
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (0, 29, 0)
    assert upstream.hits == 39
    assert clock.sleeps == [1.0] * 9


def test_rl5_async_retried_storm_opens_via_cascade(upstream, clock, events):
    """RL-5, FAC-2: the same retried storm through aprotect and httpx.AsyncClient."""
    upstream.script("200", "200", too_many("1"), "200", cycle=True)

    async def main():
        async with httpx.AsyncClient(timeout=5) as client:
            results = []
            for _ in range(30):
                results.append(
                    await baldur.aprotect("payments", lambda: client.get(upstream.endpoint()), retry=NO_BACKOFF)
                )
                clock.advance(0.2)
            return results

    results = asyncio.run(main())
    assert [r.status_code for r in results] == [200] * 29 + [429]
    snap = baldur.get_breaker("payments").snapshot()
    assert snap["state"] == "open" and snap["last_trigger"] == "rate_limit_cascade"
    assert (snap["consecutive_failures"], snap["window_failures"]) == (0, 0)
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]
    assert upstream.hits == 39


def test_fac2_exhausted_429s_are_one_failure(upstream, session, clock):
    """FAC-2, RL-5: three 429 attempts in one call are three sightings but one failure."""
    upstream.script(too_many("0"))
    result = baldur.protect("svc", lambda: session.get(upstream.endpoint(), timeout=5), retry=NO_BACKOFF)
    assert result.status_code == 429
    breaker = baldur.get_breaker("svc")
    snap = breaker.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["window_failures"]) == (1, 1, 1)
    assert cascade_totals(breaker) == (3, 3)
    assert upstream.hits == 3


def test_rl5_cascade_opens_from_attempts_of_few_calls(upstream, session, clock, env, events):
    """RL-5: the cascade counts attempts, not calls: 4 calls x 3 raised 429s (12 sightings,
    12 attempts, min calls lowered to 10) open the breaker although the breaker recorded
    only 3 failures (failure_threshold 5 never reached)."""
    env(BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=10)
    upstream.script(too_many("0"))

    def call():
        response = session.get(upstream.endpoint(), timeout=5)
        response.raise_for_status()
        return response

    outcomes = []
    for _ in range(4):
        try:
            baldur.protect("svc", call, retry=NO_BACKOFF)
            outcomes.append("ok")
        except baldur.CircuitOpenError:
            outcomes.append("rejected")
        except Exception as exc:  # noqa: BLE001 - the HTTPError of the last attempt
            outcomes.append(type(exc).__name__)
    assert outcomes == ["HTTPError", "HTTPError", "HTTPError", "HTTPError"]
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]
    # calls 1-3 each recorded one failure; call 4 tripped at its 1st attempt (10th sighting),
    # its outcome dropped as stale (CB-8)
    assert baldur.get_breaker("svc").snapshot()["consecutive_failures"] == 3
    assert upstream.hits == 10
