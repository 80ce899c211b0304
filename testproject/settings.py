"""Django settings for the test project: a small shop whose payment calls go through baldur.

Everything a developer needs runs on one machine: SQLite in a file next to this module
(override the path with ``TESTPROJECT_DB``), which also holds the breakers' shared state
(``BALDUR_STATE_BACKEND = "database"``), and a payments service at ``PAYMENTS_URL``
(default ``http://127.0.0.1:8765``; start one with ``python -m testproject.upstream``).
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "testproject-dev-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1").lower() in ("1", "true", "yes", "on")
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # serves the admin's CSS and JS under STATIC_URL while DEBUG is on (runserver, and
    # testproject.serve through staticfiles_urlpatterns in urls.py)
    "django.contrib.staticfiles",
    "baldur_django",
    "testproject.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
        "NAME": os.environ.get("TESTPROJECT_DB") or str(BASE_DIR / "db.sqlite3"),
        # the demo sends concurrent requests; wait for a busy database rather than fail
        "OPTIONS": {"timeout": 20},
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "/static/"

# --- the payments dependency ------------------------------------------------------------
#: Base URL of the payments service; the shop POSTs to ``PAYMENTS_URL + "/charge"``.
PAYMENTS_URL = os.environ.get("PAYMENTS_URL", "http://127.0.0.1:8765")
#: Seconds the shop waits for the payments service before giving up (requests timeout).
PAYMENTS_TIMEOUT = float(os.environ.get("PAYMENTS_TIMEOUT", "1.5"))


# --- the shipping carriers ------------------------------------------------------------
def _carriers(raw: str) -> dict[str, str]:
    """``"name=URL,name=URL"`` as ``{name: URL}`` (the demo passes its own ports)."""
    pairs = (item.partition("=") for item in raw.split(",") if item.strip())
    return {name.strip(): url.strip() for name, _, url in pairs}


#: The carriers the shop asks for shipping quotes, ``{name: base URL}``; the shop GETs
#: ``URL + "/quote"`` from each, through one requests adapter with a breaker per host
#: (``testproject.shop.shipping``). Override with ``SHIPPING_CARRIERS="a=http://...,b=..."``.
SHIPPING_CARRIERS = _carriers(
    os.environ.get("SHIPPING_CARRIERS", "parcelpost=http://127.0.0.1:8766,swiftship=http://127.0.0.1:8767")
)
#: Seconds the shop waits for one carrier's quote.
SHIPPING_TIMEOUT = float(os.environ.get("SHIPPING_TIMEOUT", "1.0"))

# --- baldur_django ------------------------------------------------------------------------
# Breaker state lives in the project's own database (the "database" store), so the admin,
# the management commands and every server process on this host see the same breakers.
# Set the environment variable BALDUR_STATE_BACKEND=memory (or redis) to try another store.
BALDUR_STATE_BACKEND = os.environ.get("BALDUR_STATE_BACKEND", "database")

# Small values so the demo shows every state within seconds: 3 failures in a row open the
# breaker, it waits 2 seconds before letting probes through, and 2 successful probes
# close it again.
BALDUR_SERVICES = {
    "payments": {
        "failure_threshold": 3,
        "recovery_timeout": 2,
        "half_open_max_calls": 2,
    },
    # the exchange-rates API of the demo's outbound-stage phases (testproject.shop.rates): a
    # provider answering 429 is asking for quiet, not down, so its breakers leave it to the
    # stages (a 20-failure threshold the demo never reaches); "rates_guarded" honours the
    # provider's Retry-After for every call site
    "rates": {"failure_threshold": 20},
    "rates_guarded": {"failure_threshold": 20, "honor_retry_after": True},
}

# The outbound stages (docs/outbound-stages.md): each request gets a deadline from the
# X-Request-Deadline header when it carries one (seconds), so every protected call made
# while serving it stops waiting there. The demo sends it in its Retry-After phase; a
# site would rather set BALDUR_REQUEST_DEADLINE_SECONDS for every request.
MIDDLEWARE.insert(0, "baldur_django.middleware.RequestDeadlineMiddleware")
BALDUR_REQUEST_DEADLINE_HEADER = "X-Request-Deadline"

# Breaker lines (logger "baldur.circuit_breaker") go to stderr next to the request log.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "baldur": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "baldur_stderr": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "baldur",
        },
    },
    "loggers": {
        "baldur": {"handlers": ["baldur_stderr"], "level": "INFO", "propagate": False},
    },
}

# --- inbound side (testproject.api) -------------------------------------------
# Every response is filed against a domain breaker: "/api/..." under "api", everything else
# under "default". The package's own limiter guards /api/limited/. See docs/inbound.md.
INSTALLED_APPS += ["testproject.api"]
MIDDLEWARE.insert(0, "baldur_django.middleware.CircuitBreakerMiddleware")
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
    "baldur_django.middleware.RateLimitMiddleware",
)
BALDUR_DOMAIN_MAPPING = {"/api/": "api"}
BALDUR_RATE_LIMIT_RULES = [{"path": "/api/limited/", "rate": "5/m", "key": "ip"}]
# The limiter counts in the local-memory cache: right for this one-process dev server, so
# the warning about several workers each counting on their own is silenced here.
SILENCED_SYSTEM_CHECKS = ["baldur.W005"]
# --- end of the inbound side ---------------------------------------------------------------
