"""System checks for BALDUR_* settings (CFG-3), the limiter's cache (IN-4) and deployment (ST-1)."""

from __future__ import annotations

import io
import math
import os
import re

import pytest
from django.core.checks import ERROR, WARNING, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from baldur_django.checks import KNOB_IDS, Codes, check_deployment, check_rate_limit_cache, check_settings
from baldur_django.conf import baldur_settings
from baldur_django.core.knobs import KNOBS, RESERVED

RATE_LIMIT_MW = "baldur_django.middleware.RateLimitMiddleware"
SECRET = "T0SECRET/B0SECRET/XyZSeCrEtToKeN"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No BALDUR_* variable from the developer's shell leaks into the checks."""
    for name in list(os.environ):
        if name.startswith("BALDUR_") and name != "BALDUR_TEST_DB":
            monkeypatch.delenv(name)
    baldur_settings.reset()
    return monkeypatch


def baldur_messages(messages):
    return [m for m in messages if m.id and m.id.startswith("baldur.")]


def only(messages, level=None):
    found = baldur_messages(messages)
    if level is not None:
        found = [m for m in found if m.level == level]
    assert len(found) == 1, [f"{m.id}: {m.msg}" for m in found]
    return found[0]


# ---------------------------------------------------------------- bad values (CFG-3)

BAD_VALUES = [
    # (setting, bad value, text the message must show for the value)
    ("BALDUR_CB_FAILURE_THRESHOLD", "five", "'five'"),  # non-numeric
    ("BALDUR_CB_FAILURE_THRESHOLD", True, "True"),  # boolean where a number is due
    ("BALDUR_CB_FAILURE_THRESHOLD", 0, "=0"),
    ("BALDUR_CB_FAILURE_THRESHOLD", 2.5, "=2.5"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", 100.5, "=100.5"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", -1, "=-1"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", math.nan, "nan"),
    ("BALDUR_CB_SLIDING_WINDOW_SIZE", 0, "=0"),
    ("BALDUR_CB_MINIMUM_CALLS", 0, "=0"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", 0, "=0"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", -5, "=-5"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", math.inf, "inf"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", False, "False"),
    ("BALDUR_CB_HALF_OPEN_MAX_CALLS", 0, "=0"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", 0, "=0"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", 1441, "=1441"),
    ("BALDUR_STATE_BACKEND", "mongodb", "'mongodb'"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", [500, "abc"], "'abc'"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", [700], "700"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "500,503", "'500,503'"),
    ("BALDUR_MIDDLEWARE_RATE_LIMIT_CODES", {"429": True}, "'429'"),
    ("BALDUR_REDIS_URL", "http://localhost:6379/0", "'http://localhost:6379/0'"),
    ("BALDUR_REDIS_URL", "redis://localhost:port/0", "'redis://localhost:port/0'"),
    ("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS", 0, "=0"),
    ("BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS", -1.0, "=-1.0"),
    ("BALDUR_EVENT_LOGGING_CB_LOG_LEVEL", "LOUD", "'LOUD'"),
    ("BALDUR_RATE_LIMIT_RULES", [{"path": "/api/", "rate": "lots"}], "lots"),
    ("BALDUR_DRY_RUN", "yes", "'yes'"),
    ("BALDUR_SERVICES", {"payments": {"failure_threshold": -1}}, "-1"),
    ("BALDUR_HEALTH_CRITICAL_SERVICES", "payments", "'payments'"),
    ("BALDUR_HEALTH_CRITICAL_SERVICES", ["payments", ""], "''"),
    ("BALDUR_HEALTH_DETAILS", "sometimes", "'sometimes'"),
    # RS-8: the outbound stages' knobs
    ("BALDUR_REQUEST_DEADLINE_SECONDS", 0, "=0"),
    ("BALDUR_REQUEST_DEADLINE_HEADER", "X Deadline", "'X Deadline'"),
    ("BALDUR_CB_HONOR_RETRY_AFTER", "maybe", "'maybe'"),
    ("BALDUR_BULKHEAD_MAX_CONCURRENT_CALLS", 0, "=0"),
    ("BALDUR_BULKHEAD_MAX_WAIT", -1, "=-1"),
    ("BALDUR_BULKHEAD_SCOPE", "cluster", "'cluster'"),
    ("BALDUR_BULKHEAD_LEASE_SECONDS", 0, "=0"),
    ("BALDUR_RETRY_BUDGET_RATIO", -0.1, "=-0.1"),
    ("BALDUR_RETRY_BUDGET_MIN_PER_SECOND", "ten", "'ten'"),
    ("BALDUR_RETRY_BUDGET_SCOPE", "host", "'host'"),
    ("BALDUR_ADAPTIVE_THROTTLING_K", 0.5, "=0.5"),
    ("BALDUR_ADAPTIVE_THROTTLING_WINDOW", 0, "=0"),
]


@pytest.mark.parametrize("name, value, shown", BAD_VALUES, ids=[f"{n}={v!r}" for n, v, _ in BAD_VALUES])
def test_cfg3_bad_setting_is_an_error_naming_setting_and_value_with_hint(name, value, shown):
    """CFG-3: each bad value is one baldur.E0xx Error whose message names the setting and the value, with a hint."""
    with override_settings(**{name: value}):
        message = only(check_settings(), ERROR)
    assert message.id == KNOB_IDS[name]
    assert re.fullmatch(r"baldur\.E(0\d\d|1[01]\d)", message.id)
    assert name in message.msg
    assert shown in message.msg
    assert message.hint and name in message.hint and "default" in message.hint


BAD_ENV = [
    ("BALDUR_CB_FAILURE_THRESHOLD", "abc"),
    ("BALDUR_CB_FAILURE_THRESHOLD", "true"),
    ("BALDUR_CB_FAILURE_RATE_THRESHOLD", "nan"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", "inf"),
    ("BALDUR_CB_RECOVERY_TIMEOUT", "0"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "500,fivehundred"),
    ("BALDUR_MIDDLEWARE_CB_STATUS_CODES", "[500, 503"),
    ("BALDUR_SERVICES", "{not json}"),
    ("BALDUR_STATE_BACKEND", "etcd"),
    ("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "2000"),
    ("BALDUR_DRY_RUN", "maybe"),
]


@pytest.mark.parametrize("name, raw", BAD_ENV, ids=[f"{n}={v}" for n, v in BAD_ENV])
def test_cfg3_bad_environment_variable_is_an_error_too(clean_env, name, raw):
    """CFG-3: a bad environment value is reported like a bad setting and says it came from the environment."""
    clean_env.setenv(name, raw)
    message = only(check_settings(), ERROR)
    assert message.id == KNOB_IDS[name]
    assert name in message.msg and raw in message.msg
    assert "environment variable" in message.msg and "environment variable" in message.hint


def test_cfg3_a_good_django_setting_hides_a_bad_environment_variable(clean_env):
    """CFG-1/CFG-3: the environment is not read (so not checked) when the Django setting is defined."""
    clean_env.setenv("BALDUR_CB_FAILURE_THRESHOLD", "abc")
    with override_settings(BALDUR_CB_FAILURE_THRESHOLD=4):
        assert baldur_messages(check_settings()) == []


def test_cfg3_rate_of_zero_is_allowed_and_disables_the_trigger():
    """CFG-3: a failure rate of 0 is valid (it turns the rate trigger off)."""
    with override_settings(BALDUR_CB_FAILURE_RATE_THRESHOLD=0, BALDUR_CB_SLOW_CALL_RATE_THRESHOLD=0):
        assert baldur_messages(check_settings()) == []


def test_cfg3_ttl_boundaries():
    """CFG-3: a TTL of 1440 minutes and fractions of a minute are valid."""
    for ttl in (1440, 0.5, 30):
        with override_settings(BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES=ttl):
            assert baldur_messages(check_settings()) == [], ttl


def unreserved(messages):
    """The messages but the reserved-knob warnings (W006)."""
    return [m for m in messages if m.id != Codes.RESERVED_SETTING]


def test_cfg3_every_seconds_knob_and_recovery_timeout_accept_floats(clean_env):
    """CFG-3: every *_SECONDS knob (but the time window's whole seconds, CB-15) and the recovery
    timeout accept floats, as settings and from the environment."""
    whole_seconds = {"BALDUR_CB_SLIDING_WINDOW_SECONDS"}
    names = [n for n in KNOBS if n.endswith("_SECONDS") and n not in whole_seconds] + ["BALDUR_CB_RECOVERY_TIMEOUT"]
    assert len(names) > 10
    # a reserved knob set (RS-8: BALDUR_BULKHEAD_LEASE_SECONDS) warns it has no effect yet
    with override_settings(**{n: 0.5 for n in names}):
        assert unreserved(baldur_messages(check_settings())) == []
        assert all(baldur_settings.get(n) == 0.5 for n in names)
    for n in names:
        clean_env.setenv(n, "1.25")
    baldur_settings.reset()
    assert unreserved(baldur_messages(check_settings())) == []
    assert all(baldur_settings.get(n) == 1.25 for n in names)


def test_cfg3_minimum_calls_set_above_window_is_an_error():
    """CFG-3: an explicit minimum_calls above sliding_window_size is baldur.E002."""
    with override_settings(BALDUR_CB_MINIMUM_CALLS=20, BALDUR_CB_SLIDING_WINDOW_SIZE=10):
        message = only(check_settings(), ERROR)
    assert message.id == Codes.MINIMUM_ABOVE_WINDOW
    assert "BALDUR_CB_MINIMUM_CALLS=20" in message.msg and "BALDUR_CB_SLIDING_WINDOW_SIZE=10" in message.msg
    assert message.hint


def test_cfg3_default_minimum_above_a_narrowed_window_is_a_warning():
    """CFG-3: narrowing the window below the default minimum_calls warns (the gate follows the window)."""
    with override_settings(BALDUR_CB_SLIDING_WINDOW_SIZE=5):
        message = only(check_settings())
    assert message.level == WARNING and message.id == Codes.MINIMUM_FOLLOWS_WINDOW
    assert "BALDUR_CB_MINIMUM_CALLS" in message.msg and "=5" in message.msg


def test_cfg3_service_minimum_above_its_window_is_an_error():
    """CFG-3: a BALDUR_SERVICES entry whose minimum_calls is above its window is baldur.E003."""
    services = {"pay": {"minimum_calls": 30, "sliding_window_size": 20}, "ok": {"sliding_window_size": 5}}
    with override_settings(BALDUR_SERVICES=services):
        message = only(check_settings(), ERROR)
    assert message.id == Codes.SERVICE_MINIMUM_ABOVE_WINDOW
    assert "BALDUR_SERVICES['pay']" in message.msg and "minimum_calls=30" in message.msg


def test_cfg3_unknown_key_in_services_names_the_closest_known_key():
    """CFG-3: an unknown key in BALDUR_SERVICES is an error naming the closest known key."""
    with override_settings(BALDUR_SERVICES={"payments": {"failure_treshold": 3}}):
        message = only(check_settings(), ERROR)
    assert message.id == KNOB_IDS["BALDUR_SERVICES"]
    assert "BALDUR_SERVICES" in message.msg and "'failure_treshold'" in message.msg
    assert "did you mean 'failure_threshold'" in message.msg
    assert "half_open_max_calls" in message.hint  # the hint lists the allowed keys


def test_cfg3_misspelt_django_setting_is_an_error_with_closest_known_name():
    """CFG-3: a misspelt BALDUR_* Django setting is an Error (check exits 1) naming the closest known
    setting, and the hint says how to silence it when another tool owns the name."""
    with override_settings(BALDUR_CB_FAILURE_TRESHOLD=3, BALDUR_SERVICE={}):
        found = [m for m in baldur_messages(check_settings()) if m.id == Codes.UNKNOWN_SETTING]
    texts = sorted(m.msg for m in found)
    assert len(found) == 2 and all(m.level == ERROR and m.is_serious() for m in found)
    assert all("SILENCED_SYSTEM_CHECKS" in m.hint and Codes.UNKNOWN_SETTING in m.hint for m in found)
    assert "BALDUR_CB_FAILURE_TRESHOLD; did you mean BALDUR_CB_FAILURE_THRESHOLD?" in texts[0]
    assert "BALDUR_SERVICE; did you mean BALDUR_SERVICES?" in texts[1]


def test_cfg3_unrelated_baldur_setting_is_an_error_without_a_suggestion():
    """CFG-3: an unknown BALDUR_* setting close to nothing is still an error (the value has no effect)."""
    with override_settings(BALDUR_WIDGETS=1):
        message = only(check_settings(), ERROR)
    assert message.id == Codes.UNKNOWN_SETTING and "BALDUR_WIDGETS" in message.msg and "did you mean" not in message.msg


def test_cfg3_misspelt_environment_variable_warns_with_closest_known_name(clean_env):
    """CFG-3: a misspelt BALDUR_* environment variable is a Warning naming the closest known knob."""
    clean_env.setenv("BALDUR_CB_RECOVERY_TIMOUT", "30")
    clean_env.setenv("BALDUR_TEST_SOMETHING_ELSE", "x")  # far from every knob: another tool's variable
    message = only(check_settings(), WARNING)
    assert message.id == Codes.UNKNOWN_ENV
    assert "BALDUR_CB_RECOVERY_TIMOUT" in message.msg and "did you mean BALDUR_CB_RECOVERY_TIMEOUT?" in message.msg
    assert "30" not in message.msg  # values of unknown names are never echoed


# ---------------------------------------------------------------- secrets (OP-8, CFG-3)


def _all_text(messages):
    return "\n".join(f"{m.msg}\n{m.hint or ''}" for m in messages)


def test_cfg3_invalid_webhook_url_is_reported_without_showing_it():
    """CFG-3/OP-8: a bad webhook URL is an error that names the setting but never shows the URL."""
    with override_settings(BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL=f"hooks.slack.com/services/{SECRET}"):
        messages = run_checks(include_deployment_checks=True)
        message = only(check_settings(), ERROR)
    assert message.id == KNOB_IDS["BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL"]
    assert "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL" in message.msg
    assert SECRET not in _all_text(messages) and "T0SECRET" not in _all_text(messages)


@pytest.mark.parametrize("value", [12345, ["https://hooks.slack.com/services/" + SECRET], "ftp://x/" + SECRET])
def test_cfg3_webhook_never_echoed_whatever_its_type(value):
    """CFG-3/OP-8: whatever the wrong type or scheme, the webhook value is not echoed."""
    with override_settings(BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL=value):
        message = only(check_settings(), ERROR)
    assert SECRET not in _all_text([message]) and "12345" not in message.msg


def test_cfg3_webhook_in_environment_or_misspelt_never_appears(clean_env):
    """CFG-3/OP-8: a valid webhook plus a misspelt webhook name, env or setting: the URL is in no message."""
    clean_env.setenv("BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL", f"https://hooks.slack.com/services/{SECRET}")
    clean_env.setenv("BALDUR_META_WATCHDOG_SLACK_WEBHOOK_UR", f"https://hooks.slack.com/services/{SECRET}")
    with override_settings(BALDUR_META_WATCHDOG_SLACK_WEBHOOK=f"https://hooks.slack.com/services/{SECRET}"):
        messages = run_checks(include_deployment_checks=True)
    ids = sorted(m.id for m in baldur_messages(messages))
    assert ids == sorted([Codes.UNKNOWN_SETTING, Codes.UNKNOWN_ENV, Codes.MEMORY_BACKEND])
    assert SECRET not in _all_text(messages)


def test_cfg3_redis_password_is_masked():
    """CFG-3: a malformed Redis URL is named, with its password masked."""
    with override_settings(BALDUR_REDIS_URL="redis://admin:hunter2@cache:99999/0"):
        message = only(check_settings(), ERROR)
    assert "BALDUR_REDIS_URL" in message.msg and "admin:***@cache:99999" in message.msg
    assert "hunter2" not in _all_text([message])


# ---------------------------------------------------------------- clean output

GOOD = {
    "BALDUR_CB_FAILURE_THRESHOLD": 3,
    "BALDUR_CB_FAILURE_RATE_THRESHOLD": 25.5,
    "BALDUR_CB_SLIDING_WINDOW_SIZE": 50,
    "BALDUR_CB_SLIDING_WINDOW_TYPE": "time",
    "BALDUR_CB_SLIDING_WINDOW_SECONDS": 30,  # whole seconds (CB-15)
    "BALDUR_CB_MINIMUM_CALLS": 5,
    "BALDUR_CB_RECOVERY_TIMEOUT": 12.5,
    "BALDUR_CB_HALF_OPEN_MAX_CALLS": 2,
    "BALDUR_CB_RECOVERY_BACKOFF_FACTOR": 2.0,
    "BALDUR_CB_RECOVERY_TIMEOUT_MAX": 300,
    "BALDUR_CB_SLOW_CALL_DURATION_SECONDS": 2.5,
    "BALDUR_CB_SLOW_CALL_RATE_THRESHOLD": 80.0,
    "BALDUR_SERVICES": {"payments": {"failure_threshold": 2, "recovery_timeout": 0.5, "minimum_calls": 5}},
    "BALDUR_MIDDLEWARE_CB_STATUS_CODES": [500, 503],
    "BALDUR_MIDDLEWARE_RATE_LIMIT_CODES": [429, 503],
    "BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD": 5,
    "BALDUR_CB_RATE_LIMIT_CASCADE_WINDOW_SECONDS": 30,
    "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_RATIO": 20.0,
    "BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS": 10,
    "BALDUR_RATE_LIMIT_DEFAULT_COOLDOWN_SECONDS": 2.0,
    "BALDUR_RATE_LIMIT_MAX_COOLDOWN_SECONDS": 600,
    "BALDUR_MAX_COOLDOWN_WAIT_SECONDS": 10,
    "BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES": 15,
    "BALDUR_DOMAIN_MAPPING": {"/api/pay/": "payments"},
    "BALDUR_DOMAIN_DEFAULT": "web",
    "BALDUR_MIDDLEWARE_SHED_LOAD": True,
    "BALDUR_RATE_LIMIT_CACHE_ALIAS": "default",
    "BALDUR_RATE_LIMIT_RULES": [{"path": "/api/", "rate": "100/m", "key": "ip"}],
    "BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR": True,
    "BALDUR_RATE_LIMIT_TRUSTED_PROXIES": 2,
    "BALDUR_STATE_BACKEND": "redis",
    "BALDUR_REDIS_URL": "redis://user:pw@127.0.0.1:6379/15",
    "BALDUR_REDIS_CACHE_ALIAS": "default",
    "BALDUR_REDIS_SOCKET_TIMEOUT": 0.5,
    "BALDUR_REDIS_MAX_CONNECTIONS": 20,
    "BALDUR_REDIS_CLUSTER": False,  # True needs a cluster URL (test_cluster_checks.py)
    "BALDUR_STORE_WARNING_INTERVAL_SECONDS": 30,
    "BALDUR_CB_SYNC_INTERVAL_SECONDS": 0,
    "BALDUR_CB_HALF_OPEN_PROBE_LEASE_SECONDS": 10.5,
    "BALDUR_REGISTRY_TTL_DAYS": 1.5,
    "BALDUR_REGISTRY_IDLE_SECONDS": 600,
    "BALDUR_ADAPTER_MAX_HOSTS": 50,
    "BALDUR_TASK_RECOVERY_SWEEP_SECONDS": 5,
    "BALDUR_TASK_STATE_SYNC_SECONDS": 15,
    "BALDUR_TASK_EMERGENCY_CHECK_SECONDS": 5,
    "BALDUR_TASK_META_WATCHDOG_SECONDS": 30,
    "BALDUR_DRY_RUN": False,
    "BALDUR_EVENT_LOGGING_CB_LOG_LEVEL": "INFO",
    "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL": f"https://hooks.slack.com/services/{SECRET}",
    "BALDUR_META_WATCHDOG_AUTO_RECOVERY_ENABLED": False,
    "BALDUR_META_WATCHDOG_STUCK_OPEN_SECONDS": 300,
    "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED": False,
    "BALDUR_EMERGENCY_BACKEND": "redis",
    "BALDUR_EMERGENCY_STATE_FILE": "/var/run/baldur/emergency.json",
    "BALDUR_EMERGENCY_CACHE_SECONDS": 10,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED": False,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO": 60.0,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS": 4,
    "BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES": 15,
    "BALDUR_EMERGENCY_STABILIZATION_SECONDS": 120,
    "BALDUR_HEALTH_CRITICAL_SERVICES": ["payments"],
    "BALDUR_HEALTH_DETAILS": False,  # True is a deploy warning (W011)
    "BALDUR_OTEL_ENABLED": False,  # True installs the reporting (tests/otel)
    "BALDUR_OTEL_SPANS": True,
    # RS-8: the stages; a reserved knob (its stage not built yet) set to anything but its
    # default warns (W006), so those are given their defaults here
    "BALDUR_REQUEST_DEADLINE_SECONDS": 30,
    "BALDUR_REQUEST_DEADLINE_HEADER": "X-Request-Deadline",
    "BALDUR_CB_HONOR_RETRY_AFTER": False,
    "BALDUR_BULKHEAD_MAX_CONCURRENT_CALLS": None,
    "BALDUR_BULKHEAD_MAX_WAIT": 0.0,
    "BALDUR_BULKHEAD_SCOPE": "worker",
    "BALDUR_BULKHEAD_LEASE_SECONDS": 60,
    "BALDUR_RETRY_BUDGET_RATIO": None,
    "BALDUR_RETRY_BUDGET_MIN_PER_SECOND": 10,
    "BALDUR_RETRY_BUDGET_SCOPE": "worker",
    "BALDUR_ADAPTIVE_THROTTLING_K": None,
    "BALDUR_ADAPTIVE_THROTTLING_WINDOW": 120,
}


def test_cfg3_every_knob_set_to_a_good_value_gives_no_message():
    """CFG-3: good values for every knob (none at its default) produce no baldur message at all."""
    assert set(GOOD) == set(KNOBS), "add the new knob to GOOD"
    with override_settings(**GOOD):
        assert baldur_messages(run_checks(include_deployment_checks=True)) == []
        assert all(baldur_settings.source(name) == "setting" for name in KNOBS)


def test_cfg3_manage_py_check_is_clean_for_good_settings():
    """CFG-3: `manage.py check` prints no issues with the default (empty) BALDUR configuration and with GOOD."""
    for overrides in ({}, GOOD):
        out = io.StringIO()
        with override_settings(**overrides):
            call_command("check", stdout=out, stderr=io.StringIO())
        assert "System check identified no issues" in out.getvalue()


def test_cfg3_manage_py_check_fails_with_id_message_and_hint():
    """CFG-3: `manage.py check` refuses a bad value, showing the id, the setting, the value and the hint."""
    with override_settings(BALDUR_CB_HALF_OPEN_MAX_CALLS=0), pytest.raises(SystemCheckError) as info:
        call_command("check", "--tag", "baldur", stdout=io.StringIO(), stderr=io.StringIO())
    text = str(info.value)
    assert "(baldur.E017) BALDUR_CB_HALF_OPEN_MAX_CALLS=0" in text
    assert "HINT: BALDUR_CB_HALF_OPEN_MAX_CALLS: trial calls per probing round" in text


def test_cfg3_every_knob_has_its_own_stable_error_id():
    """CFG-3: KNOB_IDS gives each knob exactly one unique baldur.E0xx id."""
    assert set(KNOB_IDS) == set(KNOBS)
    assert len(set(KNOB_IDS.values())) == len(KNOB_IDS)
    assert all(re.fullmatch(r"baldur\.E(0\d\d|1[01]\d)", v) for v in KNOB_IDS.values())
    others = {v for k, v in vars(Codes).items() if k.isupper()}
    assert not others & set(KNOB_IDS.values())


ODD_VALUES = [None, object(), [], {}, "", "x", -1, 1e309, b"raw", ("a",), {"svc": 5}, [{"rate": 5}], True]


@pytest.mark.parametrize("name", list(KNOBS))
def test_cfg3_checks_never_raise_whatever_the_value(name):
    """CFG-3: odd values of any type never produce a bare traceback from the checks, only messages."""
    for value in ODD_VALUES:
        with override_settings(**{name: value}):
            messages = run_checks(include_deployment_checks=True, tags=["baldur"])
        for message in baldur_messages(messages):
            assert message.msg and message.hint, (name, value, message)
            if message.level == ERROR:
                assert name in message.msg


# ---------------------------------------------------------------- limiter cache (IN-4)

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
SHARED = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "limits": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"},
}


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.locmem.LocMemCache",
        "django.core.cache.backends.dummy.DummyCache",
        "django.core.cache.backends.filebased.FileBasedCache",
    ],
)
def test_in4_rate_limit_middleware_on_a_per_process_cache_warns(settings, backend):
    """IN-4: RateLimitMiddleware counting in a cache workers do not share is baldur.W005."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, RATE_LIMIT_MW]
    settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": "/tmp/baldur-check-test"}}
    message = only(check_rate_limit_cache(), WARNING)
    assert message.id == Codes.RATE_LIMIT_CACHE_NOT_SHARED
    assert "BALDUR_RATE_LIMIT_CACHE_ALIAS='default'" in message.msg and backend in message.msg
    assert message in run_checks(tags=["caches"])


def test_in4_shared_cache_or_no_middleware_is_silent(settings):
    """IN-4: a shared cache (Redis) raises nothing; without the middleware the cache is not checked at all."""
    settings.CACHES = LOCMEM
    assert check_rate_limit_cache() == []  # middleware not installed
    settings.CACHES = SHARED
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, RATE_LIMIT_MW]
    settings.BALDUR_RATE_LIMIT_CACHE_ALIAS = "limits"
    assert check_rate_limit_cache() == []


def test_in4_missing_cache_alias_is_an_error(settings):
    """IN-4: BALDUR_RATE_LIMIT_CACHE_ALIAS naming no cache is baldur.E004, listing the aliases that exist."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, RATE_LIMIT_MW]
    settings.CACHES = SHARED
    settings.BALDUR_RATE_LIMIT_CACHE_ALIAS = "ratelimits"
    message = only(check_rate_limit_cache(), ERROR)
    assert message.id == Codes.RATE_LIMIT_CACHE_MISSING
    assert "'ratelimits'" in message.msg and "'limits'" in message.hint


# ---------------------------------------------------------------- deployment (ST-1)


def test_st1_deploy_check_warns_that_memory_backend_is_per_worker():
    """ST-1: `check --deploy` warns (baldur.W004) that the memory backend gives each worker its own breakers."""
    assert Codes.MEMORY_BACKEND not in {m.id for m in run_checks()}  # not a deploy run
    message = only(check_deployment(), WARNING)
    assert message.id == Codes.MEMORY_BACKEND and "BALDUR_STATE_BACKEND='memory'" in message.msg
    assert "worker" in message.msg and "baldur.W004" in message.hint
    assert message in run_checks(include_deployment_checks=True)


def test_st1_deploy_check_silent_for_shared_backends():
    """ST-1: with the database or redis backend the deployment check says nothing."""
    for backend in ("database", "redis"):
        with override_settings(BALDUR_STATE_BACKEND=backend, BALDUR_REDIS_URL="redis://127.0.0.1:6379/15"):
            assert check_deployment() == []


DJANGO_REDIS = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"}
BUILTIN_REDIS = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"}


@pytest.mark.parametrize(
    "caches, alias, problem",
    [
        ({"default": LOCMEM["default"]}, "default", "not a django-redis cache"),
        ({"default": LOCMEM["default"], "redis": BUILTIN_REDIS}, "redis", "not a django-redis cache"),
        ({"default": LOCMEM["default"]}, "redis", "names no cache in CACHES"),
    ],
)
def test_st2_redis_backend_without_url_or_django_redis_alias_is_an_error(caches, alias, problem):
    """ST-2/CFG-3: the redis backend needs BALDUR_REDIS_URL or a django-redis cache alias (baldur.E006)."""
    with override_settings(CACHES=caches, BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_CACHE_ALIAS=alias):
        message = only(check_settings(), ERROR)
    assert message.id == Codes.REDIS_NOT_CONFIGURED
    assert f"BALDUR_REDIS_CACHE_ALIAS={alias!r}" in message.msg and problem in message.msg
    assert "BALDUR_REDIS_URL" in message.hint


def test_st2_redis_backend_with_url_or_django_redis_alias_is_fine():
    """ST-2/CFG-3: a URL, or an alias whose backend is django-redis, satisfies the redis backend check."""
    with override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_URL="redis://127.0.0.1:6379/15"):
        assert baldur_messages(check_settings()) == []
    with override_settings(
        CACHES={"default": LOCMEM["default"], "shared": DJANGO_REDIS},
        BALDUR_STATE_BACKEND="redis",
        BALDUR_REDIS_CACHE_ALIAS="shared",
    ):
        assert baldur_messages(check_settings()) == []


# ---------------------------------------------------------------- reserved knobs (CFG-3)

# The knobs of the outbound stages not built yet are reserved (RS-8). These tests pretend a
# plain boolean knob is one, so they hold whichever stages are built.
PRETEND_RESERVED = "BALDUR_DRY_RUN"


@pytest.fixture
def pretend_reserved(monkeypatch):
    import baldur_django.checks as checks_module

    monkeypatch.setattr(checks_module, "RESERVED", (PRETEND_RESERVED,))
    return PRETEND_RESERVED


def test_cfg3_rs8_the_reserved_knobs_are_the_unbuilt_features():
    """CFG-3, RS-8: exactly the knobs whose feature is not built yet are reserved: every
    outbound stage is built (deadline, Retry-After gate, bulkhead, retry budget, adaptive
    throttling), so none of their knobs is."""
    assert "BALDUR_REQUEST_DEADLINE_SECONDS" not in RESERVED
    assert "BALDUR_REQUEST_DEADLINE_HEADER" not in RESERVED
    assert not set(RESERVED) & {
        "BALDUR_CB_HONOR_RETRY_AFTER",
        "BALDUR_BULKHEAD_MAX_CONCURRENT_CALLS",
        "BALDUR_BULKHEAD_MAX_WAIT",
        "BALDUR_BULKHEAD_SCOPE",
        "BALDUR_BULKHEAD_LEASE_SECONDS",
        "BALDUR_RETRY_BUDGET_RATIO",
        "BALDUR_RETRY_BUDGET_MIN_PER_SECOND",
        "BALDUR_RETRY_BUDGET_SCOPE",
        "BALDUR_ADAPTIVE_THROTTLING_K",
        "BALDUR_ADAPTIVE_THROTTLING_WINDOW",
    }


def test_cfg3_reserved_setting_set_warns_naming_it(pretend_reserved):
    """CFG-3: a reserved setting set to anything but its default is one Warning baldur.W006 naming it
    and the value, with a hint saying it has no effect yet."""
    name = pretend_reserved
    with override_settings(**{name: True}):
        message = only(check_settings(), WARNING)
    assert message.id == Codes.RESERVED_SETTING
    assert f"{name}=True" in message.msg and "not built yet" in message.msg
    assert name in message.hint and "reserved" in message.hint and "default" in message.hint


def test_cfg3_reserved_environment_variable_warns_too(clean_env, pretend_reserved):
    """CFG-3: the same warning for a reserved knob set in the environment, saying so."""
    clean_env.setenv(pretend_reserved, "true")
    message = only(check_settings(), WARNING)
    assert message.id == Codes.RESERVED_SETTING
    assert pretend_reserved in message.msg and "environment variable" in message.msg


def test_cfg3_reserved_setting_at_its_default_or_unset_is_silent(clean_env, pretend_reserved):
    """CFG-3: a reserved knob left alone, or set to its default (what the package does anyway), is silent."""
    assert baldur_messages(check_settings()) == []
    with override_settings(**{pretend_reserved: False}):
        assert baldur_messages(check_settings()) == []
    clean_env.setenv(pretend_reserved, "off")
    assert baldur_messages(check_settings()) == []


def test_cfg3_a_bad_reserved_value_is_an_error_not_a_warning(pretend_reserved):
    """CFG-3: a reserved knob is validated like any other: a bad value is its own E0xx error only."""
    with override_settings(**{pretend_reserved: "yes"}):
        message = only(check_settings())
    assert message.level == ERROR and message.id == KNOB_IDS[pretend_reserved] == "baldur.E052"


# ---------------------------------------------------------------- CB-15..CB-17 settings (CFG-3)

NEW_BAD_VALUES = [
    ("BALDUR_CB_SLIDING_WINDOW_SECONDS", 1.5, "=1.5"),
    ("BALDUR_CB_SLIDING_WINDOW_SECONDS", 0, "=0"),
    ("BALDUR_CB_SLIDING_WINDOW_SECONDS", True, "=True"),
    ("BALDUR_CB_SLIDING_WINDOW_SECONDS", "x", "='x'"),
    ("BALDUR_CB_SLIDING_WINDOW_TYPE", "rolling", "='rolling'"),
    ("BALDUR_CB_RECOVERY_BACKOFF_FACTOR", 0.5, "=0.5"),
    ("BALDUR_CB_RECOVERY_TIMEOUT_MAX", 0, "=0"),
    ("BALDUR_CB_SLOW_CALL_DURATION_SECONDS", -1, "=-1"),
    ("BALDUR_CB_SLOW_CALL_RATE_THRESHOLD", 120, "=120"),
]


@pytest.mark.parametrize("name, value, shown", NEW_BAD_VALUES, ids=[f"{n}={v!r}" for n, v, _ in NEW_BAD_VALUES])
def test_cfg3_bad_cb15_cb16_cb17_setting_is_its_own_error(name, value, shown):
    """CFG-3, CB-15..CB-17: a bad value of a new knob is its own baldur.E0xx naming setting and value,
    with a hint saying what it accepts."""
    with override_settings(**{name: value}):
        message = only(check_settings(), ERROR)
    assert message.id == KNOB_IDS[name]
    assert f"{name}{shown}" in message.msg
    assert KNOBS[name].accepted_values() in message.hint


def test_cb15_window_seconds_hint_says_whole_seconds():
    """CB-15, CFG-3: the hint of a fractional window span says a whole number of seconds is due."""
    with override_settings(BALDUR_CB_SLIDING_WINDOW_SECONDS=2.5):
        message = only(check_settings(), ERROR)
    assert message.id == "baldur.E014" and "whole number" in message.msg and "whole number of seconds" in message.hint


@pytest.mark.parametrize(
    "key, value",
    [
        ("sliding_window_seconds", 0.5),
        ("sliding_window_type", "hourly"),
        ("recovery_backoff_factor", 0.9),
        ("recovery_timeout_max", -3),
        ("slow_call_duration", True),
        ("slow_call_rate_threshold", 101),
    ],
)
def test_cfg3_bad_new_key_in_services_names_entry_key_and_value(key, value):
    """CFG-3, CB-15..CB-17: a bad new key in a BALDUR_SERVICES entry names the entry, the key and the value."""
    with override_settings(BALDUR_SERVICES={"pay": {key: value}}):
        message = only(check_settings(), ERROR)
    assert message.id == KNOB_IDS["BALDUR_SERVICES"]
    assert f"BALDUR_SERVICES['pay'][{key!r}]={value!r}" in message.msg


def test_cfg3_new_keys_in_services_are_accepted():
    """CFG-3, CB-15..CB-17: every new key with a good value passes the checks."""
    entry = {
        "sliding_window_type": "time",
        "sliding_window_seconds": 30,
        "recovery_backoff_factor": 2.0,
        "recovery_timeout_max": 120,
        "slow_call_duration": 1.5,
        "slow_call_rate_threshold": 50,
    }
    with override_settings(BALDUR_SERVICES={"pay": entry}):
        assert baldur_messages(check_settings()) == []


def test_cb15_time_window_lifts_the_minimum_calls_bound():
    """CB-15, CFG-3: with the time window, minimum_calls above sliding_window_size is no error or
    warning (globally or per service); with the count window it still is."""
    with override_settings(
        BALDUR_CB_SLIDING_WINDOW_TYPE="time", BALDUR_CB_MINIMUM_CALLS=20, BALDUR_CB_SLIDING_WINDOW_SIZE=10
    ):
        assert baldur_messages(check_settings()) == []
    with override_settings(BALDUR_CB_SLIDING_WINDOW_SIZE=5, BALDUR_CB_SLIDING_WINDOW_TYPE="time"):
        assert baldur_messages(check_settings()) == []
    services = {"t": {"sliding_window_type": "time", "minimum_calls": 30, "sliding_window_size": 20}}
    with override_settings(BALDUR_SERVICES=services):
        assert baldur_messages(check_settings()) == []
    services = {"c": {"sliding_window_type": "count", "minimum_calls": 30, "sliding_window_size": 20}}
    with override_settings(BALDUR_SERVICES=services, BALDUR_CB_SLIDING_WINDOW_TYPE="time"):
        assert only(check_settings(), ERROR).id == Codes.SERVICE_MINIMUM_ABOVE_WINDOW


def test_cb16_recovery_cap_below_the_timeout_is_an_error():
    """CB-16, CFG-3: BALDUR_CB_RECOVERY_TIMEOUT_MAX set below BALDUR_CB_RECOVERY_TIMEOUT is baldur.E007."""
    with override_settings(BALDUR_CB_RECOVERY_TIMEOUT=120, BALDUR_CB_RECOVERY_TIMEOUT_MAX=60):
        message = only(check_settings(), ERROR)
    assert message.id == Codes.RECOVERY_MAX_BELOW_TIMEOUT
    assert "BALDUR_CB_RECOVERY_TIMEOUT_MAX=60" in message.msg and "BALDUR_CB_RECOVERY_TIMEOUT=120" in message.msg
    assert "120" in message.hint


def test_cb16_service_recovery_cap_below_its_timeout_is_an_error():
    """CB-16, CFG-3: a BALDUR_SERVICES entry whose recovery_timeout_max is below its own (or the
    global) recovery timeout is baldur.E008 naming the entry."""
    services = {"pay": {"recovery_timeout": 30, "recovery_timeout_max": 10}, "ok": {"recovery_timeout_max": 90}}
    with override_settings(BALDUR_SERVICES=services):
        message = only(check_settings(), ERROR)
    assert message.id == Codes.SERVICE_RECOVERY_MAX_BELOW_TIMEOUT
    assert "BALDUR_SERVICES['pay']" in message.msg and "recovery_timeout_max=10" in message.msg
    with override_settings(BALDUR_SERVICES={"pay": {"recovery_timeout_max": 10}}):  # global timeout 60
        assert only(check_settings(), ERROR).id == Codes.SERVICE_RECOVERY_MAX_BELOW_TIMEOUT


def test_cb16_backoff_that_cannot_grow_is_a_warning():
    """CB-16, CFG-3: a backoff factor above 1 with the default cap below the timeout cannot lengthen
    an open (the cap follows the timeout): warning baldur.W007. With factor 1 it is silent."""
    with override_settings(BALDUR_CB_RECOVERY_TIMEOUT=900, BALDUR_CB_RECOVERY_BACKOFF_FACTOR=2.0):
        message = only(check_settings(), WARNING)
    assert message.id == Codes.BACKOFF_CANNOT_GROW and "BALDUR_CB_RECOVERY_TIMEOUT_MAX=600" in message.msg
    with override_settings(BALDUR_CB_RECOVERY_TIMEOUT=900):
        assert baldur_messages(check_settings()) == []
    services = {"slow": {"recovery_timeout": 1200, "recovery_backoff_factor": 1.5}}
    with override_settings(BALDUR_SERVICES=services):
        message = only(check_settings(), WARNING)
    assert message.id == Codes.BACKOFF_CANNOT_GROW and "BALDUR_SERVICES['slow']" in message.msg
