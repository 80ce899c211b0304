"""Settings resolution (CFG-1), live reload (CFG-2) and reload errors (CFG-3) of the Django layer."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import override_settings

import baldur_django as baldur
from baldur_django import backends, conf
from baldur_django.conf import baldur_settings
from baldur_django.core.config import MISSING
from baldur_django.core.errors import ConfigError
from baldur_django.core.knobs import KNOBS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No BALDUR_* knob comes from the developer's shell."""
    for name in list(os.environ):
        if name in KNOBS:
            monkeypatch.delenv(name)
    baldur_settings.reset()
    yield monkeypatch
    baldur_settings.reset()


class Boom(Exception):
    pass


def _fail(breaker_name, times, **overrides):
    @baldur.circuit_breaker(breaker_name, **overrides)
    def call():
        raise Boom("down")

    for _ in range(times):
        with pytest.raises((Boom, baldur.CircuitOpenError)):
            call()
    return call


# --------------------------------------------------------------------- CFG-1


def test_cfg1_default_when_neither_setting_nor_env():
    """CFG-1: with no Django setting and no environment variable the table default applies."""
    assert baldur_settings.get("BALDUR_CB_FAILURE_THRESHOLD") == 5
    assert baldur_settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "default"
    assert baldur_settings.get("BALDUR_REDIS_URL") is None
    assert baldur_settings.source("BALDUR_REDIS_URL") == "default"


def test_cfg1_environment_variable_when_no_django_setting(clean_env):
    """CFG-1: the environment variable of the same name is read when no Django setting is defined."""
    clean_env.setenv("BALDUR_CB_FAILURE_THRESHOLD", "7")
    clean_env.setenv("BALDUR_CB_RECOVERY_TIMEOUT", "2.5")
    baldur_settings.reset()
    assert baldur_settings.get("BALDUR_CB_FAILURE_THRESHOLD") == 7
    assert baldur_settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "env"
    assert baldur_settings.get("BALDUR_CB_RECOVERY_TIMEOUT") == 2.5
    assert baldur_settings.source("BALDUR_CB_RECOVERY_TIMEOUT") == "env"


def test_cfg1_django_setting_beats_environment(clean_env):
    """CFG-1: a defined Django setting wins over the environment; the env comes back when it goes."""
    clean_env.setenv("BALDUR_CB_FAILURE_THRESHOLD", "7")
    baldur_settings.reset()
    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=3):
        assert baldur_settings.get("BALDUR_CB_FAILURE_THRESHOLD") == 3
        assert baldur_settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "setting"
    assert baldur_settings.get("BALDUR_CB_FAILURE_THRESHOLD") == 7
    assert baldur_settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "env"


def test_cfg1_setting_defined_as_none_counts_as_defined(clean_env):
    """CFG-1: ``BALDUR_REDIS_URL = None`` in settings is a defined setting and hides the env var."""
    clean_env.setenv("BALDUR_REDIS_URL", "redis://10.0.0.1:6379/0")
    with override_settings(BALDUR_REDIS_URL=None):
        assert baldur_settings.get("BALDUR_REDIS_URL") is None
        assert baldur_settings.source("BALDUR_REDIS_URL") == "setting"
    assert baldur_settings.get("BALDUR_REDIS_URL") == "redis://10.0.0.1:6379/0"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("500,503", {500, 503}),
        (" 500 , 502,504 ", {500, 502, 504}),
        ("[502]", {502}),
        ("[500, 503, 504]", {500, 503, 504}),
    ],
)
def test_cfg1_env_lists_comma_separated_or_json(clean_env, raw, expected):
    """CFG-1: an environment list is comma-separated or a JSON array."""
    clean_env.setenv("BALDUR_MIDDLEWARE_CB_STATUS_CODES", raw)
    baldur_settings.reset()
    assert baldur_settings.get("BALDUR_MIDDLEWARE_CB_STATUS_CODES") == frozenset(expected)
    assert baldur_settings.source("BALDUR_MIDDLEWARE_CB_STATUS_CODES") == "env"


def test_cfg1_env_dicts_are_json(clean_env):
    """CFG-1: environment dicts (BALDUR_SERVICES, BALDUR_DOMAIN_MAPPING) are JSON objects."""
    clean_env.setenv("BALDUR_SERVICES", json.dumps({"payments": {"failure_threshold": 2, "recovery_timeout": 0.5}}))
    clean_env.setenv("BALDUR_DOMAIN_MAPPING", '{"/api/pay/": "payments"}')
    clean_env.setenv("BALDUR_RATE_LIMIT_RULES", '[{"path": "/api/", "rate": "10/m", "key": "ip"}]')
    baldur_settings.reset()
    assert baldur_settings.get("BALDUR_SERVICES") == {"payments": {"failure_threshold": 2, "recovery_timeout": 0.5}}
    assert baldur_settings.get("BALDUR_DOMAIN_MAPPING") == {"/api/pay/": "payments"}
    assert baldur_settings.get("BALDUR_RATE_LIMIT_RULES") == [{"path": "/api/", "rate": "10/m", "key": "ip"}]


@pytest.mark.parametrize(
    "raw, expected", [("true", True), ("1", True), ("On", True), ("false", False), ("0", False), ("no", False)]
)
def test_cfg1_env_booleans(clean_env, raw, expected):
    """CFG-1: boolean environment values accept true/false, 1/0, yes/no, on/off."""
    clean_env.setenv("BALDUR_DRY_RUN", raw)
    baldur_settings.reset()
    assert baldur_settings.get("BALDUR_DRY_RUN") is expected


def test_cfg1_env_drives_a_breaker_inside_django(clean_env):
    """CFG-1: a breaker built under Django takes its threshold from the environment when no setting is given."""
    clean_env.setenv("BALDUR_CB_FAILURE_THRESHOLD", "2")
    baldur_settings.reset()
    call = _fail("env-driven", 2)
    assert call.breaker.state is baldur.CircuitState.OPEN


def test_cfg1_services_entry_beats_global_and_per_call_beats_both():
    """CFG-1: precedence is per-call override > BALDUR_SERVICES[service] > global setting."""
    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=9, BALDUR_SERVICES={"svc-a": {"failure_threshold": 4}}):
        a = baldur.get_breaker("svc-a")
        b = baldur.get_breaker("svc-b")
        c = _fail("svc-c", 0, failure_threshold=2).breaker
        assert (a.config.failure_threshold, b.config.failure_threshold, c.config.failure_threshold) == (4, 9, 2)


def test_cfg1_bad_env_value_is_a_config_error_naming_setting_and_value(clean_env):
    """CFG-1/CFG-3: a bad environment value raises ConfigError (a ValueError) naming the knob and the value."""
    clean_env.setenv("BALDUR_CB_FAILURE_THRESHOLD", "five")
    baldur_settings.reset()
    with pytest.raises(ConfigError) as info:
        baldur_settings.get("BALDUR_CB_FAILURE_THRESHOLD")
    assert isinstance(info.value, ValueError)
    assert "BALDUR_CB_FAILURE_THRESHOLD" in str(info.value) and "five" in str(info.value)


def test_cfg1_report_names_every_knob_with_its_source(clean_env):
    """CFG-1/CFG-4: report() lists every knob once with its effective value and where it came from."""
    clean_env.setenv("BALDUR_CB_MINIMUM_CALLS", "4")
    baldur_settings.reset()
    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=3):
        rows = {name: (value, source) for name, value, source in baldur_settings.report()}
    assert list(rows) == list(KNOBS)
    assert rows["BALDUR_CB_FAILURE_THRESHOLD"] == (3, "setting")
    assert rows["BALDUR_CB_MINIMUM_CALLS"] == (4, "env")
    assert rows["BALDUR_CB_RECOVERY_TIMEOUT"] == (60, "default")


def test_cfg1_install_reads_django_settings_and_is_idempotent():
    """CFG-1: install() (run by ready()) puts Django settings first; running it twice changes nothing."""
    conf.install()
    conf.install()
    assert conf.django_lookup("BALDUR_CB_FAILURE_THRESHOLD") is MISSING
    with override_settings(BALDUR_CB_HALF_OPEN_MAX_CALLS=1):
        assert conf.django_lookup("BALDUR_CB_HALF_OPEN_MAX_CALLS") == 1
        assert baldur_settings.get("BALDUR_CB_HALF_OPEN_MAX_CALLS") == 1


def test_cfg1_plain_python_process_is_configured_by_environment_variables():
    """CFG-1: without Django settings, `import baldur_django` works and env vars configure breakers."""
    script = textwrap.dedent(
        """
        import sys
        import baldur_django as baldur
        from baldur_django.core.config import settings

        @baldur.protected("payments", fallback=lambda: "queued")
        def charge():
            raise ConnectionError("gateway down")

        assert [charge(), charge()] == ["queued", "queued"]
        assert baldur.get_breaker("payments").state is baldur.CircuitState.OPEN, "threshold 2 from env"
        assert settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "env"
        assert settings.get("BALDUR_MIDDLEWARE_CB_STATUS_CODES") == frozenset({502, 503})
        assert settings.get("BALDUR_SERVICES") == {"search": {"failure_threshold": 9}}
        assert baldur.get_breaker("search").config.failure_threshold == 9
        assert "django" not in sys.modules, "the core must not import Django"
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE" and k not in KNOBS}
    env.update(
        BALDUR_CB_FAILURE_THRESHOLD="2",
        BALDUR_MIDDLEWARE_CB_STATUS_CODES="502,503",
        BALDUR_SERVICES='{"search": {"failure_threshold": 9}}',
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# --------------------------------------------------------------------- CFG-2


def test_cfg2_override_reaches_an_existing_breaker_and_keeps_its_per_call_overrides(clock):
    """CFG-2: override_settings changes a breaker created before it; its per-call overrides stay."""
    call = _fail("existing", 0, recovery_timeout=7)
    breaker = call.breaker
    assert breaker.config.failure_threshold == 5
    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=2, BALDUR_CB_RECOVERY_TIMEOUT=100):
        assert breaker.config.failure_threshold == 2
        assert breaker.config.recovery_timeout == 7  # per-call override kept
        for _ in range(2):
            with pytest.raises(Boom):
                call()
        assert breaker.state is baldur.CircuitState.OPEN
        clock.advance(7)
        assert breaker.state is baldur.CircuitState.HALF_OPEN
    assert breaker.config.failure_threshold == 5  # restored when the override ends
    assert breaker.config.recovery_timeout == 7


def test_cfg2_services_entry_applies_live_but_not_over_a_per_call_override():
    """CFG-2: a new BALDUR_SERVICES entry reaches existing breakers; a per-call override still wins."""
    plain = baldur.get_breaker("live-a")
    pinned = _fail("live-b", 0, failure_threshold=8).breaker
    services = {"live-a": {"failure_threshold": 3}, "live-b": {"failure_threshold": 3, "half_open_max_calls": 1}}
    with override_settings(BALDUR_SERVICES=services):
        assert plain.config.failure_threshold == 3
        assert pinned.config.failure_threshold == 8
        assert pinned.config.half_open_max_calls == 1
    assert plain.config.failure_threshold == 5
    assert pinned.config.half_open_max_calls == 3


def test_cfg2_ignore_exceptions_survive_a_reload():
    """CFG-2: per-call ignore_exceptions are kept when settings change."""

    @baldur.circuit_breaker("ignoring", ignore_exceptions=(KeyError,))
    def call():
        raise KeyError("not a failure")

    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=1):
        with pytest.raises(KeyError):
            call()
        assert call.breaker.config.ignore_exceptions == (KeyError,)
        assert call.breaker.state is baldur.CircuitState.CLOSED
        assert call.breaker.snapshot()["consecutive_failures"] == 0


def test_cfg2_pytest_django_settings_fixture_also_reloads(settings):
    """CFG-2: the pytest-django `settings` fixture (setting_changed) reaches existing breakers."""
    breaker = baldur.get_breaker("fixture")
    settings.BALDUR_CB_HALF_OPEN_MAX_CALLS = 1
    assert breaker.config.half_open_max_calls == 1


def test_cfg2_bad_value_leaves_every_breaker_on_its_previous_config(caplog):
    """CFG-2/CFG-3: a bad value in a reload is all-or-nothing: no breaker is half updated, and it is logged."""
    a = baldur.get_breaker("whole-a")
    b = baldur.get_breaker("whole-b")
    bad = {"whole-b": {"failure_threshold": 0}}
    with (
        caplog.at_level(logging.ERROR, logger="baldur.config"),
        override_settings(BALDUR_CB_FAILURE_THRESHOLD=2, BALDUR_SERVICES=bad),  # must not raise
    ):
        assert a.config.failure_threshold == 5, "a valid change must not be applied to some breakers only"
        assert b.config.failure_threshold == 5
        with pytest.raises(ConfigError, match=r"BALDUR_SERVICES\['whole-b'\]\['failure_threshold'\]=0"):
            baldur.get_breaker("new-while-bad")
    errors = [r for r in caplog.records if r.name == "baldur.config" and r.levelno == logging.ERROR]
    assert errors, "the bad value must be reported"
    text = errors[0].getMessage()
    assert "BALDUR_SERVICES" in text and "failure_threshold" in text and "=0" in text
    assert "previous configuration" in text
    # back to good settings: everything applies again
    assert a.config.failure_threshold == 5
    assert baldur.get_breaker("new-after").config.failure_threshold == 5


def test_cfg2_bad_value_is_reported_even_when_no_breaker_exists(caplog):
    """CFG-2/CFG-3: the changed setting is validated at once, not only when a breaker next reads it."""
    with caplog.at_level(logging.ERROR, logger="baldur.config"), override_settings(BALDUR_CB_RECOVERY_TIMEOUT=0):
        pass
    messages = [r.getMessage() for r in caplog.records if r.name == "baldur.config"]
    assert any("BALDUR_CB_RECOVERY_TIMEOUT=0" in m for m in messages), messages


def test_cfg2_direct_reload_raises_and_keeps_configs():
    """CFG-2: conf.reload() itself raises ConfigError for a bad value and changes no breaker."""
    breaker = baldur.get_breaker("direct")
    with override_settings(BALDUR_CB_HALF_OPEN_MAX_CALLS=0):
        with pytest.raises(ConfigError, match="BALDUR_CB_HALF_OPEN_MAX_CALLS=0"):
            conf.reload("BALDUR_CB_HALF_OPEN_MAX_CALLS")
        assert breaker.config.half_open_max_calls == 3


def test_cfg2_misspelt_setting_in_override_is_logged_with_closest_name(caplog):
    """CFG-2/CFG-3: changing an unknown BALDUR_* setting logs a warning naming the closest known one."""
    with caplog.at_level(logging.WARNING, logger="baldur.config"), override_settings(BALDUR_CB_FAILURE_TRESHOLD=2):
        pass
    assert any("did you mean BALDUR_CB_FAILURE_THRESHOLD" in r.getMessage() for r in caplog.records)


def test_cfg2_other_django_settings_do_not_reload(monkeypatch):
    """CFG-2: only BALDUR_* changes reload the breakers."""
    calls = []
    monkeypatch.setattr(baldur_settings, "reset", lambda: calls.append(1))
    with override_settings(USE_I18N=False):
        pass
    assert calls == []


def test_cfg2_reload_hooks_run_after_a_good_reload_only(caplog):
    """CFG-2: reload hooks (used to rebuild shared stores) run after a successful reload, never after a bad one."""
    seen = []

    def hook():
        seen.append(baldur_settings.get("BALDUR_CB_SYNC_INTERVAL_SECONDS"))

    def broken_hook():
        raise RuntimeError("hook bug")

    conf.add_reload_hook(broken_hook)
    conf.add_reload_hook(hook)
    conf.add_reload_hook(hook)  # idempotent
    try:
        with caplog.at_level(logging.ERROR, logger="baldur.config"):
            with override_settings(BALDUR_CB_SYNC_INTERVAL_SECONDS=1.5):
                pass
            with override_settings(BALDUR_CB_SYNC_INTERVAL_SECONDS=-1):
                pass
    finally:
        conf.remove_reload_hook(hook)
        conf.remove_reload_hook(broken_hook)
    assert seen == [1.5, 5, 5]  # enter, exit; the bad value's enter ran no hook, its exit did
    assert any("hook bug" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_cfg2_reload_error_never_shows_secrets(caplog):
    """CFG-2/OP-8: a reload error shows neither the Slack webhook URL nor a Redis password."""
    secret_hook = "hooks.slack.com/services/T000/B000/SECRETTOKEN"
    with caplog.at_level(logging.ERROR, logger="baldur.config"):
        with override_settings(BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL=secret_hook):
            pass
        with override_settings(BALDUR_REDIS_URL="redis://:hunter2@cache:notaport/0"):
            pass
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL" in text and "BALDUR_REDIS_URL" in text
    assert "SECRETTOKEN" not in text and "hunter2" not in text
    assert "***" in text


def test_cfg2_redact_masks_url_passwords():
    """CFG-3: redact() masks the password of any URL in a message and nothing else."""
    assert conf.redact("x='redis://user:pw@host:6379/0' y") == "x='redis://user:***@host:6379/0' y"
    assert conf.redact("redis://:pw@h") == "redis://:***@h"
    assert conf.redact("redis://host:6379") == "redis://host:6379"


# --------------------------------------------------------------------- ST-2 wiring


def test_st2_changing_the_backend_setting_switches_existing_breakers_live():
    """ST-2/CFG-2: overriding BALDUR_STATE_BACKEND installs the shared store for existing breakers, and back."""
    from baldur_django.core.registry import registry

    breaker = baldur.get_breaker("switch")
    assert breaker.backend == "memory" and registry.store is None
    with override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_URL="redis://127.0.0.1:6379/15"):
        assert registry.store is not None and registry.store.backend == "redis"
        assert breaker.backend == "redis"  # the same object, switched in place (no connection opened)
    assert registry.store is None and breaker.backend == "memory"
    with override_settings(BALDUR_STATE_BACKEND="database"):
        assert breaker.backend == "database"
    assert breaker.backend == "memory"


def test_st2_a_store_that_cannot_be_built_changes_nothing(caplog):
    """ST-2/CFG-3: the redis backend with neither URL nor django-redis alias is logged; breakers stay as they were."""
    from baldur_django.core.registry import registry

    breaker = baldur.get_breaker("unbuildable")
    with (
        caplog.at_level(logging.ERROR, logger="baldur.config"),
        override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_CB_FAILURE_THRESHOLD=2),
    ):
        assert registry.store is None and breaker.backend == "memory"
        assert breaker.config.failure_threshold == 5  # all or nothing, store included
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "baldur.config")
    assert "BALDUR_REDIS_URL" in text and "BALDUR_REDIS_CACHE_ALIAS" in text


def test_st2_ready_installs_the_store_the_environment_asks_for(clean_env):
    """ST-2/CFG-1: ready() installs the shared store named by BALDUR_STATE_BACKEND (here from the environment)."""
    from django.apps import apps

    from baldur_django.core.registry import registry

    breaker = baldur.get_breaker("at-startup")
    clean_env.setenv("BALDUR_STATE_BACKEND", "database")
    try:
        apps.get_app_config("baldur_django").ready()
        assert registry.store is not None and registry.store.backend == "database"
        assert breaker.backend == "database"
        assert backends.install_store() is False  # unchanged settings: nothing rebuilt
    finally:
        clean_env.delenv("BALDUR_STATE_BACKEND")
        baldur_settings.reset()
        assert backends.install_store() is True
    assert registry.store is None and breaker.backend == "memory"


# --------------------------------------------------------------------- CB-15..CB-17 settings


def test_cfg1_cb15_cb16_cb17_from_environment_reach_a_breaker(clean_env):
    """CFG-1, CB-15..CB-17: the new global knobs come from environment variables under Django too."""
    for name, raw in {
        "BALDUR_CB_SLIDING_WINDOW_TYPE": "time",
        "BALDUR_CB_SLIDING_WINDOW_SECONDS": "20",
        "BALDUR_CB_RECOVERY_BACKOFF_FACTOR": "2",
        "BALDUR_CB_RECOVERY_TIMEOUT_MAX": "300",
        "BALDUR_CB_SLOW_CALL_DURATION_SECONDS": "1.5",
        "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD": "40",
    }.items():
        clean_env.setenv(name, raw)
    baldur_settings.reset()
    cfg = baldur.get_breaker("env-new").config
    assert (cfg.sliding_window_type, cfg.sliding_window_seconds) == ("time", 20)
    assert (cfg.recovery_backoff_factor, cfg.recovery_timeout_max) == (2.0, 300.0)
    assert (cfg.slow_call_duration, cfg.slow_call_rate_threshold) == (1.5, 40.0)
    assert baldur_settings.source("BALDUR_CB_SLOW_CALL_DURATION_SECONDS") == "env"


def test_cfg1_cb15_cb16_cb17_django_setting_beats_services_defaults_and_call_beats_both():
    """CFG-1, CB-15..CB-17: per call > BALDUR_SERVICES > Django setting for the new keys."""
    services = {"svc-new": {"slow_call_duration": 2.0, "sliding_window_type": "time"}}
    with override_settings(BALDUR_CB_SLOW_CALL_DURATION_SECONDS=5.0, BALDUR_SERVICES=services):
        other = baldur.get_breaker("other-new").config
        svc = baldur.get_breaker("svc-new").config
        call = _fail("call-new", 0, slow_call_duration=0.5, sliding_window_seconds=3).breaker.config
    assert (other.slow_call_duration, other.sliding_window_type) == (5.0, "count")
    assert (svc.slow_call_duration, svc.sliding_window_type) == (2.0, "time")
    assert (call.slow_call_duration, call.sliding_window_seconds) == (0.5, 3)


def test_cfg2_cb15_cb16_cb17_changes_reach_existing_breakers_and_keep_per_call_overrides():
    """CFG-2, CB-15..CB-17: override_settings of a new knob reaches a breaker built before it; that
    breaker's per-call new overrides stay; the old values come back afterwards."""
    plain = baldur.get_breaker("live-new")
    pinned = _fail("live-new-pinned", 0, recovery_backoff_factor=3.0).breaker
    with override_settings(
        BALDUR_CB_RECOVERY_BACKOFF_FACTOR=1.5,
        BALDUR_CB_SLOW_CALL_RATE_THRESHOLD=25.0,
        BALDUR_SERVICES={"live-new": {"sliding_window_seconds": 7}},
    ):
        assert (plain.config.recovery_backoff_factor, plain.config.slow_call_rate_threshold) == (1.5, 25.0)
        assert plain.config.sliding_window_seconds == 7
        assert (pinned.config.recovery_backoff_factor, pinned.config.slow_call_rate_threshold) == (3.0, 25.0)
    assert (plain.config.recovery_backoff_factor, plain.config.sliding_window_seconds) == (1.0, 60)
    assert pinned.config.recovery_backoff_factor == 3.0


def test_cfg2_a_fractional_window_span_is_refused_live_and_changes_nothing(caplog):
    """CFG-2, CB-15: override_settings with a fractional BALDUR_CB_SLIDING_WINDOW_SECONDS is logged as
    an error naming the setting and value; existing breakers keep their configuration."""
    breaker = baldur.get_breaker("live-span")
    with (
        caplog.at_level(logging.ERROR, logger="baldur.config"),
        override_settings(BALDUR_CB_SLIDING_WINDOW_SECONDS=2.5),
    ):
        assert breaker.config.sliding_window_seconds == 60
    text = caplog.text
    assert "BALDUR_CB_SLIDING_WINDOW_SECONDS=2.5" in text and "whole number" in text


def test_cfg4_config_report_shows_the_new_knobs_with_their_sources(clean_env):
    """CFG-4, CB-15..CB-17: baldur_status --config's report lists each new knob with its value and
    source, and a BALDUR_SERVICES entry's new keys as set."""
    from baldur_django import services

    clean_env.setenv("BALDUR_CB_SLIDING_WINDOW_SECONDS", "15")
    baldur_settings.reset()
    entry = {"pay": {"slow_call_duration": 0.75, "recovery_timeout_max": 120}}
    with override_settings(BALDUR_CB_SLIDING_WINDOW_TYPE="time", BALDUR_SERVICES=entry):
        rows = {row["name"]: row for row in services.config_report()}
    assert rows["BALDUR_CB_SLIDING_WINDOW_TYPE"] == {
        "name": "BALDUR_CB_SLIDING_WINDOW_TYPE",
        "value": "time",
        "source": "setting",
    }
    assert rows["BALDUR_CB_SLIDING_WINDOW_SECONDS"] == {
        "name": "BALDUR_CB_SLIDING_WINDOW_SECONDS",
        "value": 15,
        "source": "env",
    }
    for name, value in [
        ("BALDUR_CB_RECOVERY_BACKOFF_FACTOR", 1.0),
        ("BALDUR_CB_RECOVERY_TIMEOUT_MAX", 600.0),
        ("BALDUR_CB_SLOW_CALL_DURATION_SECONDS", 0.0),
        ("BALDUR_CB_SLOW_CALL_RATE_THRESHOLD", 100.0),
    ]:
        assert (rows[name]["value"], rows[name]["source"]) == (value, "default"), name
    assert rows["BALDUR_SERVICES"]["value"] == {"pay": {"slow_call_duration": 0.75, "recovery_timeout_max": 120.0}}


def test_cfg4_config_report_hides_every_secret_knob():
    """CFG-4: the report hides the value of each knob whose row is marked secret."""
    from baldur_django import services
    from baldur_django.core.knobs import SECRETS

    assert SECRETS
    values = {name: "https://hooks.example.test/services/T/B/HIDEME" for name in SECRETS}
    with override_settings(**values):
        rows = {row["name"]: row for row in services.config_report()}
    assert all(rows[name]["value"] == "<set, hidden>" for name in SECRETS)
