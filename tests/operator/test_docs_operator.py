"""docs/operator-guide.md stays true to the code (OP-6, OP-7, OP-8, CFG-4)."""

from __future__ import annotations

import re
from pathlib import Path

from baldur_django.contrib.slack import SlackNotifier
from baldur_django.core.events import Forced, StateChanged
from baldur_django.core.knobs import KNOBS

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "operator-guide.md").read_text(encoding="utf-8")


def test_images_exist():
    """OP-6: every screenshot the guide shows is in docs/img."""
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", GUIDE)
    assert len(images) >= 3
    for image in images:
        path = ROOT / "docs" / image
        assert path.is_file() and path.stat().st_size > 10_000, image


def test_only_real_settings_are_named():
    """CFG-4: every BALDUR_* name in the guide is a real knob."""
    names = set(re.findall(r"BALDUR_[A-Z0-9_]+", GUIDE))
    assert names and names <= set(KNOBS), names - set(KNOBS)


def test_slack_examples_are_what_the_notifier_sends():
    """OP-8: the example messages are exactly what message_for() produces."""
    examples = [
        StateChanged("payments", 1740837600.0, from_state="closed", to_state="open", trigger="consecutive_failures"),
        StateChanged("payments", 1740837665.0, from_state="half_open", to_state="closed", trigger="half_open_success"),
        Forced(
            "search",
            1740841200.0,
            mode="open",
            from_state="closed",
            to_state="open",
            ttl_minutes=30.0,
            reason="reindex",
            actor="alice",
        ),
    ]
    for event in examples:
        assert SlackNotifier.message_for(event) in GUIDE.splitlines()


def test_documented_command_options_exist():
    """OP-7: the options the guide mentions are the commands' real options."""
    from baldur_django.management.commands import baldur_force, baldur_status

    status = baldur_status.Command().create_parser("manage.py", "baldur_status").format_help()
    force = baldur_force.Command().create_parser("manage.py", "baldur_force").format_help()
    for option in ("--json", "--service", "--config"):
        assert option in status and f"`{option}" in GUIDE
    for option in ("--ttl", "--reason", "{open,close,release}"):
        assert option in force
