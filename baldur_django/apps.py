"""Django app configuration: ``ready()`` only wires."""

from __future__ import annotations

from django.apps import AppConfig


class BaldurDjangoConfig(AppConfig):
    """The ``baldur_django`` app. Its ``ready()`` wires the Django layer onto the core.

    ``ready()`` is idempotent (Django's test runner or a second ``django.setup()`` may call
    it again): the settings lookup is (re)installed, every bus listener is subscribed at
    most once, checks register in Django's set-based registry and the ``setting_changed``
    receiver has a ``dispatch_uid``.
    """

    name = "baldur_django"
    label = "baldur_django"
    verbose_name = "Baldur circuit breakers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Install the settings lookup, the bus listeners, the shared store and the checks.

        * Django settings are put in front of environment variables.
        * The event bus gets the Django-signal bridge, the audit writer and
          the Slack notifier, which stays silent while
          ``BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL`` is unset.
        * Cluster propagation starts when ``BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED``
          is on, and follows the setting on every reload; OpenTelemetry reporting
          follows ``BALDUR_OTEL_ENABLED`` the same way.
        * Breakers decorated at import time, before this ran, were built from environment
          variables and defaults only; they are re-resolved against Django settings, and
          the shared store named by ``BALDUR_STATE_BACKEND`` is installed. No
          connection or query happens here.

        Outside management commands (gunicorn, uvicorn, a Celery worker, a script), a
        setting the system checks reject stops the start with ``ImproperlyConfigured``,
        which lists each error with its id and hint. Under a management command the bad
        setting is only logged (ERROR, logger ``baldur.config``), so Django's own check run
        reports it with its hint and exits with status 1.

        Raises:
            ImproperlyConfigured: a ``BALDUR_*`` setting is unknown or has a bad value, and
                no management command is running.
        """
        from . import (
            checks,
            conf,
            services,
            signals,
            stage_checks,  # noqa: F401 - registers the stage checks
            startup,
        )
        from .contrib import propagation, slack
        from .core.events import bus

        conf.install()
        startup.refuse_bad_settings(checks.check_settings)
        # bus listeners; EventBus.subscribe ignores a second subscription of the same one
        bus.subscribe(signals.bridge)  # Django signals
        services.install_audit_listener()  # one audit row per force and release
        slack.install_slack_listener()  # posts only while the webhook setting is set
        # re-resolve breakers decorated before Django was ready and install the shared
        # store BALDUR_STATE_BACKEND asks for (no connection is opened here)
        conf.reload_or_log(None, when="at startup")
        # cluster propagation follows its setting at startup and after every reload;
        # its threads connect in the background, never here
        conf.add_reload_hook(propagation.configure_or_log)
        propagation.configure_or_log()
        # OpenTelemetry reporting follows BALDUR_OTEL_ENABLED the same way
        conf.add_reload_hook(follow_otel_setting)
        follow_otel_setting()


def follow_otel_setting() -> None:
    """Report to OpenTelemetry while ``BALDUR_OTEL_ENABLED`` is on (at startup and after
    every settings reload). opentelemetry is imported only once the setting was on: a
    missing ``opentelemetry-api`` is then logged (ERROR, logger ``baldur.config``), never
    raised: the application runs on without the reporting."""
    import logging
    import sys

    from .core.config import settings

    if not settings.get("BALDUR_OTEL_ENABLED") and "baldur_django.contrib.otel" not in sys.modules:
        return
    try:
        from .contrib import otel
    except ImportError as exc:
        logging.getLogger("baldur.config").error(
            "baldur_django OpenTelemetry reporting is off: %s", exc, extra={"setting": "BALDUR_OTEL_ENABLED"}
        )
        return
    otel.configure_or_log()
