"""EM-7: the test project serves the metrics at ``/metrics``."""

from __future__ import annotations

from django.apps import apps
from prometheus_client.parser import text_string_to_metric_families

from baldur_django.contrib import prometheus


def test_em7_the_test_project_serves_metrics(shop, client):
    """EM-7: ``/metrics`` of the test project answers the exposition with baldur's series,
    the shop's ``payments`` breaker among them."""
    import baldur_django as baldur

    baldur.get_breaker(shop.SERVICE)  # the breaker the shop's BreakerAdapter("payments") calls through
    response = client.get("/metrics")
    assert response.status_code == 200
    families = {family.name: family for family in text_string_to_metric_families(response.content.decode())}
    states = {s.labels["service"]: s.value for s in families["baldur_circuit_breaker_state"].samples}
    assert states["payments"] == 0
    assert "baldur_emergency_level" in families


def test_em7_the_shop_app_installs_the_metrics_when_it_starts(shop_app, monkeypatch):
    """EM-7: the shop's ``AppConfig.ready()`` calls ``prometheus.install()``, so every
    process of the test project writes its counts from its start."""
    installed = []
    monkeypatch.setattr(prometheus, "install", lambda registry=None: installed.append(registry))
    apps.get_app_config("shop").ready()  # idempotent: receivers connect by dispatch_uid
    assert installed == [None]
