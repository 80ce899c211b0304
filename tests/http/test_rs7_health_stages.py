"""RS-7: the health view's staff details show each breaker's outbound stages (knobs, this
process's figures, refusals by reason), read without store I/O; without stages the document
is unchanged."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory

import baldur_django as baldur
from baldur_django.contrib import health

from ..stages.refusing import refuse_each, staged

pytestmark = pytest.mark.django_db

factory = RequestFactory()


def call(user=None):
    request = factory.get("/health/ready/")
    request.user = user or AnonymousUser()
    response = health.health_view(request)
    return response.status_code, json.loads(response.content)


def staff():
    return User(username="ops", is_staff=True, is_active=True)


def test_rs7_staff_details_show_the_stages_of_breakers_that_have_them(clock):
    """RS-7: staff see ``stages`` for the staged breaker only; anonymous callers see none."""
    baldur.get_breaker("plain")
    breaker, held = staged("staged")
    refuse_each(breaker, held)
    status, body = call(staff())
    assert status == 200 and set(body["stages"]) == {"staged"}
    stages = body["stages"]["staged"]
    assert stages["bulkhead"]["in_flight"] == 1
    assert stages["retry_budget"]["left"] == 0.0
    assert stages["adaptive_throttling"]["probability"] == pytest.approx(2 / 3)
    assert stages["retry_after_gate"]["remaining"] == pytest.approx(30.0)
    assert stages["refused"] == {"bulkhead_full": 1, "throttled": 1, "deadline": 1, "retry_after": 1}
    assert call() == (200, {"status": "ok", "emergency_level": 0})


def test_rs7_without_stages_the_staff_document_is_unchanged(clock):
    """RS-7: no breaker with stages, no ``stages`` key."""
    baldur.get_breaker("plain")
    _, body = call(staff())
    assert set(body) == {"status", "emergency_level", "breakers", "critical", "store"}
