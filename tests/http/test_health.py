"""HC-5: the health view and the django-health-check backend judge the instance by its breakers."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.apps import AppConfig
from django.contrib.auth.models import AnonymousUser, User
from django.core.checks import run_checks
from django.test import RequestFactory

import baldur_django as baldur
from baldur_django import emergency
from baldur_django.contrib import health

pytestmark = pytest.mark.django_db  # forces write their audit rows

factory = RequestFactory()


def call(user=None, method="get"):
    request = getattr(factory, method)("/health/ready/")
    request.user = user or AnonymousUser()
    response = health.health_view(request)
    return response.status_code, json.loads(response.content) if response.content else None


def staff():
    return User(username="ops", is_staff=True, is_active=True)


def trip(name: str) -> None:
    baldur.force_open_circuit(name, reason="test")


def test_hc5_no_critical_services_is_ok_and_anonymous_sees_no_details(settings):
    """HC-5: with no critical services and no emergency the status is ok (200); an anonymous
    caller sees only status and level; the response is never cached."""
    baldur.get_breaker("payments")
    request = factory.get("/health/ready/")
    request.user = AnonymousUser()
    response = health.health_view(request)
    assert response.status_code == 200
    assert json.loads(response.content) == {"status": "ok", "emergency_level": 0}
    assert "no-cache" in response["Cache-Control"]


def test_hc5_critical_open_is_down_503_and_staff_see_every_breaker(settings):
    """HC-5: a critical breaker OPEN answers 503 "down"; staff see every known breaker's state."""
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    baldur.get_breaker("search")
    trip("payments")
    assert call() == (503, {"status": "down", "emergency_level": 0})
    status, body = call(staff())
    assert status == 503
    assert body["breakers"] == {"payments": "open", "search": "closed"}
    assert body["critical"] == ["payments"]


def test_hc5_non_critical_open_or_critical_half_open_is_degraded_200(settings, clock):
    """HC-5: a non-critical breaker OPEN, or a critical one HALF_OPEN, reads "degraded" with 200."""
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    settings.BALDUR_SERVICES = {"payments": {"failure_threshold": 1}}
    trip("search")
    assert call() == (200, {"status": "degraded", "emergency_level": 0})
    baldur.release_circuit("search")
    assert call()[1]["status"] == "ok"
    payments = baldur.get_breaker("payments")
    payments.record_failure(payments.acquire())
    assert payments.state is baldur.CircuitState.OPEN
    assert call()[0] == 503
    clock.advance(payments.config.recovery_timeout + 1)
    assert payments.state is baldur.CircuitState.HALF_OPEN
    assert call() == (200, {"status": "degraded", "emergency_level": 0})


def test_hc5_emergency_levels(settings):
    """HC-5 (amended): every Emergency level is "degraded" with 200; Level 3 too (a freeze
    must not take every instance out of rotation)."""
    emergency.set_level(2, minutes=5)
    assert call() == (200, {"status": "degraded", "emergency_level": 2})
    emergency.set_level(3, minutes=5)
    assert call() == (200, {"status": "degraded", "emergency_level": 3})
    emergency.set_level(0)
    assert call() == (200, {"status": "ok", "emergency_level": 0})


def test_hc5_details_setting_shows_breakers_to_anyone(settings):
    """HC-5: BALDUR_HEALTH_DETAILS lets anonymous callers see the breakers too."""
    settings.BALDUR_HEALTH_DETAILS = True
    baldur.get_breaker("search")
    assert call()[1]["breakers"] == {"search": "closed"}


def test_hc5_only_safe_methods(settings):
    """HC-5: the view answers GET and HEAD; POST gets 405."""
    assert call(method="head")[0] == 200
    request = factory.post("/health/ready/")
    request.user = AnonymousUser()
    assert health.health_view(request).status_code == 405


def test_hc5_health_check_backend_reports_the_same_judgement(settings):
    """HC-5: BreakerHealthCheck passes when ok, fails (ServiceUnavailable) when down, and warns
    on degraded only when asked to; through django-health-check's own view."""
    from health_check.views import HealthCheckView

    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    view = HealthCheckView.as_view(checks=[health.CHECK_PATH])
    strict = HealthCheckView.as_view(checks=[(health.CHECK_PATH, {"warn_when_degraded": True})])

    def page(v):
        response = v(factory.get("/ht/?format=json"))
        if asyncio.iscoroutine(response):
            response = asyncio.run(response)
        return response.status_code, next(iter(json.loads(response.content).values()))

    assert page(view) == (200, "OK")
    trip("search")
    assert page(view) == (200, "OK")
    status, text = page(strict)
    assert status == 500 and "breaker 'search' is OPEN" in text
    trip("payments")
    status, text = page(view)
    assert status == 500 and "unavailable" in text.lower() and "critical breaker 'payments' is OPEN" in text


def test_hc5_app_ready_registers_the_check_with_django_health_check():
    """HC-5: the health app's ready() adds the check to django-health-check's default list, once."""
    from health_check.views import HealthCheckView

    saved = HealthCheckView.checks
    try:
        HealthCheckView.checks = tuple(c for c in saved if c != health.CHECK_PATH)
        config = AppConfig.create("baldur_django.contrib.health")
        assert config.label == "baldur_health"
        config.ready()
        config.ready()
        assert list(HealthCheckView.checks).count(health.CHECK_PATH) == 1
    finally:
        HealthCheckView.checks = saved


@pytest.mark.parametrize(
    "name, value, check_id",
    [
        ("BALDUR_HEALTH_CRITICAL_SERVICES", "payments", "baldur.E072"),
        ("BALDUR_HEALTH_CRITICAL_SERVICES", [""], "baldur.E072"),
        ("BALDUR_HEALTH_DETAILS", "yes", "baldur.E073"),
    ],
)
def test_hc5_bad_health_settings_are_check_errors(settings, name, value, check_id):
    """HC-5, CFG-3: bad health settings are system-check errors with their own ids."""
    setattr(settings, name, value)
    ids = [m.id for m in run_checks() if m.id and m.id.startswith("baldur.")]
    assert check_id in ids


def test_hc5_details_on_is_a_deploy_warning(settings):
    """HC-5: check --deploy warns (W011) while the details are public."""
    settings.BALDUR_HEALTH_DETAILS = True
    assert "baldur.W011" in [m.id for m in run_checks(include_deployment_checks=True)]
    settings.BALDUR_HEALTH_DETAILS = False
    assert "baldur.W011" not in [m.id for m in run_checks(include_deployment_checks=True)]


HEALTH_URL = "/health/ready/"


@pytest.mark.urls("tests.http.health_urls")
def test_hc5_a_503_is_logged_once_as_a_warning_not_a_server_error(settings, client, caplog):
    """HC-5: a "down" answer is the view working as designed: Django's request logger gets one
    WARNING line with the reason, never the ERROR it logs for a server error."""
    settings.BALDUR_HEALTH_CRITICAL_SERVICES = ["payments"]
    trip("payments")
    caplog.set_level("INFO", logger="django.request")
    response = client.get(HEALTH_URL)
    assert response.status_code == 503
    lines = [r for r in caplog.records if r.name == "django.request"]
    assert [r.levelname for r in lines] == ["WARNING"], [(r.levelname, r.getMessage()) for r in lines]
    assert "critical breaker 'payments' is OPEN" in lines[0].getMessage()
