"""OT-1: BALDUR_OTEL_ENABLED installs the reporting when the app is ready and follows changes."""

from __future__ import annotations

import logging

from baldur_django.apps import follow_otel_setting
from baldur_django.contrib import otel
from baldur_django.core.events import bus


def test_ot1_the_setting_turns_reporting_on_and_off(settings):
    """OT-1: switching BALDUR_OTEL_ENABLED on installs contrib.otel (the settings-reload hook
    the app registered in ready()), switching it off uninstalls it."""
    try:
        settings.BALDUR_OTEL_ENABLED = True
        assert otel.installed()
        assert otel.span_events in bus.listeners
        settings.BALDUR_OTEL_ENABLED = False
        assert not otel.installed()
        assert otel.span_events not in bus.listeners
    finally:
        otel.uninstall()


def test_ot1_a_bad_value_is_logged_not_raised(settings, caplog):
    """OT-1: a bad BALDUR_OTEL_SPANS while enabled leaves reporting off with an ERROR line
    (the system check reports the value with its hint)."""
    caplog.set_level(logging.ERROR, logger="baldur.config")
    try:
        settings.BALDUR_OTEL_SPANS = "sometimes"
        settings.BALDUR_OTEL_ENABLED = True
        follow_otel_setting()
    finally:
        otel.uninstall()
    assert any("BALDUR_OTEL_SPANS" in record.getMessage() for record in caplog.records)
