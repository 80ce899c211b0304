"""Django settings for the test suite (SQLite in memory unless BALDUR_TEST_DB=postgres)."""

import os

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "baldur_django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
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
if os.environ.get("BALDUR_TEST_DB") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test",
            "HOST": "127.0.0.1",
            "PORT": 5432,
            "USER": os.environ.get("PGUSER", "postgres"),
        }
    }
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# A second alias on the real PostgreSQL server, for the database store's contract and
# concurrency tests (they request it explicitly with databases=["default", "pg"]).
DATABASES["pg"] = {
    "ENGINE": "django.db.backends.postgresql",
    # worker processes of the fleet tests point this at the test database directly
    "NAME": os.environ.get("BALDUR_PG_NAME", "test"),
    "HOST": "127.0.0.1",
    "PORT": 5432,
    "USER": os.environ.get("PGUSER", "postgres"),
    # per test run, so concurrent runs on one machine never share a test database
    "TEST": {"NAME": f"test_baldur_{os.getpid()}"},
}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
LOGGING_CONFIG = None
