"""CB-16, CB-15, CB-17: operators see the current open duration and the new knobs.

The admin's breaker list and ``baldur_status`` show how long the current open lasts (backed
off on repeated opens) and each breaker's configuration, the new triggers included.
"""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

import baldur_django as baldur

LIST_URL = "/admin/baldur_django/breaker/"


@pytest.fixture
def backed_off(clock, db, settings):
    """'pay' opened twice in a row with factor 2: its current open lasts 20 s."""
    settings.BALDUR_SERVICES = {
        "pay": {
            "failure_threshold": 1,
            "recovery_timeout": 10,
            "half_open_max_calls": 1,
            "recovery_backoff_factor": 2,
            "recovery_timeout_max": 100,
            "slow_call_duration": 3,
        }
    }
    breaker = baldur.get_breaker("pay")
    breaker.record_failure(breaker.acquire())
    clock.advance(10)
    trial = breaker.acquire()
    breaker.record_failure(trial)
    return breaker


def test_cb16_admin_shows_the_current_open_duration_and_the_configuration(client, backed_off):
    """CB-16: 'open for 20 s (open 2 in a row)'; the configuration lists the CB-15..17 knobs."""
    client.force_login(User.objects.create_superuser("admin", "admin@example.test", "pw"))
    html = client.get(LIST_URL).content.decode()
    assert "open for 20 s (open 2 in a row)" in html
    assert "recovery_backoff_factor = 2.0" in html and "slow_call_duration = 3.0" in html
    assert "sliding_window_type = count" in html


def test_cb16_baldur_status_shows_the_open_duration(backed_off):
    """CB-16: the table's OPEN FOR column and the JSON document both carry it."""
    out = io.StringIO()
    call_command("baldur_status", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert "OPEN FOR" in text and "20s (#2)" in text
    out = io.StringIO()
    call_command("baldur_status", "--json", stdout=out, stderr=io.StringIO())
    row = next(r for r in json.loads(out.getvalue())["breakers"] if r["service"] == "pay")
    assert row["open_duration"] == pytest.approx(20) and row["consecutive_opens"] == 2
