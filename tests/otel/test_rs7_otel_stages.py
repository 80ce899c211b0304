"""RS-7, OT-2 (section 0's OpenTelemetry block): the stages' refusal reasons are in
``baldur.circuit_breaker.rejections``; ``baldur.bulkhead.in_flight`` and
``baldur.retry_budget.exhausted`` carry the figures of ``baldur_bulkhead_in_flight`` and
``baldur_retry_budget_exhausted_total``, read at collection."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from baldur_django.contrib import otel, prometheus
from baldur_django.core.registry import registry

from ..stages.refusing import refuse_each, staged

pytestmark = pytest.mark.usefixtures("clock")


def test_rs7_otel_instruments_carry_the_stage_figures(telemetry):
    """RS-7, OT-2: each stage reason, the budget's refused retries and the slots in flight,
    the same as the Prometheus export; a breaker without stages has no such points."""
    breaker, held = staged("rs7-otel")
    ticket = refuse_each(breaker, held)
    registry.get("rs7-otel-plain").record_success(registry.get("rs7-otel-plain").acquire())
    points = telemetry.points()
    service = {"baldur.service": "rs7-otel"}
    reasons = {a["baldur.reason"]: v for a, v in points[otel.REJECTIONS] if a["baldur.service"] == "rs7-otel"}
    assert reasons == {"bulkhead_full": 1, "throttled": 1, "deadline": 1, "retry_after": 1}
    assert points[otel.RETRY_BUDGET_EXHAUSTED] == [(service, 1)]
    assert points[otel.BULKHEAD_IN_FLIGHT] == [(service, 1)]
    target = CollectorRegistry()
    prometheus.install(target)
    scraped = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(target).decode())
        for sample in family.samples
    }
    assert scraped[("baldur_retry_budget_exhausted_total", frozenset({("service", "rs7-otel")}))] == 1
    assert scraped[("baldur_bulkhead_in_flight", frozenset({("service", "rs7-otel")}))] == 1
    held.bulkhead.leave(ticket)
    assert telemetry.points()[otel.BULKHEAD_IN_FLIGHT] == [(service, 0)]


def test_rs7_otel_instrument_names_are_section_zeros():
    """Section 0: the two new instruments' names."""
    assert otel.BULKHEAD_IN_FLIGHT == "baldur.bulkhead.in_flight"
    assert otel.RETRY_BUDGET_EXHAUSTED == "baldur.retry_budget.exhausted"
