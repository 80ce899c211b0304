"""Fixtures of the metrics tests (EM-7): a scrape helper and a tally that starts empty."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from baldur_django.contrib import prometheus
from baldur_django.core.events import bus
from baldur_django.services import audit_listener


@pytest.fixture(autouse=True)
def fresh_tally():
    """The module's per-process tally forgets the breakers of earlier tests (whose names
    may be reused by this one: their counts would be carried into its series)."""
    prometheus._tally.reset()
    yield
    prometheus._tally.reset()


@pytest.fixture
def no_audit():
    """Forces without a database: the audit listener is taken off the bus for the test."""
    subscribed = audit_listener in bus.listeners
    bus.unsubscribe(audit_listener)
    yield
    if subscribed:
        bus.subscribe(audit_listener)


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """``{(sample name, frozenset of labels): value}`` of an exposition."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


class Scraper:
    """A registry with baldur's collector installed; ``scrape()`` parses what it exposes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.collector = prometheus.install(self.registry)

    def scrape(self) -> dict[tuple[str, frozenset], float]:
        return parse(generate_latest(self.registry).decode())

    def value(self, name: str, **labels: str) -> float | None:
        return self.scrape().get((name, frozenset(labels.items())))


@pytest.fixture
def scraper() -> Scraper:
    return Scraper()
