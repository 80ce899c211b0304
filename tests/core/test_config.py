"""Settings resolution and validation on the core side (CFG-1, CFG-3).

Everything here goes through :class:`SettingsSource` with an injected environment or
lookup, or through the process-wide ``settings`` with a patched ``os.environ`` and a
``reset()``; no Django setting is involved (tests/settings.py defines no ``BALDUR_*``).
"""

from __future__ import annotations

import json
import math
import tempfile

import pytest

import baldur_django as baldur
from baldur_django.core.config import (
    MISSING,
    BreakerConfig,
    SettingsSource,
    build_config,
    settings,
    validate_overrides,
)
from baldur_django.core.emergency.backends import project_level_file
from baldur_django.core.errors import BaldurError, ConfigError
from baldur_django.core.knobs import (
    CHECK_IDS,
    KNOBS,
    LOCAL_KEYS,
    OVERRIDE_KEYS,
    RESERVED,
    SECRETS,
    SERVICE_KEYS,
    Knob,
    closest_knob,
    parse,
)
from baldur_django.core.registry import registry
from baldur_django.core.retry import RetryPolicy

# Section 10 of the requirements, as values (the emergency state file is checked apart).
SPEC_DEFAULTS = {
    "BALDUR_CB_FAILURE_THRESHOLD": 5,
    "BALDUR_CB_FAILURE_RATE_THRESHOLD": 50.0,
    "BALDUR_CB_SLIDING_WINDOW_SIZE": 100,
    "BALDUR_CB_SLIDING_WINDOW_TYPE": "count",
    "BALDUR_CB_SLIDING_WINDOW_SECONDS": 60,
    "BALDUR_CB_MINIMUM_CALLS": 10,
    "BALDUR_CB_RECOVERY_TIMEOUT": 60,
    "BALDUR_CB_HALF_OPEN_MAX_CALLS": 3,
    "BALDUR_CB_RECOVERY_BACKOFF_FACTOR": 1.0,
    "BALDUR_CB_RECOVERY_TIMEOUT_MAX": 600,
    "BALDUR_CB_SLOW_CALL_DURATION_SECONDS": 0,
    "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD": 100.0,
    "BALDUR_SERVICES": {},
    "BALDUR_MIDDLEWARE_CB_STATUS_CODES": {500, 502, 503, 504},
    "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES": {429},
    "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD": 10,
    "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS": 60,
    "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO": 10.0,
    "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS": 20,
    "BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS": 1.0,
    "BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS": 3600,
    "BALDUR_MAX_COOLDOWN_WAIT_SECONDS": 60,
    "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES": 90,
    "BALDUR_DOMAIN_MAPPING": {},
    "BALDUR_DOMAIN_DEFAULT": "default",
    "BALDUR_MIDDLEWARE_SHED_LOAD": False,
    "BALDUR_RATE_LIMIT_CACHE_ALIAS": "default",
    "BALDUR_RATE_LIMIT_TRUSTED_PROXIES": 1,
    "BALDUR_STATE_BACKEND": "memory",
    "BALDUR_REDIS_URL": None,
    "BALDUR_REDIS_CACHE_ALIAS": "default",
    "BALDUR_REDIS_SOCKET_TIMEOUT": 0.25,
    "BALDUR_STORE_WARNING_INTERVAL_SECONDS": 60,
    "BALDUR_CB_SYNC_INTERVAL_SECONDS": 5,
    "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS": 30,
    "BALDUR_REGISTRY_TTL_DAYS": 7,
    "BALDUR_TASK_RECOVERY_SWEEP_SECONDS": 10,
    "BALDUR_TASK_STATE_SYNC_SECONDS": 30,
    "BALDUR_TASK_EMERGENCY_CHECK_SECONDS": 10,
    "BALDUR_TASK_META_WATCHDOG_SECONDS": 60,
    "BALDUR_DRY_RUN": False,
    "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL": "WARNING",
    "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL": None,
    "BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED": False,
    "BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS": 300,
    "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED": False,
    "BALDUR_EMERGENCY_BACKEND": "file",
    "BALDUR_EMERGENCY_CACHE_SECONDS": 30,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED": False,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO": 70.0,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS": 3,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES": 30,
    "BALDUR_EMERGENCY_STABILIZATION_SECONDS": 300,
    "BALDUR_RATE_LIMIT_RULES": [],
    "BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR": False,
    "BALDUR_REDIS_MAX_CONNECTIONS": 50,
    "BALDUR_REDIS_CLUSTER": False,
}


def env_source(**environ: str) -> SettingsSource:
    """A settings source reading only *environ* (no Django lookup)."""
    return SettingsSource(environ=dict(environ))


def lookup_source(values: dict, environ: dict | None = None) -> SettingsSource:
    """A settings source whose 'Django settings' are *values*."""
    return SettingsSource(lookup=lambda name: values.get(name, MISSING), environ=environ or {})


# --------------------------------------------------------------------------- CFG-1


def test_cfg1_every_spec_knob_is_one_row_with_the_spec_default():
    """CFG-1: every knob of section 10 is a row of the one defaults table, with its default."""
    src = env_source()
    missing = sorted(set(SPEC_DEFAULTS) - set(KNOBS))
    assert missing == []
    for name, expected in SPEC_DEFAULTS.items():
        value = src.get(name)
        if isinstance(expected, set):
            assert set(value) == expected, name
        else:
            assert value == expected, name
            assert type(value) is type(expected) or isinstance(expected, (int, float)), name
        assert src.source(name) == "default", name
    # unset by default: the level file then used is one of the project's own in the system temp dir
    assert src.get("BALDUR_EMERGENCY_STATE_FILE") is None
    assert project_level_file().startswith(tempfile.gettempdir())


def test_cfg1_env_var_beats_default_and_records_its_source():
    """CFG-1: an environment variable replaces the default; provenance says "env"."""
    src = env_source(BALDUR_CB_FAILURE_THRESHOLD="7", BALDUR_CB_RECOVERY_TIMEOUT="2.5")
    assert src.get("BALDUR_CB_FAILURE_THRESHOLD") == 7
    assert isinstance(src.get("BALDUR_CB_FAILURE_THRESHOLD"), int)
    assert src.source("BALDUR_CB_FAILURE_THRESHOLD") == "env"
    assert src.get("BALDUR_CB_RECOVERY_TIMEOUT") == 2.5
    assert src.source("BALDUR_CB_MINIMUM_CALLS") == "default"


def test_cfg1_setting_beats_env_var_and_missing_setting_falls_through():
    """CFG-1: the injected (Django) setting wins over the env var; MISSING falls back to env, then default."""
    src = lookup_source(
        {"BALDUR_CB_FAILURE_THRESHOLD": 3},
        environ={"BALDUR_CB_FAILURE_THRESHOLD": "7", "BALDUR_CB_MINIMUM_CALLS": "4"},
    )
    assert src.get("BALDUR_CB_FAILURE_THRESHOLD") == 3
    assert src.source("BALDUR_CB_FAILURE_THRESHOLD") == "setting"
    assert src.get("BALDUR_CB_MINIMUM_CALLS") == 4
    assert src.source("BALDUR_CB_MINIMUM_CALLS") == "env"
    assert src.get("BALDUR_CB_HALF_OPEN_MAX_CALLS") == 3
    assert src.source("BALDUR_CB_HALF_OPEN_MAX_CALLS") == "default"


def test_cfg1_values_are_cached_until_reset():
    """CFG-1: resolved values are cached; reset() re-reads them and bumps the version."""
    environ = {"BALDUR_CB_FAILURE_THRESHOLD": "7"}
    src = SettingsSource(environ=environ)
    assert src.get("BALDUR_CB_FAILURE_THRESHOLD") == 7
    environ["BALDUR_CB_FAILURE_THRESHOLD"] = "9"
    assert src.get("BALDUR_CB_FAILURE_THRESHOLD") == 7
    version = src.version
    src.reset()
    assert src.version == version + 1
    assert src.get("BALDUR_CB_FAILURE_THRESHOLD") == 9


def test_cfg1_process_settings_read_os_environ_after_reset(monkeypatch):
    """CFG-1: the process-wide settings follow os.environ once reset."""
    monkeypatch.setenv("BALDUR_CB_FAILURE_THRESHOLD", "11")
    settings.reset()
    assert settings.get("BALDUR_CB_FAILURE_THRESHOLD") == 11
    assert settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "env"
    monkeypatch.delenv("BALDUR_CB_FAILURE_THRESHOLD")
    settings.reset()
    assert settings.get("BALDUR_CB_FAILURE_THRESHOLD") == 5
    assert settings.source("BALDUR_CB_FAILURE_THRESHOLD") == "default"


def test_cfg1_env_var_reaches_a_new_breaker(monkeypatch, clock):
    """CFG-1: a breaker created after the env var is set uses it."""
    monkeypatch.setenv("BALDUR_CB_FAILURE_THRESHOLD", "2")
    settings.reset()
    breaker = baldur.get_breaker("env-threshold")
    assert breaker.config.failure_threshold == 2
    for _ in range(2):
        breaker.record_failure(breaker.acquire())
    assert breaker.state is baldur.CircuitState.OPEN


def test_cfg1_report_lists_every_knob_with_source_and_marks_errors():
    """CFG-1/CFG-4 core side: report() gives (name, value, source) for every knob; a bad one reads as an error row."""
    src = env_source(BALDUR_CB_FAILURE_THRESHOLD="zero", BALDUR_CB_MINIMUM_CALLS="4")
    rows = {name: (value, source) for name, value, source in src.report()}
    assert set(rows) == set(KNOBS)
    assert rows["BALDUR_CB_MINIMUM_CALLS"] == (4, "env")
    assert rows["BALDUR_CB_HALF_OPEN_MAX_CALLS"] == (3, "default")
    value, source = rows["BALDUR_CB_FAILURE_THRESHOLD"]
    assert source == "error"
    assert "BALDUR_CB_FAILURE_THRESHOLD" in value and "zero" in value


def test_cfg1_unknown_knob_name_is_a_key_error():
    """CFG-1: asking for a name that is not in the table is a programming error (KeyError)."""
    with pytest.raises(KeyError):
        env_source().get("BALDUR_NOT_A_KNOB")


@pytest.mark.parametrize("raw", ["500,503", " 500 , 503 ", "[500, 503]", "500,503,"])
def test_cfg1_env_status_lists_as_csv_or_json(raw):
    """CFG-1: an environment list is comma-separated or a JSON array."""
    src = env_source(BALDUR_MIDDLEWARE_CB_STATUS_CODES=raw)
    assert src.get("BALDUR_MIDDLEWARE_CB_STATUS_CODES") == frozenset({500, 503})


def test_cfg1_env_empty_status_list_means_no_codes():
    """CFG-1: an empty environment list is an empty list (nothing counts as a failure status)."""
    assert env_source(BALDUR_MIDDLEWARE_RATE_LIMIT_CODES="").get("BALDUR_MIDDLEWARE_RATE_LIMIT_CODES") == frozenset()
    assert env_source(BALDUR_MIDDLEWARE_RATE_LIMIT_CODES="[]").get("BALDUR_MIDDLEWARE_RATE_LIMIT_CODES") == frozenset()


def test_cfg1_setting_status_lists_accept_python_sequences():
    """CFG-1: as a (Django) setting, any list/tuple/set of ints is accepted."""
    for value in ([418, 500], (418, 500), {418, 500}):
        src = lookup_source({"BALDUR_MIDDLEWARE_CB_STATUS_CODES": value})
        assert src.get("BALDUR_MIDDLEWARE_CB_STATUS_CODES") == frozenset({418, 500})


def test_cfg1_env_dicts_are_json():
    """CFG-1: environment dicts (BALDUR_SERVICES, BALDUR_DOMAIN_MAPPING) are JSON objects."""
    src = env_source(
        BALDUR_SERVICES='{"payments": {"failure_threshold": 2, "recovery_timeout": 0.5}}',
        BALDUR_DOMAIN_MAPPING='{"/api/pay": "payments", "/api": "api"}',
    )
    assert src.get("BALDUR_SERVICES") == {"payments": {"failure_threshold": 2, "recovery_timeout": 0.5}}
    assert src.get("BALDUR_DOMAIN_MAPPING") == {"/api/pay": "payments", "/api": "api"}


def test_cfg1_env_json_list_of_rules():
    """CFG-1: BALDUR_RATE_LIMIT_RULES in the environment is a JSON array of objects."""
    src = env_source(BALDUR_RATE_LIMIT_RULES='[{"path": "/api", "rate": "10/m", "key": "ip"}]')
    assert src.get("BALDUR_RATE_LIMIT_RULES") == [{"path": "/api", "rate": "10/m", "key": "ip"}]


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        ("false", False),
        ("0", False),
        ("no", False),
        ("Off", False),
        ("", False),
    ],
)
def test_cfg1_env_booleans(raw, expected):
    """CFG-1: environment booleans read true/false, 1/0, yes/no, on/off in any case."""
    assert env_source(BALDUR_DRY_RUN=raw).get("BALDUR_DRY_RUN") is expected


# CB-15 makes the time window's span the one whole-seconds knob (see test_cb15_* below)
WHOLE_SECONDS = {"BALDUR_CB_SLIDING_WINDOW_SECONDS"}


@pytest.mark.parametrize(
    "name",
    [
        *sorted(n for n in SPEC_DEFAULTS if n.endswith("_SECONDS") and n not in WHOLE_SECONDS),
        "BALDUR_CB_RECOVERY_TIMEOUT",
        "BALDUR_CB_RECOVERY_TIMEOUT_MAX",
    ],
)
def test_cfg3_seconds_knobs_accept_floats(name):
    """CFG-3: every *_SECONDS value (but the time window's whole seconds, CB-15) and the recovery
    timeout and its cap accept fractions, from env and settings."""
    assert env_source(**{name: "1.5"}).get(name) == 1.5
    assert lookup_source({name: 1.5}).get(name) == 1.5


def test_cfg1_log_level_accepts_names_and_numbers():
    """CFG-1: the log level reads a name in any case or the logging module's number."""
    assert env_source(BALDUR_EVENT_LOGGING_CB_LOG_LEVEL="info").get("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL") == "INFO"
    assert lookup_source({"BALDUR_EVENT_LOGGING_CB_LOG_LEVEL": 40}).get("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL") == "ERROR"


# ------------------------------------------------------------------- precedence


def test_cfg1_breaker_precedence_per_call_over_services_over_global():
    """CFG-1: per-call override > BALDUR_SERVICES[service] > global setting, key by key."""
    src = env_source(
        BALDUR_CB_FAILURE_THRESHOLD="7",
        BALDUR_CB_RECOVERY_TIMEOUT="30",
        BALDUR_SERVICES='{"pay": {"failure_threshold": 3, "recovery_timeout": 2.5}}',
    )
    other = build_config("other", {}, src)
    assert (other.failure_threshold, other.recovery_timeout) == (7, 30)
    pay = build_config("pay", {}, src)
    assert (pay.failure_threshold, pay.recovery_timeout) == (3, 2.5)
    pay_call = build_config("pay", validate_overrides("pay", {"failure_threshold": 2}), src)
    assert (pay_call.failure_threshold, pay_call.recovery_timeout) == (2, 2.5)
    assert pay_call.half_open_max_calls == 3  # default where nobody said anything


def test_cfg1_build_config_carries_global_knobs():
    """CFG-1: the breaker configuration carries the global lists and switches too."""
    src = env_source(
        BALDUR_MIDDLEWARE_CB_STATUS_CODES="418",
        BALDUR_DRY_RUN="yes",
        BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES="2",
        BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS="7.5",
    )
    cfg = build_config("svc", {}, src)
    assert isinstance(cfg, BreakerConfig)
    assert cfg.failure_codes == frozenset({418})
    assert cfg.rate_limit_codes == frozenset({429})
    assert cfg.dry_run is True
    assert cfg.default_ttl_minutes == 2
    assert cfg.probe_lease == 7.5


def test_cfg1_default_minimum_calls_follows_a_narrower_window():
    """CFG-1/CB-3: a window narrowed below the *default* minimum_calls lowers the gate to the window."""
    cfg = build_config("svc", validate_overrides("svc", {"sliding_window_size": 4}), env_source())
    assert (cfg.sliding_window_size, cfg.minimum_calls) == (4, 4)
    cfg = build_config("svc", {}, env_source(BALDUR_CB_SLIDING_WINDOW_SIZE="6"))
    assert (cfg.sliding_window_size, cfg.minimum_calls) == (6, 6)


def test_cfg1_global_minimum_calls_follows_a_more_specific_window():
    """CFG-1: a per-service or per-call window below a global minimum_calls lowers the gate."""
    src = env_source(BALDUR_CB_MINIMUM_CALLS="20", BALDUR_SERVICES='{"a": {"sliding_window_size": 8}}')
    assert build_config("a", {}, src).minimum_calls == 8
    assert build_config("b", validate_overrides("b", {"sliding_window_size": 5}), src).minimum_calls == 5


# ------------------------------------------------------------------------- CFG-3

BAD_ENV = [
    # (knob, raw environment value)
    ("BALDUR_CB_FAILURE_THRESHOLD", "abc"),
    ("BALDUR_CB_FAILURE_THRESHOLD", ""),
    ("BALDUR_CB_FAILURE_THRESHOLD", "0"),
    ("BALDUR_CB_FAILURE_THRESHOLD", "-3"),
    ("BALDUR_CB_FAILURE_THRESHOLD", "2.5"),
    ("BALDUR_CB_FAILURE_THRESHOLD", "true"),
    ("BALDUR_CB_FAILURE_THRESHOLD", "nan"),
    ("BALDUR_CB_FAILURE_THRESHOLD", "inf"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "-1"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "100.5"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "NaN"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "-inf"),
    ("BALDUR_CB_SLIDING_WINDOW_SIZE", "0"),
    ("BALDUR_CB_MINIMUM_CALLS", "0"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", "0"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", "-1"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", "nan"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", "Infinity"),
    ("BALDUR_CB_HALF_OPEN_MAX_CALLS", "0"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "0"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "-5"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "1441"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "nan"),
    ("BALDUR_STATE_BACKEND", "mongo"),
    ("BALDUR_STATE_BACKEND", ""),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "500,abc"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "[500,"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "[700]"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "99"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "[true]"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", '{"500": 1}'),
    ("BALDUR_MIDDLEWARE_RATE_LIMIT_CODES", "429.5"),
    ("BALDUR_REDIS_URL", "http://localhost:6379/0"),
    ("BALDUR_REDIS_URL", "redis://localhost:port/0"),
    ("BALDUR_REDIS_URL", "redis://"),
    ("BALDUR_REDIS_URL", "localhost:6379"),
    ("BALDUR_REDIS_URL", "redis://localhost:6379/zero"),
    ("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS", "0"),
    ("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS", "-2"),
    ("BALDUR_DRY_RUN", "maybe"),
    ("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL", "LOUD"),
    ("BALDUR_SERVICES", "{"),
    ("BALDUR_SERVICES", "[1, 2]"),
    # nested entries: the message names the exact place and value instead of the whole JSON
    ("BALDUR_SERVICES", '{"pay": 5}', "'pay'"),
    ("BALDUR_SERVICES", '{"pay": {"failure_threshold": 0}}', "['pay']['failure_threshold']=0"),
    ("BALDUR_SERVICES", '{"pay": {"failure_threshold": true}}', "['pay']['failure_threshold']=True"),
    ("BALDUR_SERVICES", '{"pay": {"recovery_timeout": -1}}', "['pay']['recovery_timeout']=-1"),
    ("BALDUR_SERVICES", '{"": {}}', "'' is not a breaker name: it must not be empty"),
    ("BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO", "101"),
]


@pytest.mark.parametrize("case", BAD_ENV, ids=lambda case: "=".join(case[:2]))
def test_cfg3_bad_env_value_is_config_error_naming_setting_and_value(case):
    """CFG-3: a bad environment value raises ConfigError naming the setting and the value."""
    name, raw = case[:2]
    fragment = case[2] if len(case) > 2 else raw
    src = env_source(**{name: raw})
    with pytest.raises(ConfigError) as info:
        src.get(name)
    message = str(info.value)
    assert name in message
    assert fragment in message
    assert isinstance(info.value, BaldurError) and isinstance(info.value, ValueError)


BAD_SETTING = [
    ("BALDUR_CB_FAILURE_THRESHOLD", True),
    ("BALDUR_CB_FAILURE_THRESHOLD", "5"),
    ("BALDUR_CB_FAILURE_THRESHOLD", 0),
    ("BALDUR_CB_FAILURE_THRESHOLD", 2.5),
    ("BALDUR_CB_FAILURE_THRESHOLD", float("nan")),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", False),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", float("inf")),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", 100.01),
    ("BALDUR_CB_RECOVERY_TIMEOUT", True),
    ("BALDUR_CB_RECOVERY_TIMEOUT", float("-inf")),
    ("BALDUR_CB_RECOVERY_TIMEOUT", 0),
    ("BALDUR_CB_SLIDING_WINDOW_SIZE", None),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", True),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", 1440.5),
    ("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS", 0.0),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "500,502"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", [500, "x"]),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", 500),
    ("BALDUR_REDIS_URL", 6379),
    ("BALDUR_DRY_RUN", "yes"),
    ("BALDUR_SERVICES", []),
    ("BALDUR_CB_RECOVERY_TIMEOUT", 10**400),  # an int no float can hold: ConfigError, not OverflowError
]


@pytest.mark.parametrize("name,value", BAD_SETTING, ids=lambda v: repr(v))
def test_cfg3_bad_setting_value_is_config_error_naming_setting_and_value(name, value):
    """CFG-3: a bad (Django-style) setting raises ConfigError naming the setting and repr(value);
    booleans where numbers are due, strings where numbers are due, NaN and infinities included."""
    src = lookup_source({name: value})
    with pytest.raises(ConfigError) as info:
        src.get(name)
    assert name in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "name,raw",
    [
        ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "0"),
        ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "100"),
        ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "1440"),
        ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "0.5"),
        ("BALDUR_CB_FAILURE_THRESHOLD", "5.0"),
        ("BALDUR_REDIS_URL", "redis://:secret@cache.internal:6380/3"),
        ("BALDUR_REDIS_URL", "rediss://cache.internal"),
        ("BALDUR_REDIS_URL", "unix:///tmp/redis.sock"),
        ("BALDUR_REDIS_URL", ""),
        ("BALDUR_STATE_BACKEND", "Redis"),
    ],
)
def test_cfg3_boundary_values_that_are_valid(name, raw):
    """CFG-3: the edges the requirement allows (rate 0 and 100, TTL 1440, fractions, URLs) are accepted."""
    env_source(**{name: raw}).get(name)


def test_cfg3_rate_zero_is_allowed_and_disables_the_rate_trigger(clock, monkeypatch):
    """CFG-3/CB-3: failure_rate_threshold 0 is valid and turns the rate trigger off."""
    monkeypatch.setenv("BALDUR_CB_FAILURE_RATE_THRESHOLD", "0")
    settings.reset()
    breaker = registry.get("rate-zero", {"failure_threshold": 1000, "sliding_window_size": 4, "minimum_calls": 4})
    for _ in range(20):
        breaker.record_failure(breaker.acquire())
    assert breaker.state is baldur.CircuitState.CLOSED


def test_cfg3_redis_url_error_never_shows_the_password():
    """CFG-3/OP-8 habit: a malformed Redis URL is named in the error, with its password masked."""
    src = env_source(BALDUR_REDIS_URL="redis://user:hunter2@cache:notaport/0")
    with pytest.raises(ConfigError) as info:
        src.get("BALDUR_REDIS_URL")
    assert "BALDUR_REDIS_URL" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert "cache:notaport" in str(info.value)


def test_cfg3_unknown_services_key_names_it_and_the_closest_key():
    """CFG-3: an unknown key in BALDUR_SERVICES is a ConfigError naming the setting, the service,
    the key and the key it most likely meant."""
    src = env_source(BALDUR_SERVICES='{"pay": {"failure_treshold": 3}}')
    with pytest.raises(ConfigError) as info:
        src.get("BALDUR_SERVICES")
    message = str(info.value)
    assert "BALDUR_SERVICES" in message and "pay" in message
    assert "failure_treshold" in message
    assert "failure_threshold" in message.replace("failure_treshold", "")


def test_cfg3_services_entry_cannot_set_unknown_things():
    """CFG-3, CB-15..CB-18: only the breaker knobs (the CB-15..CB-17 keys included) and the
    CB-18 predicates may appear in BALDUR_SERVICES; a predicate must look like a dotted path."""
    assert set(SERVICE_KEYS) == {
        "failure_threshold",
        "failure_rate_threshold",
        "sliding_window_size",
        "minimum_calls",
        "recovery_timeout",
        "half_open_max_calls",
        "sliding_window_type",
        "sliding_window_seconds",
        "recovery_backoff_factor",
        "recovery_timeout_max",
        "slow_call_duration",
        "slow_call_rate_threshold",
        # RS-8: the outbound stages' knobs
        "honor_retry_after",
        "max_concurrent_calls",
        "max_wait",
        "bulkhead_scope",
        "retry_budget_ratio",
        "retry_budget_min_per_second",
        "retry_budget_scope",
        "adaptive_throttling_k",
        "adaptive_throttling_window",
    }
    assert set(LOCAL_KEYS) == {"deadline"}  # RS-8: a per-breaker key with no global setting
    with pytest.raises(ConfigError, match="ignore_exceptions"):  # not a dotted path
        lookup_source({"BALDUR_SERVICES": {"pay": {"ignore_exceptions": ["KeyError"]}}}).get("BALDUR_SERVICES")
    with pytest.raises(ConfigError, match="ignore_exceptionz"):
        lookup_source({"BALDUR_SERVICES": {"pay": {"ignore_exceptionz": []}}}).get("BALDUR_SERVICES")


def test_cfg3_misspelt_knob_name_has_a_closest_known_one():
    """CFG-3: a misspelt BALDUR_* name maps to the knob it most likely meant."""
    assert closest_knob("BALDUR_CB_FAILURE_TRESHOLD") == "BALDUR_CB_FAILURE_THRESHOLD"
    assert closest_knob("BALDUR_DRYRUN") == "BALDUR_DRY_RUN"
    assert closest_knob("SOMETHING_ELSE_ENTIRELY_XYZ") is None


def test_cfg3_minimum_calls_above_window_per_call():
    """CFG-3: a per-call minimum_calls above the window is a ConfigError naming both values."""
    with pytest.raises(ConfigError) as info:
        baldur.circuit_breaker("min-above", minimum_calls=20, sliding_window_size=10)
    message = str(info.value)
    assert "minimum_calls=20" in message and "sliding_window_size=10" in message and "min-above" in message
    assert registry.get("min-above", create=False) is None  # nothing registered


def test_cfg3_minimum_calls_above_window_in_services_entry():
    """CFG-3: the same inside one BALDUR_SERVICES entry, or a service minimum above the global window."""
    src = env_source(
        BALDUR_SERVICES='{"a": {"minimum_calls": 20, "sliding_window_size": 10}, "b": {"minimum_calls": 200}}'
    )
    with pytest.raises(ConfigError, match="minimum_calls=20"):
        build_config("a", {}, src)
    with pytest.raises(ConfigError, match="minimum_calls=200"):
        build_config("b", {}, src)


def test_cfg3_minimum_calls_above_window_globally(monkeypatch):
    """CFG-3: a global minimum_calls above the global (or default) window is a ConfigError in the core,
    not a silent clamp."""
    with pytest.raises(ConfigError) as info:
        build_config("svc", {}, env_source(BALDUR_CB_MINIMUM_CALLS="200"))
    assert "minimum_calls=200" in str(info.value) and "BALDUR_CB_MINIMUM_CALLS" in str(info.value)
    with pytest.raises(ConfigError):
        build_config("svc", {}, env_source(BALDUR_CB_MINIMUM_CALLS="20", BALDUR_CB_SLIDING_WINDOW_SIZE="10"))
    monkeypatch.setenv("BALDUR_CB_MINIMUM_CALLS", "500")
    settings.reset()
    with pytest.raises(ConfigError, match="minimum_calls=500"):
        baldur.get_breaker("global-min")


BAD_OVERRIDES = [
    ("failure_threshold", 0),
    ("failure_threshold", True),
    ("failure_threshold", 2.5),
    ("failure_threshold", "3"),
    ("failure_threshold", float("nan")),
    ("failure_rate_threshold", 101),
    ("failure_rate_threshold", -0.1),
    ("failure_rate_threshold", float("nan")),
    ("sliding_window_size", 0),
    ("minimum_calls", 0),
    ("recovery_timeout", 0),
    ("recovery_timeout", -1.5),
    ("recovery_timeout", float("inf")),
    ("recovery_timeout", False),
    ("half_open_max_calls", 0),
    ("half_open_max_calls", True),
]


@pytest.mark.parametrize("arg,value", BAD_OVERRIDES, ids=lambda v: repr(v))
@pytest.mark.parametrize("form", ["circuit_breaker", "protected", "aprotected", "protect"])
def test_cfg3_bad_per_call_override_names_argument_and_value(form, arg, value):
    """CFG-3: a bad per-call override is a ConfigError at decoration time naming the argument,
    the value and the breaker; nothing is registered and nothing is called."""
    called = []
    with pytest.raises(ConfigError) as info:
        if form == "protect":
            baldur.protect("bad-override", lambda: called.append(1), **{arg: value})
        else:
            getattr(baldur, form)("bad-override", **{arg: value})
    message = str(info.value)
    assert arg in message and repr(value) in message and "bad-override" in message
    assert called == []
    assert registry.get("bad-override", create=False) is None


@pytest.mark.parametrize("value", [(42,), "KeyError", (KeyError, "x"), KeyError("x")], ids=repr)
def test_cfg3_bad_ignore_exceptions(value):
    """CFG-3: ignore_exceptions must be exception types; anything else is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="ignore_exceptions"):
        baldur.circuit_breaker("bad-ignore", ignore_exceptions=value)


def test_cfg3_unknown_per_call_override_is_named():
    """CFG-3: a misspelt override keyword is a ConfigError naming it (not silently ignored)."""
    with pytest.raises(ConfigError, match="failure_treshold"):
        baldur.circuit_breaker("typo", failure_treshold=3)
    with pytest.raises(ConfigError, match="bogus"):
        baldur.protect("typo", lambda: 1, bogus=1)


def test_cfg3_float_recovery_timeout_per_call_is_accepted(clock):
    """CFG-3: recovery_timeout accepts fractions of a second."""
    breaker = registry.get("float-rt", {"recovery_timeout": 0.25, "failure_threshold": 1})
    assert breaker.config.recovery_timeout == 0.25
    breaker.record_failure(breaker.acquire())
    clock.advance(0.25)
    assert breaker.state is baldur.CircuitState.HALF_OPEN


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 2.0},
        {"backoff_initial": -0.1},
        {"backoff_initial": float("nan")},
        {"backoff_max": float("inf")},
        {"backoff_multiplier": 0.5},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"budget_seconds": 0},
        {"budget_seconds": -1},
        {"budget_seconds": float("inf")},
        {"retry_on": (42,)},
        {"retry_on": "ValueError"},
    ],
    ids=repr,
)
def test_cfg3_bad_retry_policy_is_config_error_naming_the_field(kwargs):
    """CFG-3/FAC-3: a RetryPolicy field out of range is a ConfigError naming the field and value."""
    ((field, value),) = kwargs.items()
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**kwargs)
    assert field in str(info.value)
    assert repr(value) in str(info.value)


def test_cfg3_bad_retry_argument():
    """CFG-3: retry= accepts only True/False/None or a RetryPolicy."""
    with pytest.raises(ConfigError, match="retry="):
        baldur.protected("bad-retry", retry="yes")
    with pytest.raises(ConfigError, match="retry="):
        baldur.protect("bad-retry", lambda: 1, retry=3)


def test_cfg3_non_callable_fallback():
    """CFG-3: a fallback that cannot be called is refused at decoration time."""
    with pytest.raises(ConfigError, match="fallback"):
        baldur.protected("bad-fallback", fallback="queued")


def test_cfg3_parse_helper_uses_the_same_rows():
    """CFG-3: knobs.parse() parses a knob's default or a given value with its row's parser."""
    assert parse("BALDUR_CB_FAILURE_THRESHOLD") == 5
    assert parse("BALDUR_CB_FAILURE_THRESHOLD", "8", from_env=True) == 8
    with pytest.raises(ConfigError):
        parse("BALDUR_CB_FAILURE_THRESHOLD", math.nan)


# ------------------------------------------------------------- one row per knob (CFG-1)


def test_cfg1_every_table_about_knobs_is_derived_from_the_rows():
    """CFG-1: check ids, per-call/BALDUR_SERVICES keys, secrets and reserved knobs are read off the
    Knob rows; the tables other modules import are those derived values."""
    from baldur_django.core import config as config_module
    from baldur_django.core.decorators import _OVERRIDE_NAMES

    rows = list(KNOBS.values())
    assert all(isinstance(row, Knob) for row in rows)
    assert {row.name: row.check_id for row in rows} == CHECK_IDS
    assert {row.key: row.name for row in rows if row.key} == OVERRIDE_KEYS
    assert config_module.OVERRIDE_KEYS is OVERRIDE_KEYS
    assert {row.key: row.parse for row in rows if row.key} == SERVICE_KEYS
    assert set(_OVERRIDE_NAMES) == set(OVERRIDE_KEYS) | set(LOCAL_KEYS) | {
        "ignore_exceptions",
        "failure_predicate",
        "result_predicate",
    }
    assert {"BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL"} == SECRETS
    assert tuple(row.name for row in rows if row.reserved) == RESERVED
    assert len({row.key for row in rows if row.key}) == len(OVERRIDE_KEYS)  # no key used twice


def test_cfg3_every_row_says_what_it_accepts():
    """CFG-3: every knob can tell a user what a valid value looks like (hints and docs)."""
    for row in KNOBS.values():
        text = row.accepted_values()
        assert text and text[0].isupper() and text.endswith("."), row.name
    assert "whole number" in KNOBS["BALDUR_CB_SLIDING_WINDOW_SECONDS"].accepted_values()
    assert "'count' or 'time'" in KNOBS["BALDUR_CB_SLIDING_WINDOW_TYPE"].accepted_values()
    assert all(key in KNOBS["BALDUR_SERVICES"].accepted_values() for key in OVERRIDE_KEYS)


def test_cfg1_redis_cluster_is_a_boolean_knob():
    """CFG-1 (section 10), ST-2: BALDUR_REDIS_CLUSTER is a known boolean, False by default, built (not reserved)."""
    assert env_source().get("BALDUR_REDIS_CLUSTER") is False
    assert env_source(BALDUR_REDIS_CLUSTER="true").get("BALDUR_REDIS_CLUSTER") is True
    with pytest.raises(ConfigError, match="BALDUR_REDIS_CLUSTER"):
        lookup_source({"BALDUR_REDIS_CLUSTER": "yes"}).get("BALDUR_REDIS_CLUSTER")
    assert not KNOBS["BALDUR_REDIS_CLUSTER"].reserved


# ------------------------------------------------------- CB-15..CB-17 configuration

# key -> (global setting, value as global, value in BALDUR_SERVICES, value per call)
NEW_KEYS = {
    "sliding_window_type": ("BALDUR_CB_SLIDING_WINDOW_TYPE", "time", "count", "time"),
    "sliding_window_seconds": ("BALDUR_CB_SLIDING_WINDOW_SECONDS", 30, 20, 10),
    "recovery_backoff_factor": ("BALDUR_CB_RECOVERY_BACKOFF_FACTOR", 1.5, 2.0, 3.0),
    "recovery_timeout_max": ("BALDUR_CB_RECOVERY_TIMEOUT_MAX", 900.0, 800.0, 700.0),
    "slow_call_duration": ("BALDUR_CB_SLOW_CALL_DURATION_SECONDS", 2.5, 1.0, 0.25),
    "slow_call_rate_threshold": ("BALDUR_CB_SLOW_CALL_RATE_THRESHOLD", 90.0, 60.0, 30.0),
}


def test_cb15_cb16_cb17_breaker_config_defaults():
    """CB-15, CB-16, CB-17: a breaker nobody configured gets the section 10 defaults (all off)."""
    cfg = build_config("plain", {}, env_source())
    assert cfg.sliding_window_type == "count"
    assert cfg.sliding_window_seconds == 60 and isinstance(cfg.sliding_window_seconds, int)
    assert cfg.recovery_backoff_factor == 1.0
    assert cfg.recovery_timeout_max == 600
    assert cfg.slow_call_duration == 0
    assert cfg.slow_call_rate_threshold == 100.0


@pytest.mark.parametrize("key", list(NEW_KEYS))
def test_cfg1_cb15_cb16_cb17_precedence_per_call_over_services_over_global(key):
    """CFG-1, CB-15..CB-17: each new key resolves per call > BALDUR_SERVICES > global setting > default."""
    knob, global_value, service_value, call_value = NEW_KEYS[key]
    src = lookup_source({knob: global_value, "BALDUR_SERVICES": {"svc": {key: service_value}}})
    assert getattr(build_config("other", {}, src), key) == global_value
    assert getattr(build_config("svc", {}, src), key) == service_value
    assert getattr(build_config("svc", validate_overrides("svc", {key: call_value}), src), key) == call_value
    assert getattr(build_config("svc", {}, env_source()), key) == parse(knob)


@pytest.mark.parametrize("key", list(NEW_KEYS))
def test_cfg1_cb15_cb16_cb17_keys_are_accepted_from_the_environment(key):
    """CFG-1: the new keys come from a JSON BALDUR_SERVICES and the globals from env variables."""
    knob, global_value, service_value, _ = NEW_KEYS[key]
    src = env_source(**{knob: str(global_value), "BALDUR_SERVICES": json.dumps({"svc": {key: service_value}})})
    assert getattr(build_config("svc", {}, src), key) == service_value
    assert getattr(build_config("other", {}, src), key) == global_value
    assert src.source(knob) == "env"


def test_cb15_cb16_cb17_per_call_overrides_reach_the_breaker():
    """CB-15..CB-17: circuit_breaker() and protect() take the new overrides and the breaker's
    configuration carries them."""
    overrides = {key: values[3] for key, values in NEW_KEYS.items()}

    @baldur.circuit_breaker("new-knobs", **overrides)
    def call():
        return 1

    cfg = call.breaker.config
    assert {key: getattr(cfg, key) for key in NEW_KEYS} == overrides
    assert baldur.protect("new-knobs-2", lambda: 2, slow_call_duration=0.5, sliding_window_seconds=5) == 2
    cfg = registry.get("new-knobs-2", create=False).config
    assert (cfg.slow_call_duration, cfg.sliding_window_seconds) == (0.5, 5)


BAD_NEW = [
    # (key, bad value) - CB-15: the window's span is a whole number of seconds >= 1
    ("sliding_window_seconds", 1.5),
    ("sliding_window_seconds", 0),
    ("sliding_window_seconds", -5),
    ("sliding_window_seconds", True),
    ("sliding_window_seconds", "x"),
    ("sliding_window_seconds", "60"),
    ("sliding_window_seconds", float("inf")),
    ("sliding_window_seconds", float("nan")),
    ("sliding_window_type", "sliding"),
    ("sliding_window_type", 1),
    ("sliding_window_type", True),
    ("recovery_backoff_factor", 0.5),
    ("recovery_backoff_factor", 0),
    ("recovery_backoff_factor", True),
    ("recovery_backoff_factor", float("inf")),
    ("recovery_timeout_max", 0),
    ("recovery_timeout_max", -1),
    ("recovery_timeout_max", False),
    ("recovery_timeout_max", float("nan")),
    ("slow_call_duration", -0.1),
    ("slow_call_duration", "1s"),
    ("slow_call_duration", True),
    ("slow_call_duration", float("inf")),
    ("slow_call_rate_threshold", 100.5),
    ("slow_call_rate_threshold", -1),
    ("slow_call_rate_threshold", False),
]


@pytest.mark.parametrize("key,value", BAD_NEW, ids=repr)
@pytest.mark.parametrize("form", ["circuit_breaker", "protect", "BALDUR_SERVICES"])
def test_cfg3_bad_cb15_cb16_cb17_override_names_key_and_value(form, key, value):
    """CFG-3, CB-15..CB-17: a bad new per-call override or BALDUR_SERVICES value is a ConfigError
    naming the key and the value; nothing is registered and nothing is called."""
    called = []
    with pytest.raises(ConfigError) as info:
        if form == "circuit_breaker":
            baldur.circuit_breaker("bad-new", **{key: value})
        elif form == "protect":
            baldur.protect("bad-new", lambda: called.append(1), **{key: value})
        else:
            lookup_source({"BALDUR_SERVICES": {"bad-new": {key: value}}}).get("BALDUR_SERVICES")
    message = str(info.value)
    assert key in message and repr(value) in message and "bad-new" in message
    assert called == []
    assert registry.get("bad-new", create=False) is None


@pytest.mark.parametrize("key,value", BAD_NEW, ids=repr)
def test_cfg3_bad_cb15_cb16_cb17_global_setting_names_setting_and_value(key, value):
    """CFG-3, CB-15..CB-17: the same values as global Django-style settings fail naming the setting."""
    knob = OVERRIDE_KEYS[key]
    with pytest.raises(ConfigError) as info:
        lookup_source({knob: value}).get(knob)
    assert knob in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("raw", ["1.5", "0", "-1", "x", "true", "nan", "inf", ""])
def test_cb15_window_seconds_from_the_environment_must_be_whole(raw):
    """CB-15, CFG-3: BALDUR_CB_SLIDING_WINDOW_SECONDS from the environment is a whole number >= 1."""
    with pytest.raises(ConfigError) as info:
        env_source(BALDUR_CB_SLIDING_WINDOW_SECONDS=raw).get("BALDUR_CB_SLIDING_WINDOW_SECONDS")
    assert "BALDUR_CB_SLIDING_WINDOW_SECONDS" in str(info.value) and repr(raw) in str(info.value)


@pytest.mark.parametrize("raw, expected", [("1", 1), ("60", 60), ("60.0", 60), (" 5 ", 5)])
def test_cb15_window_seconds_accepts_whole_numbers(raw, expected):
    """CB-15: a whole number of seconds (written 60 or 60.0) is an int >= 1."""
    value = env_source(BALDUR_CB_SLIDING_WINDOW_SECONDS=raw).get("BALDUR_CB_SLIDING_WINDOW_SECONDS")
    assert value == expected and type(value) is int
    assert lookup_source({"BALDUR_CB_SLIDING_WINDOW_SECONDS": 30.0}).get("BALDUR_CB_SLIDING_WINDOW_SECONDS") == 30


@pytest.mark.parametrize(
    "key,value",
    [
        ("slow_call_duration", 0),
        ("slow_call_rate_threshold", 0),
        ("slow_call_rate_threshold", 100),
        ("recovery_backoff_factor", 1),
        ("sliding_window_seconds", 1),
        ("sliding_window_type", "TIME"),
    ],
)
def test_cfg3_cb15_cb16_cb17_boundary_values_are_valid(key, value):
    """CFG-3: the edges are allowed: 0 turns the slow-call trigger off, factor 1 turns backoff off."""
    checked = validate_overrides("edge", {key: value})
    assert build_config("edge", checked, env_source()) is not None
    assert validate_overrides("edge", {"sliding_window_type": "TIME"}) == {"sliding_window_type": "time"}


def test_cb15_time_window_does_not_bound_minimum_calls_by_the_window_size():
    """CB-15: with the time window, minimum_calls counts outcomes over its seconds, so a value above
    sliding_window_size is neither an error nor lowered to the size."""
    cfg = build_config(
        "t",
        validate_overrides("t", {"sliding_window_type": "time", "sliding_window_size": 10, "minimum_calls": 50}),
        env_source(),
    )
    assert cfg.minimum_calls == 50
    cfg = build_config("t", {}, env_source(BALDUR_CB_SLIDING_WINDOW_TYPE="time", BALDUR_CB_SLIDING_WINDOW_SIZE="4"))
    assert cfg.minimum_calls == 10  # the default gate is not lowered to an unused size
    with pytest.raises(ConfigError, match="minimum_calls=50"):  # the count window still refuses it
        build_config("c", validate_overrides("c", {"sliding_window_size": 10, "minimum_calls": 50}), env_source())


@pytest.mark.parametrize(
    "overrides, environ, named",
    [
        ({"recovery_timeout": 30, "recovery_timeout_max": 10}, {}, "per-call argument"),
        ({"recovery_timeout_max": 10}, {}, "default of BALDUR_CB_RECOVERY_TIMEOUT"),
        ({"recovery_timeout_max": 10}, {"BALDUR_CB_RECOVERY_TIMEOUT": "30"}, "from BALDUR_CB_RECOVERY_TIMEOUT"),
        (
            {},
            {"BALDUR_CB_RECOVERY_TIMEOUT": "30", "BALDUR_CB_RECOVERY_TIMEOUT_MAX": "10"},
            "BALDUR_CB_RECOVERY_TIMEOUT_MAX",
        ),
        ({}, {"BALDUR_SERVICES": '{"svc": {"recovery_timeout": 30, "recovery_timeout_max": 10}}'}, "BALDUR_SERVICES"),
        (
            {},
            {"BALDUR_SERVICES": '{"svc": {"recovery_timeout_max": 10}}', "BALDUR_CB_RECOVERY_TIMEOUT": "30"},
            "BALDUR_SERVICES",
        ),
    ],
)
def test_cb16_recovery_cap_below_the_timeout_at_the_same_or_a_more_specific_level_is_an_error(
    overrides, environ, named
):
    """CB-16, CFG-3: recovery_timeout_max below recovery_timeout, when the cap was given at the same
    level as the timeout or more specifically, is a ConfigError naming both values and their origins."""
    with pytest.raises(ConfigError) as info:
        build_config("svc", validate_overrides("svc", overrides), env_source(**environ))
    message = str(info.value)
    assert "recovery_timeout_max=10" in message and "recovery_timeout=" in message and "'svc'" in message
    assert named in message


def test_cb16_recovery_cap_follows_a_timeout_given_more_specifically():
    """CB-16: a recovery_timeout raised for one breaker (or service) above a global or default cap
    raises the cap to it, so an open never lasts less than the timeout."""
    cfg = build_config("a", validate_overrides("a", {"recovery_timeout": 900}), env_source())
    assert (cfg.recovery_timeout, cfg.recovery_timeout_max) == (900, 900)
    src = env_source(BALDUR_CB_RECOVERY_TIMEOUT_MAX="120", BALDUR_SERVICES='{"b": {"recovery_timeout": 300}}')
    cfg = build_config("b", {}, src)
    assert (cfg.recovery_timeout, cfg.recovery_timeout_max) == (300, 300)
    assert build_config("other", {}, src).recovery_timeout_max == 120
    cfg = build_config("c", {}, env_source(BALDUR_CB_RECOVERY_TIMEOUT="900"))  # default cap 600 follows
    assert cfg.recovery_timeout_max == 900


def test_cb16_recovery_cap_below_timeout_registers_nothing():
    """CB-16, CFG-3: a contradictory per-call cap fails at decoration time; no breaker is registered."""
    with pytest.raises(ConfigError, match="recovery_timeout_max=5"):
        baldur.circuit_breaker("cap-below", recovery_timeout=20, recovery_timeout_max=5)
    assert registry.get("cap-below", create=False) is None


def test_cfg3_every_knob_has_a_check_id_of_its_own():
    """CFG-3: a check id names one setting, so a SILENCED_SYSTEM_CHECKS entry or a log search
    never covers two (two branches once gave their new settings the same ids)."""
    ids = [knob.check_id for knob in KNOBS.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in set(ids) if ids.count(i) > 1)
