"""EM-4's auto-activation rule as a pure function: record, counts, settings and time in, decision out.

No backend, no clock, no settings source: the same inputs always give the same decision.
The I/O around the rule (the shared record's atomic change, logging, the event) is covered
by tests/stores/test_emergency_fleet.py.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from baldur_django.core.emergency import ActivationSettings, LevelState, decide
from baldur_django.core.emergency.activation import is_over

KNOBS = ActivationSettings(min_breakers=3, ratio=70.0, interval=10.0, minutes=30.0, stabilization=300.0)
T0 = 1_700_000_000.0


def test_em4_the_second_consecutive_check_over_the_threshold_declares_level_3():
    """EM-4: one check over the threshold waits; the next one declares level 3 for the configured minutes."""
    first = decide(LevelState(), registered=4, open_count=3, settings=KNOBS, now=T0)
    assert (first.streak, first.declared, first.level) == (1, False, 0)
    assert first.record == LevelState(check_at=T0, check_streak=1)
    second = decide(first.record, registered=4, open_count=3, settings=KNOBS, now=T0 + 10)
    assert (second.streak, second.declared, second.level, second.previous) == (2, True, 3, 0)
    record = second.record
    assert record is not None and record.level == 3 and record.source == "auto"
    assert record.expires_at == T0 + 10 + 30 * 60 and record.actor == "auto-activation"
    assert "3 of 4 breakers OPEN (75%)" in record.reason


def test_em4_thresholds_need_both_the_minimum_count_and_the_ratio():
    """EM-4: at least min_breakers registered and at least ratio percent of them OPEN."""
    assert is_over(3, 3, 3, 70.0) and is_over(10, 7, 3, 70.0)
    assert not is_over(2, 2, 3, 70.0)  # too few registered, though all are OPEN
    assert not is_over(10, 6, 3, 70.0)  # 60 % < 70 %
    assert not is_over(0, 0, 3, 70.0)
    under = decide(LevelState(check_at=T0, check_streak=1), 10, 6, KNOBS, T0 + 10)
    assert (under.streak, under.declared) == (0, False)


def test_em4_a_duplicate_check_writes_nothing_and_a_late_one_starts_a_new_streak():
    """EM-4: closer than 3/4 interval is a second scheduler's run; more than 2.5 intervals breaks the streak."""
    counted = LevelState(check_at=T0, check_streak=1)
    duplicate = decide(counted, 4, 4, KNOBS, T0 + 7.4)
    assert duplicate.record is None and duplicate.streak == 1 and not duplicate.declared
    late = decide(counted, 4, 4, KNOBS, T0 + 25.1)
    assert late.streak == 1 and not late.declared
    on_time = decide(counted, 4, 4, KNOBS, T0 + 25.0)
    assert on_time.declared


def test_em4_nothing_is_declared_while_stabilizing_or_over_a_level_3():
    """EM-4: no declaration within the stabilization period after a freeze ended, nor over a level 3."""
    ended = LevelState(level=2, expires_at=T0 + 900, freeze_ended_at=T0 - 100, check_at=T0 - 10, check_streak=1)
    held = decide(ended, 4, 4, KNOBS, T0)
    assert not held.declared and held.level == 2 and "stabilizing" in held.note
    assert held.record is not None and held.record.level == 2 and held.record.check_streak == 2
    settled = LevelState(level=2, expires_at=T0 + 900, freeze_ended_at=T0 - 100, check_at=T0 + 190, check_streak=1)
    after = decide(settled, 4, 4, KNOBS, T0 + 200)  # 300 s after the freeze ended: stabilized
    assert after.declared and after.level == 3 and after.previous == 2
    manual = LevelState(level=3, expires_at=T0 + 60, source="manual", check_at=T0 - 10, check_streak=1)
    kept = decide(manual, 4, 4, KNOBS, T0)
    assert not kept.declared and kept.record is not None and kept.record.source == "manual"
    assert kept.record.expires_at == T0 + 60


@given(
    level=st.sampled_from([0, 1, 2, 3]),
    lifetime=st.floats(min_value=-100, max_value=4000),
    streak=st.integers(min_value=0, max_value=5),
    since=st.one_of(st.none(), st.floats(min_value=-50, max_value=100)),
    registered=st.integers(min_value=0, max_value=20),
    open_share=st.floats(min_value=0, max_value=1),
)
def test_em4_the_rule_never_lowers_the_level_in_force(level, lifetime, streak, since, registered, open_share):
    """EM-4: whatever the record and counts, the level in force after a check is not lower than before."""
    current = LevelState(
        level=level,
        expires_at=T0 + lifetime if level else None,
        check_at=None if since is None else T0 - since,
        check_streak=streak,
    )
    open_count = round(registered * open_share)
    decision = decide(current, registered, open_count, KNOBS, T0)
    before = current.effective(T0)
    assert decision.level >= before
    if decision.record is not None:
        assert decision.record.effective(T0) == decision.level
        assert decision.record.level >= current.level
    assert decide(current, registered, open_count, KNOBS, T0) == decision  # pure: same in, same out
