"""Settings of the incident site, read from the environment the harness sets.

``INCIDENT_REDIS_URL``: the store and the level (the harness always sets it: a Redis of its own);
``INCIDENT_UPSTREAM``: the fake upstream's base URL; ``INCIDENT_DB``: the SQLite file;
``INCIDENT_LOG``: the file breaker log lines go to (default stderr);
``INCIDENT_CRITICAL``: comma-separated critical services of the health view;
``INCIDENT_IDLE_SECONDS``, ``INCIDENT_MAX_HOSTS``, ``INCIDENT_SYNC_SECONDS``, ``INCIDENT_EMERGENCY_CACHE_SECONDS``:
the matching ``BALDUR_*`` settings; ``INCIDENT_RECOVERY``, ``INCIDENT_THRESHOLD``,
``INCIDENT_TRIALS``: the breakers' recovery timeout (seconds), failure threshold and
half-open trials.
"""

from __future__ import annotations

import os

_env = os.environ.get

SECRET_KEY = "incident-rehearsal-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "baldur_django",
    "baldur_django.contrib.health",
]
MIDDLEWARE = [
    "benchmarks.incident_site.urls.worker_pid",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "benchmarks.incident_site.urls.operator_login",
    "django.contrib.messages.middleware.MessageMiddleware",
]
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
MESSAGE_STORAGE = "django.contrib.messages.storage.cookie.CookieStorage"
ROOT_URLCONF = "benchmarks.incident_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _env("INCIDENT_DB", "/tmp/incident-site.sqlite3"),
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "/static/"

INCIDENT_UPSTREAM = _env("INCIDENT_UPSTREAM", "http://127.0.0.1:8765")
INCIDENT_CALL_TIMEOUT = float(_env("INCIDENT_CALL_TIMEOUT", "8"))

BALDUR_STATE_BACKEND = "redis"
BALDUR_REDIS_URL = _env("INCIDENT_REDIS_URL", "redis://127.0.0.1:6390/0")
BALDUR_EMERGENCY_BACKEND = "redis"
BALDUR_EMERGENCY_CACHE_SECONDS = float(_env("INCIDENT_EMERGENCY_CACHE_SECONDS", "30"))
BALDUR_CB_SYNC_INTERVAL_SECONDS = float(_env("INCIDENT_SYNC_SECONDS", "5"))
BALDUR_REGISTRY_IDLE_SECONDS = float(_env("INCIDENT_IDLE_SECONDS", "3600"))
BALDUR_ADAPTER_MAX_HOSTS = int(_env("INCIDENT_MAX_HOSTS", "1000"))
BALDUR_HEALTH_CRITICAL_SERVICES = [name for name in _env("INCIDENT_CRITICAL", "").split(",") if name]
BALDUR_HEALTH_DETAILS = _env("INCIDENT_HEALTH_DETAILS", "") == "1"
BALDUR_STORE_WARNING_INTERVAL_SECONDS = 1
_breaker = {
    "failure_threshold": int(_env("INCIDENT_THRESHOLD", "3")),
    "recovery_timeout": float(_env("INCIDENT_RECOVERY", "30")),
    "half_open_max_calls": int(_env("INCIDENT_TRIALS", "3")),
}
BALDUR_SERVICES = {name: dict(_breaker) for name in ("svc-a", "svc-b", "svc-c", "payments")}
SILENCED_SYSTEM_CHECKS = ["baldur.W005"]

_log = _env("INCIDENT_LOG")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"}},
    "handlers": {
        "out": (
            {"class": "logging.FileHandler", "filename": _log, "formatter": "plain"}
            if _log
            else {"class": "logging.StreamHandler", "formatter": "plain"}
        )
    },
    "loggers": {
        "baldur": {"handlers": ["out"], "level": "INFO", "propagate": False},
        "django": {"handlers": ["out"], "level": "WARNING", "propagate": False},
    },
}
