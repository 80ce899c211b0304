"""The admin's Emergency Mode banner and its permission-gated set / step-down pages (EM-1, EM-3, OP-6)."""

from __future__ import annotations

import pytest

from baldur_django import signals
from baldur_django.core import emergency
from tests.operator.test_admin import LIST_URL, operator, superuser, viewer  # noqa: F401 - fixtures

EMERGENCY_URL = LIST_URL + "emergency/"


def test_em1_no_banner_at_level_0_and_only_holders_may_act(client, viewer, operator):  # noqa: F811
    """EM-1/OP-6: at level 0 there is no banner; a force_circuit holder sees the way to set a level, a viewer does not."""
    client.force_login(viewer)
    html = client.get(LIST_URL).content.decode()
    assert 'id="baldur-emergency"' not in html and "baldur-emergency-set" not in html
    client.force_login(operator)
    html = client.get(LIST_URL).content.decode()
    assert 'id="baldur-emergency"' not in html and 'id="baldur-emergency-set"' in html


def test_em1_banner_shows_level_expiry_and_who(client, viewer):  # noqa: F811
    """EM-1/OP-6: while a level is in force the page shows it, its expiry and who set it; a viewer gets no buttons."""
    emergency.set_level(3, minutes=45, reason="region outage", actor="alice")
    client.force_login(viewer)
    response = client.get(LIST_URL)
    html = response.content.decode()
    assert 'id="baldur-emergency"' in html and 'data-level="3"' in html
    assert "Emergency level 3" in html and "region outage" in html and "alice" in html
    assert "in 44 min" in html or "in 45 min" in html
    assert response.context["emergency"]["level"] == 3
    assert "baldur-emergency-step-down" not in html


def test_em1_viewer_cannot_set_or_step_down(client, viewer):  # noqa: F811
    """OP-6: without baldur_django.force_circuit the emergency page is forbidden and nothing changes."""
    emergency.set_level(2, minutes=10)
    client.force_login(viewer)
    assert client.get(EMERGENCY_URL).status_code == 403
    response = client.post(EMERGENCY_URL, {"action": "set", "post": "yes", "level": "0", "minutes": "5"})
    assert response.status_code == 403
    response = client.post(EMERGENCY_URL, {"action": "step_down", "post": "yes"})
    assert response.status_code == 403
    assert emergency.status()["level"] == 2


@pytest.mark.django_db
def test_em1_operator_sets_the_level_on_a_confirmation_page(client, operator, audit, audit_rows):  # noqa: F811
    """EM-1/OP-6: the confirmation page asks for level, minutes and reason; confirming sets the level,
    audits it like a force (source admin, actor the user) and sends emergency_level_changed."""
    client.force_login(operator)
    page = client.get(EMERGENCY_URL + "?action=set")
    assert page.status_code == 200 and 'id="baldur-emergency-form"' in page.content.decode()
    assert page.context["form"].initial["minutes"] == 90
    assert emergency.status()["level"] == 0  # the GET changed nothing
    received = []
    signals.emergency_level_changed.connect(lambda **kw: received.append(kw), weak=False, dispatch_uid="em1-admin")
    try:
        response = client.post(
            EMERGENCY_URL,
            {"action": "set", "post": "yes", "level": "3", "minutes": "15", "reason": "payments and search down"},
        )
    finally:
        signals.emergency_level_changed.disconnect(dispatch_uid="em1-admin")
    assert response.status_code == 302 and response["Location"] == LIST_URL
    status = emergency.status()
    assert (status["level"], status["actor"], status["reason"]) == (3, "operator", "payments and search down")
    (row,) = audit_rows()
    assert (row["action"], row["source"], row["actor"], row["ttl_minutes"]) == ("level_set", "admin", "operator", 15.0)
    assert (row["from_state"], row["to_state"], row["reason"]) == ("level 0", "level 3", "payments and search down")
    assert [(kw["level"], kw["previous"], kw["source"], kw["actor"]) for kw in received] == [
        (3, 0, "manual", "operator")
    ]
    html = client.get(LIST_URL).content.decode()
    assert 'data-level="3"' in html and 'id="baldur-emergency-step-down"' in html


@pytest.mark.django_db
def test_em3_operator_steps_down_on_a_confirmation_page(client, operator, audit, audit_rows):  # noqa: F811
    """EM-3/OP-6: step down asks for confirmation, lowers the level by one keeping its expiry, and is audited."""
    emergency.set_level(3, minutes=30, actor="alice")
    expires = emergency.status()["expires_at"]
    client.force_login(operator)
    page = client.get(EMERGENCY_URL + "?action=step_down")
    assert page.status_code == 200 and emergency.status()["level"] == 3
    response = client.post(EMERGENCY_URL, {"action": "step_down", "post": "yes"})
    assert response.status_code == 302
    assert emergency.status()["level"] == 2 and emergency.status()["expires_at"] == expires
    rows = audit_rows(action="level_step_down")
    assert [(r["source"], r["actor"], r["from_state"], r["to_state"]) for r in rows] == [
        ("admin", "operator", "level 3", "level 2")
    ]


@pytest.mark.parametrize("minutes", ["0", "1441", "-5", "abc"])
def test_em1_bad_lifetime_redisplays_the_form_and_writes_nothing(minutes, client, operator, emergency_state_file):  # noqa: F811
    """EM-1/OP-6: a lifetime out of range is a form error on the confirmation page; nothing is written."""
    client.force_login(operator)
    response = client.post(EMERGENCY_URL, {"action": "set", "post": "yes", "level": "3", "minutes": minutes})
    assert response.status_code == 200 and response.context["form"].errors["minutes"]
    assert not emergency_state_file.exists()


def test_em1_bad_level_is_a_form_error(client, superuser, emergency_state_file):  # noqa: F811
    """EM-1/OP-6: a level outside 0..3 is refused by the form."""
    client.force_login(superuser)
    response = client.post(EMERGENCY_URL, {"action": "set", "post": "yes", "level": "4", "minutes": "5"})
    assert response.status_code == 200 and response.context["form"].errors["level"]
    assert not emergency_state_file.exists()
