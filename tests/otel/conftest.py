"""Fixtures of the OpenTelemetry tests: SDK providers with in-memory readers, a tally
that starts empty, and contrib.otel installed on them for the test only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baldur_django.contrib import otel
from baldur_django.contrib.prometheus_readings import TALLY
from baldur_django.core import decorators


class Telemetry:
    """An SDK meter provider and tracer provider with in-memory reader and exporter."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.tracers.get_tracer("tests")

    def points(self) -> dict[str, list[tuple[dict[str, Any], float]]]:
        """``{instrument name: [(attributes, value), ...]}`` of one collection."""
        found: dict[str, list[tuple[dict[str, Any], float]]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    rows = found.setdefault(metric.name, [])
                    rows.extend((dict(point.attributes or {}), point.value) for point in metric.data.data_points)
        return found

    def value(self, name: str, **attributes: Any) -> float | None:
        for found, value in self.points().get(name, []):
            if found == attributes:
                return value
        return None


def dotted(**attributes: Any) -> dict[str, Any]:
    """``service="x"`` -> ``{"baldur.service": "x"}``."""
    return {f"baldur.{key}": value for key, value in attributes.items()}


@pytest.fixture(autouse=True)
def fresh_tally() -> Iterator[None]:
    TALLY.reset()
    yield
    TALLY.reset()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """contrib.otel installed on fresh SDK providers; uninstalled after the test."""
    made = Telemetry()
    otel.install(made.meters, made.tracers, spans=False)
    yield made
    otel.uninstall()
    decorators.wrap_calls = None
    made.meters.shutdown()
    made.tracers.shutdown()
