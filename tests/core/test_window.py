"""The breaker's windows as plain data: the count window (CB-3) with slow-call counts (CB-17)
and the time window (CB-15), each checked by hand and against a naive model (Hypothesis)."""

from __future__ import annotations

import math
from collections import deque

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from baldur_django.core.window import CountWindow, TimeWindow

# ---------------------------------------------------------------- CountWindow


def test_cb3_count_window_keeps_the_last_size_outcomes():
    """CB-3: the count window holds the last `size` outcomes; the oldest leaves first."""
    w = CountWindow(3)
    for failed in (True, False, False):
        w.add(failed)
    assert (w.calls, w.failures) == (3, 1)
    w.add(False)  # evicts the failure
    assert (w.calls, w.failures) == (3, 0)


def test_cb3_clean_success_in_a_clean_window_touches_no_slot():
    """CB-3: while the window holds no failed or slow outcome, a clean success only grows
    `calls` (the fast path): the ring and its position stay as they were."""
    w = CountWindow(4)
    for _ in range(10):
        w.add(False)
    ring, pos = (w._fails, w._slows), w._pos
    w.add(False)
    assert ((w._fails, w._slows), w._pos, w.calls, w.marked) == (ring, pos, 4, 0)


def test_cb17_count_window_counts_slow_outcomes_and_evicts_them():
    """CB-17: slow outcomes (successes and failures) are counted, a slow failure in both
    counts, and each leaves the window with its slot."""
    w = CountWindow(3)
    w.add(False, slow=True)
    w.add(True, slow=True)
    w.add(True)
    assert (w.calls, w.failures, w.slow, w.marked) == (3, 2, 2, 3)
    w.add(False)  # evicts the slow success
    assert (w.failures, w.slow, w.marked) == (2, 1, 2)
    w.add(False)  # evicts the slow failure
    assert (w.failures, w.slow, w.marked) == (1, 0, 1)
    w.add(False)
    assert (w.calls, w.failures, w.slow, w.marked) == (3, 0, 0, 0)


def test_cb17_slow_rate_is_gated_by_minimum_calls_and_zero_disables_it():
    """CB-17: the slow-call rate trips at the threshold once minimum_calls outcomes are held; 0 is off."""
    w = CountWindow(10)
    for _ in range(4):
        w.add(False, slow=True)
    assert not w.slow_rate_reached(50.0, minimum_calls=5)  # only 4 outcomes
    w.add(False)
    assert w.slow_rate_reached(80.0, minimum_calls=5)  # 4 of 5 = 80 %
    assert not w.slow_rate_reached(80.1, minimum_calls=5)
    assert not w.slow_rate_reached(0.0, minimum_calls=1)
    assert not w.rate_reached(1.0, minimum_calls=1)  # slow successes are not failures


def test_cb7_count_window_clear_forgets_everything():
    """CB-7: clear() empties the window, flags included, so later successes find clean slots."""
    w = CountWindow(3)
    w.add(True, slow=True)
    w.add(False, slow=True)
    w.clear()
    assert (w.calls, w.failures, w.slow, w.marked) == (0, 0, 0, 0)
    for _ in range(3):
        w.add(False)
    assert (w.calls, w.failures, w.slow) == (3, 0, 0)


def test_cb15_count_window_takes_now_and_advance_like_the_time_window():
    """CB-15: both windows are driven alike; the count window ignores time."""
    w = CountWindow(2)
    w.add(True, False, 5.0)
    w.advance(1e9)
    assert (w.calls, w.failures) == (1, 1)


outcomes = st.tuples(st.booleans(), st.booleans())
count_ops = st.lists(st.one_of(outcomes, st.just("clear")), max_size=200)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 12), ops=count_ops)
def test_cb3_cb17_count_window_matches_a_deque_of_the_last_outcomes(size, ops):
    """CB-3, CB-17: after any sequence of outcomes and clears, the counts are those of the last
    `size` outcomes, and both rate answers agree with the model."""
    w = CountWindow(size)
    model: deque[tuple[bool, bool]] = deque(maxlen=size)
    for op in ops:
        if op == "clear":
            w.clear()
            model.clear()
        else:
            w.add(*op)
            model.append(op)
        calls = len(model)
        failures = sum(f for f, _ in model)
        slow = sum(s for _, s in model)
        assert (w.calls, w.failures, w.slow) == (calls, failures, slow)
        assert w.marked == sum(1 for f, s in model if f or s)
        for threshold, minimum in ((50.0, 1), (30.0, size), (100.0, 2)):
            expected = calls >= minimum and failures * 100.0 >= threshold * calls
            assert w.rate_reached(threshold, minimum) is expected
            expected_slow = calls >= minimum and slow * 100.0 >= threshold * calls
            assert w.slow_rate_reached(threshold, minimum) is expected_slow


@settings(max_examples=200, deadline=None)
@given(
    size=st.sampled_from([1, 2, 63, 64, 65, 100]),
    ops=st.lists(
        st.one_of(st.tuples(st.booleans(), st.booleans()), st.just("clear"), st.just("clean-run")), max_size=400
    ),
)
def test_cb3_cb17_bit_ring_matches_a_deque_reference_at_real_sizes(size, ops):
    """CB-3, CB-17: the compact window (two int bit rings and counters) answers exactly like a
    plain deque of the last `size` (failed, slow) outcomes, at the default size of 100 and
    around the 64-bit word edge; its rings never hold a bit outside the window and their
    population counts are the counters."""
    w = CountWindow(size)
    model: deque[tuple[bool, bool]] = deque(maxlen=size)
    for op in ops:
        if op == "clear":
            w.clear()
            model.clear()
            continue
        batch = [(False, False)] * size if op == "clean-run" else [op]
        for failed, slow in batch:
            w.add(failed, slow)
            model.append((failed, slow))
        assert w.calls == len(model)
        assert w.failures == sum(f for f, _ in model) == w._fails.bit_count()
        assert w.slow == sum(s for _, s in model) == w._slows.bit_count()
        assert w.marked == sum(1 for f, s in model if f or s) == (w._fails | w._slows).bit_count()
        assert (w._fails | w._slows) >> size == 0


def test_cb3_a_clean_window_of_100_holds_no_object_per_outcome():
    """CB-3: a full window of 100 clean successes is its counters and two zero ints: nothing
    is allocated per outcome (the memory goal of issue 21)."""
    import sys

    w = CountWindow(100)
    for _ in range(250):
        w.add(False)
    assert (w._fails, w._slows) == (0, 0)
    w.add(True)
    assert sys.getsizeof(w._fails) <= 40  # 100 bits in one int, not 100 slots


# ---------------------------------------------------------------- TimeWindow


@pytest.mark.parametrize("seconds", [0, -1, 1.5, 60.0, True, "60", None])
def test_cb15_time_window_span_is_a_whole_number_of_seconds(seconds):
    """CB-15: the span is an int >= 1; anything else is refused, naming the value."""
    with pytest.raises(ValueError) as info:
        TimeWindow(seconds)
    assert repr(seconds) in str(info.value)


def test_cb15_outcomes_of_one_second_share_a_bucket_and_count():
    """CB-15: calls, failures and slow outcomes of the same second all count."""
    w = TimeWindow(10)
    w.add(False, now=100.0)
    w.add(True, now=100.5)
    w.add(True, slow=True, now=100.999)
    assert (w.calls, w.failures, w.slow) == (3, 2, 1)
    assert w.rate_reached(66.0, minimum_calls=3)
    assert not w.rate_reached(67.0, minimum_calls=3)
    assert not w.rate_reached(10.0, minimum_calls=4)  # gated by minimum_calls over the window


def test_cb15_an_outcome_ages_out_with_its_whole_second():
    """CB-15: an outcome completed at 100.9 belongs to second 100; a 10 s window holds it until
    second 110 begins, then drops it (9.1 s later, with its whole second)."""
    w = TimeWindow(10)
    w.add(True, now=100.9)
    w.advance(109.999)
    assert (w.calls, w.failures) == (1, 1)
    w.advance(110.0)
    assert (w.calls, w.failures) == (0, 0)


def test_cb15_seconds_leave_one_by_one():
    """CB-15: each second's outcomes leave together, the newer ones stay."""
    w = TimeWindow(3)
    w.add(True, now=10.2)  # second 10
    w.add(False, now=11.5)  # second 11
    w.add(False, slow=True, now=12.1)  # second 12
    assert (w.calls, w.failures, w.slow) == (3, 1, 1)
    w.advance(13.0)  # second 10 leaves
    assert (w.calls, w.failures, w.slow) == (2, 0, 1)
    w.advance(14.7)  # second 11 leaves
    assert (w.calls, w.failures, w.slow) == (1, 0, 1)


def test_cb15_a_quiet_spell_longer_than_the_window_empties_it():
    """CB-15: after a pause of at least the window's span nothing old is counted."""
    w = TimeWindow(5)
    for i in range(50):
        w.add(i % 2 == 0, slow=True, now=200 + i / 10)
    w.add(False, now=205.0 + 1000)
    assert (w.calls, w.failures, w.slow) == (1, 0, 0)


def test_cb15_a_reused_bucket_starts_empty():
    """CB-15: second 20 reuses the bucket of second 10 in a 10 s window; its old outcomes are gone."""
    w = TimeWindow(10)
    for _ in range(5):
        w.add(True, slow=True, now=10.5)
    w.add(False, now=19.5)  # keeps the window moving: second 10 is still inside
    assert w.failures == 5
    w.add(False, now=20.0)  # same bucket as second 10
    assert (w.calls, w.failures, w.slow) == (2, 0, 0)
    assert (w._calls[0], w._failures[0], w._slow[0]) == (1, 0, 0)


def test_cb15_memory_is_one_bucket_per_second_whatever_the_traffic():
    """CB-15: 100 000 outcomes over 30 s in a 10 s window keep 10 buckets."""
    w = TimeWindow(10)
    for i in range(100_000):
        w.add(i % 7 == 0, now=1000 + i * 0.0003)
    assert len(w._calls) == len(w._failures) == len(w._slow) == 10
    assert w.calls == sum(w._calls)


def test_cb15_a_late_outcome_lands_in_its_own_second_or_is_dropped():
    """CB-15: an outcome reported with a clock reading behind the newest second (a thread that
    read the clock before another took the lock) counts in its own second while that second is
    in the window, and is dropped once it has left."""
    w = TimeWindow(3)
    w.add(False, now=50.2)
    w.add(True, now=49.9)  # second 49: still inside the window (seconds 48, 49 and 50)
    assert (w.calls, w.failures) == (2, 1)
    w.advance(52.0)  # window 50..52: second 49 leaves with its late failure
    assert (w.calls, w.failures) == (1, 0)
    w.add(True, now=49.99)  # second 49 has already left: dropped
    assert (w.calls, w.failures) == (1, 0)


def test_cb17_time_window_slow_rate():
    """CB-17: the slow-call rate over the window's seconds, gated by minimum_calls; 0 is off."""
    w = TimeWindow(60)
    for i in range(10):
        w.add(False, slow=i < 5, now=300 + i)
    assert w.slow_rate_reached(50.0, minimum_calls=10)
    assert not w.slow_rate_reached(50.0, minimum_calls=11)
    assert not w.slow_rate_reached(0.0, minimum_calls=1)


def test_cb7_time_window_clear_forgets_everything():
    """CB-7: clear() empties every bucket; later outcomes start from zero."""
    w = TimeWindow(5)
    w.add(True, slow=True, now=1.0)
    w.add(True, now=2.0)
    w.clear()
    assert (w.calls, w.failures, w.slow) == (0, 0, 0)
    w.add(False, now=3.0)
    w.advance(4.0)
    assert (w.calls, w.failures, w.slow) == (1, 0, 0)
    assert sum(w._failures) == sum(w._slow) == 0


def test_cb15_time_window_reads_seconds_of_a_negative_clock():
    """CB-15: the second of an outcome is floor(now), also for a monotonic clock below zero."""
    w = TimeWindow(2)
    w.add(True, now=-0.5)  # second -1
    w.advance(0.5)  # window -1..0
    assert w.failures == 1
    w.advance(1.0)  # window 0..1
    assert w.failures == 0


time_ops = st.lists(
    st.one_of(
        # ("add", step forward in seconds, failed, slow)
        st.tuples(st.just("add"), st.floats(0, 3, allow_nan=False), st.booleans(), st.booleans()),
        # ("late", how far behind the current time, failed, slow)
        st.tuples(st.just("late"), st.floats(0, 4, allow_nan=False), st.booleans(), st.booleans()),
        # ("read", step forward)
        st.tuples(st.just("read"), st.floats(0, 12, allow_nan=False)),
        st.just(("clear",)),
    ),
    max_size=150,
)


@settings(max_examples=300, deadline=None)
@given(seconds=st.integers(1, 8), start=st.floats(-50, 1e6, allow_nan=False), ops=time_ops)
def test_cb15_cb17_time_window_matches_a_list_of_timed_outcomes(seconds, start, ops):
    """CB-15, CB-17: after any sequence of outcomes (late ones included), pauses and clears, the
    counts equal those of a naive list of (time, failed, slow) filtered to the seconds
    floor(now) - seconds + 1 .. floor(now), and both rate answers agree with it."""
    w = TimeWindow(seconds)
    model: list[tuple[float, bool, bool]] = []
    now = start
    for op in ops:
        if op[0] == "add":
            now += op[1]
            w.add(op[2], op[3], now)
            model.append((now, op[2], op[3]))
        elif op[0] == "late":
            t = now - op[1]
            w.add(op[2], op[3], t)
            model.append((t, op[2], op[3]))
        elif op[0] == "read":
            now += op[1]
            w.advance(now)
        else:
            w.clear()
            model.clear()
        newest = math.floor(now)
        inside = [(f, s) for t, f, s in model if newest - seconds < math.floor(t) <= newest]
        calls, failures, slow = len(inside), sum(f for f, _ in inside), sum(s for _, s in inside)
        w.advance(now)
        assert (w.calls, w.failures, w.slow) == (calls, failures, slow), op
        for threshold, minimum in ((50.0, 1), (25.0, 4), (100.0, 2)):
            assert w.rate_reached(threshold, minimum) is (calls >= minimum and failures * 100.0 >= threshold * calls)
            assert w.slow_rate_reached(threshold, minimum) is (calls >= minimum and slow * 100.0 >= threshold * calls)
