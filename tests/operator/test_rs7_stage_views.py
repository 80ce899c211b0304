"""RS-7: ``baldur_status`` (text and ``--json``) and the admin's breaker page show each
breaker's outbound stages (knobs, this process's live figures: slots in use, budget left,
throttle probability, the gate's end) and its refusals by reason; breakers without stages
show exactly what they showed before."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

import baldur_django as baldur
from baldur_django import services

from ..stages.refusing import refuse_each, staged

LIST_URL = "/admin/baldur_django/breaker/"


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def with_stages(clock, db):
    """'plain' without stages, 'staged' with every stage and one refusal of each reason."""
    plain = baldur.get_breaker("plain")
    plain.record_success(plain.acquire())
    breaker, held = staged("staged")
    refuse_each(breaker, held)
    return clock


def test_rs7_status_text_adds_a_stages_table_for_breakers_with_stages(with_stages):
    """RS-7: after the breakers' table, one line per stage of 'staged' (none for 'plain')."""
    out, _ = run("baldur_status")
    head, _, tail = out.partition("stages (this process):\n")
    assert "plain" in head and "staged" in head
    lines = tail.splitlines()
    assert lines[0].split() == ["SERVICE", "STAGE", "FIGURES"]
    figures = {line.split()[1]: line.split(None, 2)[2] for line in lines[1:]}
    assert [line.split()[0] for line in lines[1:]] == ["staged"] * len(figures)
    assert figures["bulkhead"].startswith("1/2 in flight")
    assert figures["retry_budget"].startswith("0.0 retries left")
    assert figures["adaptive_throttling"].startswith("p(refuse) 0.667")
    assert figures["retry_after_gate"].startswith("closed 30.0s more")
    assert figures["refused"] == "bulkhead_full 1, throttled 1, deadline 1, retry_after 1"


def test_rs7_status_text_without_stages_is_unchanged(clock, db):
    """RS-7: no breaker with stages, no stages table."""
    baldur.get_breaker("plain")
    out, _ = run("baldur_status")
    assert "stages" not in out and "STAGE" not in out


def test_rs7_status_json_rows_carry_the_stages_section(with_stages):
    """RS-7: ``--json``: the staged breaker's row has ``stages``; the plain one has none."""
    out, _ = run("baldur_status", "--json")
    rows = {row["service"]: row for row in json.loads(out)["breakers"]}
    assert "stages" not in rows["plain"]
    stages = rows["staged"]["stages"]
    assert stages["bulkhead"]["in_flight"] == 1 and stages["retry_budget"]["left"] == 0.0
    assert stages["adaptive_throttling"]["probability"] == pytest.approx(2 / 3)
    assert stages["retry_after_gate"]["closed_until"] == pytest.approx(with_stages.wall() + 30.0)
    assert stages["refused"] == {"bulkhead_full": 1, "throttled": 1, "deadline": 1, "retry_after": 1}


def test_rs7_stage_lines_name_every_stage_on_and_the_refusals():
    """RS-7: the text of a stages section, one line per stage that is on."""
    section = {
        "deadline": None,
        "retry_after_gate": {"scope": "fleet", "remaining": 0.0, "closed_until": None},
        "bulkhead": {"scope": "fleet", "limit": 5, "max_wait": 0.5, "in_flight": 3, "waiting": None},
        "retry_budget": None,
        "adaptive_throttling": None,
        "refused": {"bulkhead_full": 0, "throttled": 0, "deadline": 0, "retry_after": 0},
    }
    assert services.stage_lines(section) == [
        ("retry_after_gate", "open (fleet)"),
        ("bulkhead", "3/5 in flight, max_wait 0.5s (fleet)"),
        ("refused", "none"),
    ]


def test_rs7_admin_breaker_page_shows_the_stages(client, with_stages):
    """RS-7: the admin list shows the stages' lines under the staged breaker's name only."""
    client.force_login(User.objects.create_superuser("admin", "admin@example.test", "pw"))
    response = client.get(LIST_URL)
    rows = {row["service"]: row for row in response.context["rows"]}
    assert rows["plain"]["stage_lines"] is None
    lines = dict(rows["staged"]["stage_lines"])
    assert lines["bulkhead"].startswith("1/2 in flight")
    html = response.content.decode()
    assert html.count('class="baldur-stages"') == 1
    assert 'data-stage="retry_budget"' in html and "deadline 1, retry_after 1" in html
