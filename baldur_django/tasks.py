"""Celery tasks and a ready beat schedule.

Add to your Celery app's configuration::

    from baldur_django.tasks import BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**CELERY_BEAT_SCHEDULE, **BEAT_SCHEDULE}

``app.autodiscover_tasks()`` finds these tasks. They are thin shells over the plain
functions of :mod:`baldur_django.core.maintenance`. Every entry's ``expires`` equals its
interval, so a backlog never replays stale runs, and each run takes an owned fleet lock in
the shared store, so a duplicated beat scheduler is harmless. Without Celery nothing here
is needed: transitions also happen lazily on the next call.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import emergency
from .core import maintenance

__all__ = [
    "recovery_sweep",
    "sync_state",
    "emergency_check",
    "meta_watchdog",
    "beat_schedule",
    "BEAT_SCHEDULE",  # noqa: F822 - the module __getattr__ computes it from the settings in force
]

#: task name -> the knob holding its interval (seconds)
_INTERVALS = (
    ("recovery_sweep", "BALDUR_TASK_RECOVERY_SWEEP_SECONDS"),
    ("sync_state", "BALDUR_TASK_STATE_SYNC_SECONDS"),
    ("emergency_check", "BALDUR_TASK_EMERGENCY_CHECK_SECONDS"),
    ("meta_watchdog", "BALDUR_TASK_META_WATCHDOG_SECONDS"),
)


@shared_task(name="baldur_django.tasks.recovery_sweep", ignore_result=False)
def recovery_sweep() -> dict[str, Any]:
    """OPEN past the recovery timeout -> HALF_OPEN for the fleet (held during Level 3). Returns a summary dict."""
    return maintenance.recovery_sweep().as_dict()


@shared_task(name="baldur_django.tasks.sync_state", ignore_result=False)
def sync_state() -> dict[str, Any]:
    """Lapse expired forces and prune the registry. Returns a summary dict."""
    return maintenance.sync_state().as_dict()


@shared_task(name="baldur_django.tasks.emergency_check", ignore_result=False)
def emergency_check() -> dict[str, Any]:
    """One Emergency Mode auto-activation check. Returns a summary dict."""
    return emergency.check_auto_activation()


@shared_task(name="baldur_django.tasks.meta_watchdog", ignore_result=False)
def meta_watchdog() -> dict[str, Any]:
    """Force-close breakers stuck OPEN, when enabled and not during Level 3. Returns a summary dict."""
    return maintenance.meta_watchdog().as_dict()


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The beat entries with intervals (seconds) from settings; ``expires`` = interval."""
    from .conf import baldur_settings

    entries = {}
    for task, knob in _INTERVALS:
        seconds = float(baldur_settings.get(knob))
        entries[f"baldur-{task.replace('_', '-')}"] = {
            "task": f"baldur_django.tasks.{task}",
            "schedule": seconds,
            "options": {"expires": seconds},
        }
    return entries


def __getattr__(name: str) -> Any:
    # BEAT_SCHEDULE is computed on access, so it follows the settings in force
    if name == "BEAT_SCHEDULE":
        return beat_schedule()
    raise AttributeError(name)
