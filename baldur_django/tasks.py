"""Celery tasks and a ready beat schedule (ST-5).

Add to your Celery app's configuration::

    from baldur_django.tasks import BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**CELERY_BEAT_SCHEDULE, **BEAT_SCHEDULE}

``app.autodiscover_tasks()`` finds these tasks. Every entry's ``expires`` equals its
interval, so a backlog never replays stale runs, and each run takes a fleet lock in the
shared store, so a duplicated beat scheduler is harmless. Without Celery nothing here is
needed: transitions also happen lazily on the next call.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import fleet

__all__ = ["recovery_sweep", "sync_state", "emergency_check", "beat_schedule", "BEAT_SCHEDULE"]


def _summary(report: fleet.RunReport) -> dict[str, Any]:
    return {
        "job": report.job,
        "skipped": report.skipped,
        "moved": report.moved,
        "lapsed": report.lapsed,
        "pruned": report.pruned,
        "breakers": report.breakers,
        "open": report.open,
    }


@shared_task(name="baldur_django.tasks.recovery_sweep", ignore_result=False)
def recovery_sweep() -> dict[str, Any]:
    """OPEN past the recovery timeout -> HALF_OPEN for the fleet. Returns a summary dict."""
    return _summary(fleet.recovery_sweep())


@shared_task(name="baldur_django.tasks.sync_state", ignore_result=False)
def sync_state() -> dict[str, Any]:
    """Lapse expired forces and prune the registry. Returns a summary dict."""
    return _summary(fleet.sync_state())


@shared_task(name="baldur_django.tasks.emergency_check", ignore_result=False)
def emergency_check() -> dict[str, Any]:
    """Count registered/OPEN breakers (Emergency Mode's input). Returns a summary dict."""
    return _summary(fleet.emergency_check())


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The beat entries with intervals (seconds) from settings; ``expires`` = interval."""
    from .conf import baldur_settings

    entries = {}
    for task, knob in (
        ("recovery_sweep", "BALDUR_TASK_RECOVERY_SWEEP_SECONDS"),
        ("sync_state", "BALDUR_TASK_STATE_SYNC_SECONDS"),
        ("emergency_check", "BALDUR_TASK_EMERGENCY_CHECK_SECONDS"),
    ):
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
