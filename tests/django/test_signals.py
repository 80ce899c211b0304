"""Django signals bridged from breaker events (CB-14, section 0), driven by real breaker transitions."""

from __future__ import annotations

import logging
import sys
import threading

import pytest
from django.apps import apps
from django.core.signals import setting_changed
from django.test import override_settings

import baldur_django as baldur
from baldur_django import signals
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.events import bus

ALL = {
    "circuit_opened": signals.circuit_opened,
    "circuit_half_opened": signals.circuit_half_opened,
    "circuit_closed": signals.circuit_closed,
    "circuit_forced": signals.circuit_forced,
    "circuit_released": signals.circuit_released,
    "call_rejected": signals.call_rejected,
}


class Boom(Exception):
    pass


class Received:
    """Connects to every baldur signal and keeps (signal name, kwargs) in order."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        self._receivers = {}
        for name, signal in ALL.items():

            def receiver(sender, _name=name, **kwargs):
                with self._lock:
                    self.calls.append((_name, dict(kwargs, sender=sender)))

            self._receivers[name] = receiver
            signal.connect(receiver, weak=False)

    def close(self):
        for name, signal in ALL.items():
            signal.disconnect(self._receivers[name])

    def names(self):
        return [name for name, _ in self.calls]

    def of(self, name):
        return [kwargs for n, kwargs in self.calls if n == name]


@pytest.fixture
def received():
    recorder = Received()
    yield recorder
    recorder.close()


def failing(service, **overrides):
    @baldur.circuit_breaker(service, **overrides)
    def call():
        raise Boom("dependency down")

    return call


def trip(call, times):
    for _ in range(times):
        with pytest.raises((Boom, baldur.CircuitOpenError)):
            call()


def test_cb14_circuit_opened_on_consecutive_failures(clock, received):
    """CB-14: a consecutive-failure trip sends circuit_opened once with service, states and trigger."""
    call = failing("pay", failure_threshold=2)
    trip(call, 2)
    assert received.names() == ["circuit_opened"]
    kwargs = received.of("circuit_opened")[0]
    assert kwargs["sender"] is CircuitBreaker
    assert (kwargs["service"], kwargs["from_state"], kwargs["to_state"], kwargs["trigger"]) == (
        "pay",
        "closed",
        "open",
        "consecutive_failures",
    )
    assert kwargs["dry_run"] is False and kwargs["event"].kind == "state_changed"


def test_cb14_circuit_opened_on_failure_rate(clock, received):
    """CB-14: a failure-rate trip names the failure_rate trigger."""
    outcomes = iter([True, True, False, False])

    @baldur.circuit_breaker(
        "rate", failure_threshold=100, sliding_window_size=4, minimum_calls=4, failure_rate_threshold=50
    )
    def call():
        if next(outcomes):
            return "ok"
        raise Boom("no")

    call(), call()
    trip(call, 2)
    assert [(k["trigger"], k["to_state"]) for k in received.of("circuit_opened")] == [("failure_rate", "open")]


def test_cb14_half_open_then_closed_after_successful_trials(clock, received):
    """CB-14: the recovery timeout sends circuit_half_opened; enough good trials send circuit_closed."""
    healthy = threading.Event()

    @baldur.circuit_breaker("recover", failure_threshold=1, recovery_timeout=10, half_open_max_calls=2)
    def call():
        if not healthy.is_set():
            raise Boom("down")
        return "fine"

    trip(call, 1)
    clock.advance(9.9)
    assert call.breaker.state is baldur.CircuitState.OPEN
    assert received.of("circuit_half_opened") == []
    clock.advance(0.1)
    assert call.breaker.state is baldur.CircuitState.HALF_OPEN
    half = received.of("circuit_half_opened")
    assert [(k["service"], k["from_state"], k["to_state"], k["trigger"]) for k in half] == [
        ("recover", "open", "half_open", "recovery_timeout")
    ]
    healthy.set()
    assert call() == "fine"
    assert received.of("circuit_closed") == []
    assert call() == "fine"  # the returned value is untouched by the close and its signal
    closed = received.of("circuit_closed")
    assert [(k["from_state"], k["to_state"], k["trigger"]) for k in closed] == [
        ("half_open", "closed", "half_open_success")
    ]
    assert received.names() == ["circuit_opened", "circuit_half_opened", "circuit_closed"]


def test_cb14_failed_trial_reopens_with_half_open_failure(clock, received):
    """CB-14: a failed trial sends circuit_opened from half_open with trigger half_open_failure."""
    call = failing("relapse", failure_threshold=1, recovery_timeout=5)
    trip(call, 1)
    clock.advance(5)
    trip(call, 1)
    opened = received.of("circuit_opened")
    assert [(k["from_state"], k["trigger"]) for k in opened] == [
        ("closed", "consecutive_failures"),
        ("half_open", "half_open_failure"),
    ]


def test_cb14_call_rejected_open_and_half_open_full(clock, received):
    """CB-14: rejections send call_rejected with reason open or half_open_full and the breaker's state."""
    call = failing("reject", failure_threshold=1, recovery_timeout=5, half_open_max_calls=1)
    trip(call, 1)
    with pytest.raises(baldur.CircuitOpenError) as info:
        call()
    assert info.value.reason == "open"
    clock.advance(5)
    permit = call.breaker.acquire()  # takes the only trial slot
    assert permit.trial
    with pytest.raises(baldur.CircuitOpenError) as info:
        call()
    assert info.value.reason == "half_open_full"
    rejected = received.of("call_rejected")
    assert [(k["service"], k["reason"], k["state"], k["dry_run"]) for k in rejected] == [
        ("reject", "open", "open", False),
        ("reject", "half_open_full", "half_open", False),
    ]


def test_cb14_forced_released_and_lapsed(clock, received):
    """CB-14: forces send circuit_forced; a release and a lapse send circuit_released (trigger released / force_lapsed)."""
    baldur.force_open_circuit("ops", ttl_minutes=5, reason="maintenance", actor="alice")
    forced = received.of("circuit_forced")
    assert len(forced) == 1
    k = forced[0]
    assert (k["service"], k["from_state"], k["to_state"], k["trigger"], k["reason"], k["mode"], k["actor"]) == (
        "ops",
        "closed",
        "open",
        "forced",
        "maintenance",
        "open",
        "alice",
    )
    assert k["ttl_minutes"] == 5 and k["expires_at"] == pytest.approx(clock.wall() + 300)
    assert received.of("circuit_opened") == []  # a force is announced on circuit_forced only

    assert baldur.release_circuit("ops", actor="bob") is True
    released = received.of("circuit_released")
    assert [(k["from_state"], k["to_state"], k["trigger"], k["previous"], k["actor"]) for k in released] == [
        ("open", "half_open", "released", "open", "bob")
    ]
    assert baldur.release_circuit("ops") is False  # nothing forced: no signal
    assert len(received.of("circuit_released")) == 1

    baldur.force_close_circuit("ops", ttl_minutes=1, reason="known good")
    clock.advance(60)
    assert baldur.get_breaker("ops").forced is None
    lapsed = received.of("circuit_released")[1:]
    assert [(k["trigger"], k["previous"], k["to_state"]) for k in lapsed] == [("force_lapsed", "closed", "closed")]


def test_cb14_dry_run_rejection_is_signalled_as_dry_run(clock, received):
    """CB-14/OP-5: under dry-run the would-be rejection is signalled with dry_run=True and the call still runs."""
    with override_settings(BALDUR_DRY_RUN=True):
        call = failing("dry", failure_threshold=1)
        trip(call, 1)
        with pytest.raises(Boom):  # not rejected: the dependency is still called
            call()
    assert received.of("circuit_opened")[0]["dry_run"] is True
    assert [(k["reason"], k["dry_run"]) for k in received.of("call_rejected")] == [("open", True)]


def test_cb14_raising_receiver_is_logged_others_run_and_the_call_is_unchanged(clock, received, caplog):
    """CB-14: a receiver that raises is logged; other receivers run; the call's result or error is unchanged."""

    def bad_receiver(sender, **kwargs):
        raise RuntimeError("receiver bug")

    good = []
    for signal in ALL.values():
        signal.connect(bad_receiver, weak=False)
    try:

        def good_receiver(sender, **kwargs):
            good.append(kwargs["service"])

        signals.circuit_opened.connect(good_receiver, weak=False)
        signals.call_rejected.connect(good_receiver, weak=False)
        original = Boom("the real error")

        @baldur.protected("robust", failure_threshold=1, recovery_timeout=5, half_open_max_calls=1)
        def call(ok=False):
            if ok:
                return {"value": 42}
            raise original

        with caplog.at_level(logging.ERROR, logger="baldur.signals"):
            with pytest.raises(Boom) as info:
                call()  # trips: circuit_opened receivers run, one raises
            assert info.value is original
            with pytest.raises(baldur.CircuitOpenError):
                call()  # call_rejected: the rejection is still the CircuitOpenError
            clock.advance(5)
            assert call(ok=True) == {"value": 42}  # half-open then close, both with a raising receiver

        @baldur.protected("robust-fallback", failure_threshold=1, fallback=lambda: "fallback")
        def with_fallback():
            raise Boom("x")

        with caplog.at_level(logging.ERROR, logger="baldur.signals"):
            assert with_fallback() == "fallback"
            assert with_fallback() == "fallback"  # rejected, fallback value unchanged
    finally:
        for signal in ALL.values():
            signal.disconnect(bad_receiver)
        signals.circuit_opened.disconnect(good_receiver)
        signals.call_rejected.disconnect(good_receiver)
    # good_receiver was connected after bad_receiver and still ran for every event
    assert good == ["robust", "robust", "robust-fallback", "robust-fallback"]
    assert received.names().count("circuit_closed") == 1
    logged = [r for r in caplog.records if r.name == "baldur.signals"]
    assert len(logged) == 6  # robust: opened, rejected, half_opened, closed; robust-fallback: opened, rejected
    assert all(r.levelno == logging.ERROR and r.exc_info and "receiver bug" in str(r.exc_info[1]) for r in logged)
    assert "robust" in logged[0].getMessage() and "bad_receiver" in logged[0].getMessage()


def test_cb14_each_transition_signalled_once_under_threads(clock, received):
    """CB-14/CB-8: many threads failing at once open the breaker once and send circuit_opened exactly once."""
    call = failing("crowd", failure_threshold=5)
    threads_n = 32
    barrier = threading.Barrier(threads_n)
    errors, failed, rejected = [], [], []

    def worker():
        barrier.wait()
        try:
            call()
        except Boom:
            failed.append(1)
        except baldur.CircuitOpenError:
            rejected.append(1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(old)
    assert not errors
    assert call.breaker.state is baldur.CircuitState.OPEN
    assert len(received.of("circuit_opened")) == 1
    assert len(failed) >= 5 and len(failed) + len(rejected) == threads_n
    assert len(received.of("call_rejected")) == len(rejected)  # one signal per rejection, none lost or doubled


def test_cb14_bridge_subscribed_once_even_if_ready_runs_twice(clock, received):
    """CB-14: calling the app's ready() again neither doubles the bridge nor the setting_changed receiver."""
    from baldur_django import services
    from baldur_django.contrib import slack

    config = apps.get_app_config("baldur_django")
    config.ready()
    config.ready()
    assert bus.listeners.count(signals.bridge) == 1
    assert bus.listeners.count(services.audit_listener) == 1  # OP-6 wiring, also once
    assert bus.listeners.count(slack.get_notifier()) == 1  # OP-8 wiring, also once
    ours = [r for r in setting_changed.receivers if r[0][0] == "baldur_django.signals.setting_changed"]
    assert len(ours) == 1
    trip(failing("once", failure_threshold=1), 1)
    assert received.names() == ["circuit_opened"]
    plain = baldur.get_breaker("plain")
    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=2):  # the receiver still reloads after ready() again
        assert plain.config.failure_threshold == 2


def test_cb14_events_without_a_signal_are_ignored(received):
    """CB-14: bus events that have no Django signal (a 429 storm, a store problem) send nothing and never raise."""
    from baldur_django.core.events import RateLimitStorm, StoreProblem

    signals.bridge(RateLimitStorm("x", 0.0, count=10, calls=20, rate=50.0))
    signals.bridge(StoreProblem("x", 0.0, error="down"))
    assert received.calls == []
