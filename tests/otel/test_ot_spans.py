"""OT-3: span events on refusals, retries and transitions; one span per call on demand."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import baldur_django as baldur
from baldur_django.contrib import otel
from baldur_django.core import decorators

NO_BACKOFF = baldur.RetryPolicy(max_attempts=3, backoff_initial=0.0, backoff_max=0.0, jitter=0.0)


def events_of(telemetry, name: str = "request") -> list[tuple[str, dict]]:
    (span,) = [s for s in telemetry.exporter.get_finished_spans() if s.name == name]
    return [(event.name, dict(event.attributes)) for event in span.events]


def test_ot3_refusal_transition_and_retry_events_on_the_recording_span(telemetry, clock):
    """OT-3: a transition, a refusal (with retry_after, seconds) and a retry each add their
    event, with the attributes of section 0, to the span current at the time."""
    failures = {"left": 1}

    @baldur.protected(
        "ot3-events", failure_threshold=1, failure_rate_threshold=0, recovery_timeout=30, retry=NO_BACKOFF
    )
    def call(fail: str = "") -> int:
        if fail == "once" and failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("blip")
        if fail == "always":
            raise ConnectionError("down")
        return 1

    with telemetry.tracer.start_as_current_span("request"):
        assert call("once") == 1  # one retry, then a success
    retry = events_of(telemetry)
    assert retry == [("baldur.retry", {"baldur.service": "ot3-events", "baldur.attempt": 2, "baldur.delay": 0.0})]
    telemetry.exporter.clear()

    with telemetry.tracer.start_as_current_span("request"):
        with pytest.raises(ConnectionError):
            call("always")  # three attempts, one final failure: it trips the breaker
        with pytest.raises(baldur.CircuitOpenError):
            call()
    found = events_of(telemetry)
    names = [name for name, _ in found]
    assert names == ["baldur.retry", "baldur.retry", "baldur.state_change", "baldur.rejected"]
    assert found[1][1]["baldur.attempt"] == 3
    change = found[2][1]
    assert change["baldur.service"] == "ot3-events"
    assert (change["baldur.from_state"], change["baldur.to_state"]) == ("closed", "open")
    assert change["baldur.trigger"]
    rejected = found[3][1]
    assert rejected["baldur.service"] == "ot3-events"
    assert rejected["baldur.reason"] == "open"
    assert rejected["baldur.retry_after"] == pytest.approx(30.0)


def test_ot3_a_plain_success_adds_nothing(telemetry, clock):
    """OT-3: successes add no event to the span."""

    @baldur.protected("ot3-quiet", retry=NO_BACKOFF)
    def call() -> int:
        return 1

    with telemetry.tracer.start_as_current_span("request"):
        for _ in range(5):
            call()
    assert events_of(telemetry) == []


def test_ot3_nothing_without_a_recording_span(telemetry, clock):
    """OT-3: outside any span, or under a span that does not record, no event is added and
    the OPEN path builds no rejection event for this listener."""

    @baldur.circuit_breaker("ot3-nospan", failure_threshold=1, failure_rate_threshold=0)
    def call(fail: bool = False) -> int:
        if fail:
            raise ValueError("down")
        return 1

    with pytest.raises(ValueError):
        call(fail=True)
    assert otel.span_events.wants_rejections() is False
    with trace.use_span(trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)):
        assert otel.span_events.wants_rejections() is False
        with pytest.raises(baldur.CircuitOpenError):
            call()
    with telemetry.tracer.start_as_current_span("request"):
        assert otel.span_events.wants_rejections() is True
    assert telemetry.exporter.get_finished_spans()[0].events == ()


def test_ot3_a_cooldown_refusal_is_a_refusal(telemetry, clock):
    """OT-3: a 429 whose cooldown outlasts the allowed wait refuses the retry: the span gets
    the planned retry, then a rejection with reason cooldown and its seconds."""

    class RateLimitError(Exception):
        retry_after = 120  # seconds, as several SDKs carry it

    @baldur.protected("ot3-cooldown", failure_threshold=100, failure_rate_threshold=0, retry=NO_BACKOFF)
    def call() -> int:
        raise RateLimitError()

    with telemetry.tracer.start_as_current_span("request"), pytest.raises(baldur.RateLimitCooldownError):
        call()
    found = events_of(telemetry)
    assert [name for name, _ in found] == ["baldur.retry", "baldur.rejected"]
    assert found[1][1]["baldur.reason"] == "cooldown"
    assert found[1][1]["baldur.retry_after"] == pytest.approx(120.0)


def test_ot3_one_span_per_call_when_spans_are_on(telemetry, clock):
    """OT-3: with spans on, each call of a function decorated afterwards runs in an INTERNAL
    span "baldur <service>" (sync and async), child of the caller's span; the events of a
    refusal land on it."""
    otel.install(telemetry.meters, telemetry.tracers, spans=True)

    @baldur.protected("ot3-span", failure_threshold=1, failure_rate_threshold=0)
    def call(fail: bool = False) -> int:
        if fail:
            raise ValueError("down")
        return 1

    @baldur.aprotected("ot3-aspan")
    async def acall() -> int:
        return 2

    with telemetry.tracer.start_as_current_span("request"):
        assert call() == 1
        assert asyncio.run(acall()) == 2
        with pytest.raises(ValueError):
            call(fail=True)
    spans = telemetry.exporter.get_finished_spans()
    mine = [s for s in spans if s.name.startswith("baldur ")]
    assert [s.name for s in mine] == ["baldur ot3-span", "baldur ot3-aspan", "baldur ot3-span"]
    request = next(s for s in spans if s.name == "request")
    assert all(s.kind is SpanKind.INTERNAL for s in mine)
    assert all(s.parent.span_id == request.context.span_id for s in mine)
    assert mine[0].attributes["baldur.service"] == "ot3-span"
    assert [e.name for e in mine[2].events][:1] == ["baldur.state_change"]
    assert asyncio.iscoroutinefunction(acall)


def test_ot3_spans_off_leaves_the_wrapper_alone(telemetry):
    """OT-3: with spans off (the default) nothing wraps a protected function: no span."""
    assert decorators.wrap_calls is None

    @baldur.protected("ot3-nospans")
    def call() -> int:
        return 1

    call()
    assert telemetry.exporter.get_finished_spans() == ()


def test_ot3_spans_follow_the_setting(settings):
    """OT-3: BALDUR_OTEL_SPANS is read by install() (and so by the settings-reload hook)."""
    settings.BALDUR_OTEL_SPANS = True
    otel.install()
    try:
        assert decorators.wrap_calls is not None
        settings.BALDUR_OTEL_SPANS = False
        otel.install()
        assert decorators.wrap_calls is None
    finally:
        otel.uninstall()
