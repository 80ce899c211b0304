"""CFG-3: hints name a documentation page and section a reader can find, never a repository path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import override_settings

from baldur_django.checks import check_settings
from baldur_django.core.docpages import SETTINGS_PAGE, see_setting
from baldur_django.core.knobs import KNOBS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _settings_sections() -> dict[str, str]:
    section, found = None, {}
    for line in (DOCS / "settings.md").read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        match = re.match(r"\| `(BALDUR_[A-Z0-9_]+)`", line)
        if match:
            found[match.group(1)] = section
    return found


def test_cfg3_settings_page_title_is_the_one_hints_name():
    """CFG-3: the page the hints name is titled that way."""
    assert (DOCS / "settings.md").read_text().splitlines()[0] == f"# {SETTINGS_PAGE}"


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_cfg3_each_setting_hint_names_the_section_that_lists_it(name):
    """CFG-3: for every setting, the pointer names the settings page's section whose table has its row."""
    assert f'section "{_settings_sections()[name]}"' in see_setting(name)


@pytest.mark.parametrize(
    "bad",
    [
        {"BALDUR_CB_FAILURE_RATE_THRESHOLD": 150},
        {"BALDUR_REDIS_CLUSTER": True},
        {"BALDUR_SERVICES": {"payments": {"failure_predicate": "nowhere.at_all"}}},
        {"BALDUR_CB_FAILURE_TRESHOLD": 3},
    ],
    ids=["value", "cluster", "predicate", "unknown"],
)
def test_cfg3_no_check_message_points_at_a_repository_path(bad):
    """CFG-3: the messages and hints the checks produce name pages, not files such as docs/settings.md."""
    with override_settings(**bad):
        messages = [m for m in check_settings() if m.id.startswith("baldur.")]
    assert messages
    text = "\n".join(f"{m.msg}\n{m.hint or ''}" for m in messages)
    assert not re.search(r"docs/\w+\.md", text), text


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"BALDUR_MIDDLEWARE_CB_STATUS_CODES": "abc"}, "requests/httpx adapters"),
        ({"BALDUR_MIDDLEWARE_RATE_LIMIT_CODES": "abc"}, "outbound"),
        ({"BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL": "http://hooks.example/x"}, "every breaker"),
    ],
    ids=["status-codes", "rate-limit-codes", "webhook"],
)
def test_cfg3_hints_say_what_a_misleading_name_really_governs(bad, says):
    """CFG-3: settings whose names undersell them (a MIDDLEWARE status list the adapters read too, a
    watchdog webhook that gets every open and close) say what they govern in the check's hint."""
    with override_settings(**bad):
        (message,) = [m for m in check_settings() if m.id.startswith("baldur.E")]
    assert says in message.hint, message.hint
