"""OpenTelemetry reporting of the breakers: observable instruments and span events.

::

    from baldur_django.contrib import otel

    otel.install()        # or BALDUR_OTEL_ENABLED = True in the Django settings

Only ``opentelemetry-api`` is needed (``pip install 'baldur-django[otel]'``). Until the
application configures an SDK (a ``MeterProvider``, a ``TracerProvider``), the API's
providers are no-ops and so is everything here; once it does, the global providers pick
the instruments up.

**Instruments.** Observable, read when the metric reader collects, from the same tally
of the breakers' own counts as the Prometheus export
(:mod:`baldur_django.contrib.prometheus_readings`), so both report the same figures and
nothing is added to a protected call. Every one carries ``baldur.service`` except the
emergency level:

* ``baldur.circuit_breaker.state``: gauge, 1 for the breaker's state and 0 for the other
  two (``baldur.state``: ``closed``, ``open``, ``half_open``);
* ``baldur.circuit_breaker.calls``: counter ``{call}``, by ``baldur.outcome``
  (``success``, ``failure``, ``ignored``, ``rate_limited``);
* ``baldur.circuit_breaker.rejections``: counter ``{call}``, by ``baldur.reason``
  (``open``, ``half_open_full``, ``frozen``; the outbound stages' ``bulkhead_full``,
  ``throttled``, ``deadline``, ``retry_after``);
* ``baldur.circuit_breaker.transitions``: counter ``{transition}``, by
  ``baldur.from_state``, ``baldur.to_state`` and ``baldur.trigger``;
* ``baldur.emergency.level``: gauge, the Emergency Mode level in force (0..3);
* ``baldur.bulkhead.in_flight``: gauge ``{call}``, bulkhead slots a service's calls hold in
  this process (breakers with a bulkhead);
* ``baldur.retry_budget.exhausted``: counter ``{retry}``, retries a retry budget refused.

As with the Prometheus export, a counter series appears with its first count.

**Span events.** A listener on the event bus adds an event to the current span, only when
that span is recording (an SDK sampled it) and only off the success path:
``baldur.rejected`` (``baldur.service``, ``baldur.reason``, ``baldur.retry_after`` in
seconds when known), ``baldur.retry`` (``baldur.service``, ``baldur.attempt``: the
number of the attempt about to be made, ``baldur.delay``: seconds of backoff first) and
``baldur.state_change`` (``baldur.service``, ``baldur.from_state``, ``baldur.to_state``,
``baldur.trigger``).

**One span per call.** With ``BALDUR_OTEL_SPANS`` on when :func:`install` runs, every
function decorated afterwards with ``protected``, ``aprotected`` or ``circuit_breaker``
runs in an ``INTERNAL`` span named ``baldur <service>``. The choice is made when the
function is decorated: with the setting off nothing is added to its calls.

**Forking servers.** Each process reports its own breakers: a forked child starts its
counts from zero. Configure the SDK in each worker after the fork (gunicorn's
``post_fork`` hook), never in the master: see the observability guide.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import SpanKind
except ImportError as exc:  # exercised by tests/otel (opentelemetry hidden)
    raise ImportError(
        "baldur_django.contrib.otel needs opentelemetry-api; install it with pip install 'baldur-django[otel]'"
    ) from exc

from ..core import decorators
from ..core.config import settings as default_settings
from ..core.errors import ConfigError
from ..core.events import CallRejected, Event, Retrying, StateChanged, bus
from ..core.states import CircuitState
from .prometheus_readings import (
    BLOCKED,
    CALLS,
    COUNT_FAMILY,
    COUNT_LABELS,
    STATE_VALUES,
    ZEROS,
    View,
)
from .prometheus_readings import RETRY_BUDGET_EXHAUSTED as _EXHAUSTED_FAMILY
from .prometheus_readings import TALLY as _tally
from .prometheus_readings import WARNINGS as _warnings

__all__ = [
    "install",
    "uninstall",
    "configure",
    "configure_or_log",
    "installed",
    "span_events",
    "SCOPE",
    "STATE",
    "CALLS_COUNTER",
    "REJECTIONS",
    "TRANSITIONS",
    "EMERGENCY_LEVEL",
    "BULKHEAD_IN_FLIGHT",
    "RETRY_BUDGET_EXHAUSTED",
    "ENABLED_SETTING",
    "SPANS_SETTING",
]

_config_log = logging.getLogger("baldur.config")

#: The instrumentation scope of the meter and the tracer.
SCOPE = "baldur_django"
STATE = "baldur.circuit_breaker.state"
CALLS_COUNTER = "baldur.circuit_breaker.calls"
REJECTIONS = "baldur.circuit_breaker.rejections"
TRANSITIONS = "baldur.circuit_breaker.transitions"
EMERGENCY_LEVEL = "baldur.emergency.level"
BULKHEAD_IN_FLIGHT = "baldur.bulkhead.in_flight"
RETRY_BUDGET_EXHAUSTED = "baldur.retry_budget.exhausted"
ENABLED_SETTING = "BALDUR_OTEL_ENABLED"
SPANS_SETTING = "BALDUR_OTEL_SPANS"

#: The gauge value (0, 1, 2) of each state, as the readings give it, and its attribute value.
_STATE_NAMES = {value: state.value for state, value in STATE_VALUES.items()}
_ALL_STATES = tuple(state.value for state in (CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN))
#: Where the retries a budget refused sit in a series' totals.
_EXHAUSTED_AT = COUNT_FAMILY.index(_EXHAUSTED_FAMILY)
#: A reading taken by the state gauge's callback serves the other callbacks of the same
#: collection (they run right after it); an older one is read again.
_FRESH_SECONDS = 1.0


# ------------------------------------------------------------------- instruments
class _Readings:
    """The callbacks of the observable instruments, over one shared reading per collection."""

    def __init__(self) -> None:
        self.active = False
        self._lock = threading.Lock()
        self._view: View | None = None
        self._taken = float("-inf")

    def _read(self, fresh: bool) -> View | None:
        if not self.active:
            return None
        with self._lock:
            now = time.monotonic()
            if fresh or self._view is None or now - self._taken > _FRESH_SECONDS:
                try:
                    self._view = _tally.read()
                except Exception:  # pragma: no cover - read() catches its own errors
                    _warnings.warn("metrics.collect_failed: baldur's instruments are left out of this collection")
                    return None
                self._taken = now
            return self._view

    def state(self, options: CallbackOptions) -> Iterator[Observation]:
        view = self._read(fresh=True)
        if view is None:
            return
        for service, value in view.states:
            current = _STATE_NAMES.get(value, "closed")
            for name in _ALL_STATES:
                yield Observation(1 if name == current else 0, {"baldur.service": service, "baldur.state": name})

    def _counts(self, family: str, key: str) -> Iterator[Observation]:
        view = self._read(fresh=False)
        if view is None:
            return
        for service, entry in view.series.items():
            totals = entry.totals  # read once: the fold replaces it, never changes it
            if totals is ZEROS:
                continue
            for value, name, labels in zip(totals, COUNT_FAMILY, COUNT_LABELS, strict=True):
                if value and name == family:  # a series appears with its first count
                    yield Observation(value, {"baldur.service": service, key: labels[0]})

    def calls(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._counts(CALLS, "baldur.outcome")

    def rejections(self, options: CallbackOptions) -> Iterator[Observation]:
        return self._counts(BLOCKED, "baldur.reason")

    def exhausted(self, options: CallbackOptions) -> Iterator[Observation]:
        view = self._read(fresh=False)
        if view is None:
            return
        for service, entry in view.series.items():
            value = entry.totals[_EXHAUSTED_AT]  # read once: the fold replaces it, never changes it
            if value:
                yield Observation(value, {"baldur.service": service})

    def in_flight(self, options: CallbackOptions) -> Iterator[Observation]:
        view = self._read(fresh=False)
        if view is None:
            return
        for service, held in view.in_flight:
            yield Observation(held, {"baldur.service": service})

    def transitions(self, options: CallbackOptions) -> Iterator[Observation]:
        view = self._read(fresh=False)
        if view is None:
            return
        for service, entry in view.series.items():
            for (before, after, trigger), value in entry.transitions.items():
                attributes = {
                    "baldur.service": service,
                    "baldur.from_state": before,
                    "baldur.to_state": after,
                    "baldur.trigger": trigger,
                }
                yield Observation(value, attributes)

    def level(self, options: CallbackOptions) -> Iterator[Observation]:
        view = self._read(fresh=False)
        if view is not None:
            yield Observation(view.level)


_readings = _Readings()


def _create_instruments(meter: metrics.Meter) -> None:
    """The instruments of the module docstring on *meter*; the state gauge first, so its
    fresh reading serves the callbacks after it."""
    meter.create_observable_gauge(
        STATE, callbacks=[_readings.state], unit="1", description="Circuit breaker state: 1 for the current one."
    )
    meter.create_observable_counter(
        CALLS_COUNTER,
        callbacks=[_readings.calls],
        unit="{call}",
        description="Calls through a circuit breaker by final outcome.",
    )
    meter.create_observable_counter(
        REJECTIONS,
        callbacks=[_readings.rejections],
        unit="{call}",
        description="Calls a circuit breaker refused, by reason.",
    )
    meter.create_observable_counter(
        TRANSITIONS,
        callbacks=[_readings.transitions],
        unit="{transition}",
        description="State changes of a circuit breaker, by from_state, to_state and trigger.",
    )
    meter.create_observable_gauge(
        BULKHEAD_IN_FLIGHT,
        callbacks=[_readings.in_flight],
        unit="{call}",
        description="Bulkhead slots a service's calls hold in this process now.",
    )
    meter.create_observable_counter(
        RETRY_BUDGET_EXHAUSTED,
        callbacks=[_readings.exhausted],
        unit="{retry}",
        description="Retries a service's retry budget refused.",
    )
    meter.create_observable_gauge(
        EMERGENCY_LEVEL,
        callbacks=[_readings.level],
        unit="1",
        description="Emergency Mode level in force: 0 normal to 3 (every breaker frozen).",
    )


# ------------------------------------------------------------------- span events
def _recording() -> bool:
    """Whether the current span records: the event bus asks it before building a
    rejection event nobody would read (False without an SDK, at the cost of one lookup)."""
    return bool(trace.get_current_span().is_recording())


def _attributes(event: Event) -> tuple[str, dict[str, Any]] | None:
    """The span event name and attributes of *event*, or None for an event not reported."""
    if isinstance(event, CallRejected):
        if event.dry_run:
            return None  # the call went ahead: not a refusal
        attributes: dict[str, Any] = {"baldur.service": event.service, "baldur.reason": event.reason}
        if event.retry_after is not None:
            attributes["baldur.retry_after"] = float(event.retry_after)
        return "baldur.rejected", attributes
    if isinstance(event, Retrying):
        return "baldur.retry", {
            "baldur.service": event.service,
            "baldur.attempt": event.attempt,
            "baldur.delay": float(event.delay),
        }
    if isinstance(event, StateChanged):
        return "baldur.state_change", {
            "baldur.service": event.service,
            "baldur.from_state": event.from_state,
            "baldur.to_state": event.to_state,
            "baldur.trigger": event.trigger,
        }
    return None


def span_events(event: Event) -> None:
    """Event-bus listener: adds the span event of *event* (a refusal, a retry or a state
    change; see the module docstring) to the current span when it is recording. Other
    events, and every event while no span records, cost one context lookup."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    found = _attributes(event)
    if found is not None:
        name, attributes = found
        span.add_event(name, attributes)


span_events.wants_rejections = _recording  # type: ignore[attr-defined]  # read by EventBus.subscribe


# --------------------------------------------------------------- one span per call
class _Spans:
    """Wraps each protected function decorated while on in a span of its own."""

    def __init__(self) -> None:
        self.tracer: trace.Tracer | None = None

    def wrap(self, service: str, wrapper: Callable[..., Any]) -> Callable[..., Any]:
        tracer = self.tracer if self.tracer is not None else trace.get_tracer(SCOPE)
        name = f"baldur {service}"
        attributes = {"baldur.service": service}
        kind = SpanKind.INTERNAL
        if inspect.iscoroutinefunction(wrapper):

            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                with tracer.start_as_current_span(name, kind=kind, attributes=attributes):
                    return await wrapper(*args, **kwargs)

            return traced_async

        def traced(*args: Any, **kwargs: Any) -> Any:
            with tracer.start_as_current_span(name, kind=kind, attributes=attributes):
                return wrapper(*args, **kwargs)

        return traced


_spans = _Spans()


# ----------------------------------------------------------------------- install
_install_lock = threading.Lock()
_GLOBAL = object()  # the key of the global meter provider
_meters: list[object] = []  # the meter providers (or _GLOBAL) the instruments are on


def install(
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    spans: bool | None = None,
) -> None:
    """Report the breakers to OpenTelemetry (idempotent).

    Creates the observable instruments on *meter_provider*'s meter (once per provider),
    subscribes the span-event listener to the event bus (once), and, when per-call spans
    are on, wraps every function decorated from now on in a span (see the module
    docstring). Opens no connection and reads no breaker: the instruments are read when
    the SDK's metric reader collects.

    Args:
        meter_provider: an OpenTelemetry ``MeterProvider``; None means the global one
            (the API's proxy until the application sets an SDK provider, which then
            takes the instruments over).
        tracer_provider: the ``TracerProvider`` of the per-call spans; None means the
            global one. Span events go to the current span whatever its provider.
        spans (bool | None): one span per protected call; None reads
            ``BALDUR_OTEL_SPANS``.

    Raises:
        ConfigError: ``BALDUR_OTEL_SPANS`` has a bad value.
    """
    key: object = _GLOBAL if meter_provider is None else meter_provider
    with _install_lock:
        if not any(known is key for known in _meters):
            meter = metrics.get_meter(SCOPE) if meter_provider is None else meter_provider.get_meter(SCOPE)
            _create_instruments(meter)
            _meters.append(key)
        _readings.active = True
        bus.subscribe(span_events)
        on = bool(default_settings.get(SPANS_SETTING)) if spans is None else spans
        if on:
            _spans.tracer = None if tracer_provider is None else tracer_provider.get_tracer(SCOPE)
            decorators.wrap_calls = _spans.wrap
        elif decorators.wrap_calls == _spans.wrap:
            decorators.wrap_calls = None


def uninstall() -> None:
    """Stop reporting: the instruments observe nothing, the span-event listener leaves the
    bus and functions decorated from now on get no span of their own. Functions decorated
    before keep theirs. A later :func:`install` turns the same instruments on again."""
    with _install_lock:
        _readings.active = False
        bus.unsubscribe(span_events)
        if decorators.wrap_calls == _spans.wrap:
            decorators.wrap_calls = None


def installed() -> bool:
    """Whether the process reports to OpenTelemetry now (:func:`install` ran, no
    :func:`uninstall` since)."""
    return _readings.active


def configure() -> bool:
    """Follow ``BALDUR_OTEL_ENABLED`` (and ``BALDUR_OTEL_SPANS``): install on the global
    providers when it is on, uninstall when it is off. ``BaldurDjangoConfig.ready()``
    calls it at startup and after every settings reload.

    Returns:
        bool: whether the process reports to OpenTelemetry now.

    Raises:
        ConfigError: one of the two settings has a bad value.
    """
    if default_settings.get(ENABLED_SETTING):
        install()
        return True
    if installed():
        uninstall()
    return False


def configure_or_log() -> bool:
    """:func:`configure`, logging a configuration problem (ERROR, logger ``baldur.config``)
    instead of raising: for ``AppConfig.ready()`` and the settings-reload hook."""
    try:
        return configure()
    except ConfigError as exc:
        _config_log.error(
            "baldur_django OpenTelemetry reporting is off: %s. Run `manage.py check` for a hint.",
            exc,
            extra={"setting": ENABLED_SETTING},
        )
        return False
