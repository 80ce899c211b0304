"""OT-5: the Grafana dashboard and the Prometheus alerting rules in the docs name only
series the package exports, and cover what the on-call engineer needs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from baldur_django.contrib.prometheus_readings import COUNTERS, HELP, LABELS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "baldur-dashboard.json"
ALERTS = ROOT / "docs" / "prometheus" / "baldur-alerts.yml"
#: What a scrape shows: counters with their _total suffix.
EXPORTED = {f"{name}_total" if name in COUNTERS else name for name in HELP}
KNOWN_LABELS = {label for labels in LABELS.values() for label in labels} | {"pid", "instance", "job"}
METRIC = re.compile(r"\bbaldur_[a-z_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"")


def exprs(node: Any) -> Iterator[str]:
    """Every PromQL expression of a dashboard (targets, variable queries)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and (key in ("expr", "definition") or (key == "query" and "baldur_" in value)):
                yield value
            else:
                yield from exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from exprs(item)


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def check_names(expressions: list[str]) -> set[str]:
    named = set()
    for expr in expressions:
        named |= set(METRIC.findall(expr))
        for grouped in GROUPING.findall(expr):
            labels = {label.strip() for label in grouped.split(",") if label.strip()}
            assert labels <= KNOWN_LABELS, (expr, labels - KNOWN_LABELS)
        assert set(MATCHER.findall(expr)) <= KNOWN_LABELS, expr
    assert named <= EXPORTED, named - EXPORTED
    return named


def test_ot5_dashboard_names_only_exported_series_and_has_every_panel():
    """OT-5: the dashboard parses as JSON, every series and label it queries is exported,
    and it has the panels the on-call engineer needs."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    named = check_names(list(exprs(dashboard)))
    assert named == EXPORTED  # every exported series is on it
    titles = {panel["title"] for panel in dashboard["panels"]}
    for wanted in ("State per service", "Calls by outcome", "Rejections by reason", "Transitions", "Emergency level"):
        assert wanted in titles
    for panel in dashboard["panels"]:
        assert panel["description"], panel["title"]
        assert panel["targets"], panel["title"]


def test_ot5_alert_rules_name_only_exported_series():
    """OT-5: the rules parse as YAML, name only exported series and labels, and alert on a
    breaker not closed for 5 minutes, Level 2 or more, and a burst of rejections, each
    with a summary and a runbook link to a section of the observability page."""
    found = rules()
    check_names([rule["expr"] for rule in found])
    by_name = {rule["alert"]: rule for rule in found}
    assert by_name["BaldurBreakerOpen"]["for"] == "5m"
    assert "baldur_circuit_breaker_state" in by_name["BaldurBreakerOpen"]["expr"]
    assert ">= 2" in by_name["BaldurEmergencyLevel"]["expr"]
    assert "baldur_circuit_breaker_blocked_requests_total" in by_name["BaldurRejectionBurst"]["expr"]
    page = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    for name, rule in by_name.items():
        assert rule["annotations"]["summary"], name
        assert rule["annotations"]["runbook"].endswith("#" + name.lower())
        assert f"### {name}" in page, name
