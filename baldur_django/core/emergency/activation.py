"""The auto-activation rule as a pure function.

:func:`decide` takes the shared record (which remembers the previous check), the fleet's
counts, the settings and the wall time, and returns a :class:`Decision`: the record to
write (or None) and what to report. It reads no clock, no settings and no backend; the
process cache (:meth:`~baldur_django.core.emergency.EmergencyMode.record_check`) does that
I/O around it, and :func:`baldur_django.core.maintenance.emergency_check` counts the
breakers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import SettingsSource
from .record import AUTO_ACTOR, FREEZE_LEVEL, LevelState

__all__ = ["ActivationSettings", "Decision", "fleet_ratio", "is_over", "reason_text", "decide"]


@dataclass(frozen=True)
class ActivationSettings:
    """The knobs of the rule.

    Attributes:
        min_breakers: ``BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS``, registered breakers needed.
        ratio: ``BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO``, percent of them OPEN.
        interval: ``BALDUR_TASK_EMERGENCY_CHECK_SECONDS``, seconds between checks.
        minutes: ``BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES``, lifetime of a declared level 3 in **minutes**.
        stabilization: ``BALDUR_EMERGENCY_STABILIZATION_SECONDS``, seconds after a freeze ends
            during which nothing is declared.
    """

    min_breakers: int
    ratio: float
    interval: float
    minutes: float
    stabilization: float

    @classmethod
    def from_source(cls, source: SettingsSource) -> ActivationSettings:
        """The knobs read from *source*.

        Raises:
            ConfigError: a bad setting.
        """
        return cls(
            min_breakers=source.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS"),
            ratio=source.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO"),
            interval=float(source.get("BALDUR_TASK_EMERGENCY_CHECK_SECONDS")),
            minutes=float(source.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES")),
            stabilization=float(source.get("BALDUR_EMERGENCY_STABILIZATION_SECONDS")),
        )


@dataclass(frozen=True)
class Decision:
    """What one check decided.

    Attributes:
        record: the record to write, or None to write nothing (a duplicate check).
        streak: consecutive checks over the threshold, this one included.
        level: the level in force after the check.
        declared: True when this check declared level 3.
        note: why, in words.
        previous: the level in force before the check (None for a duplicate check).
    """

    record: LevelState | None
    streak: int
    level: int
    declared: bool
    note: str
    previous: int | None = None


def fleet_ratio(registered: int, open_count: int) -> float:
    """Percent of the registered breakers that are OPEN (0 when none is registered)."""
    return (open_count * 100.0 / registered) if registered else 0.0


def is_over(registered: int, open_count: int, min_breakers: int, ratio: float) -> bool:
    """True when the fleet is over the threshold: at least *min_breakers* registered and at
    least *ratio* percent of them OPEN."""
    return registered >= min_breakers and fleet_ratio(registered, open_count) >= ratio


def reason_text(registered: int, open_count: int) -> str:
    """The reason stored on a level 3 the rule declares."""
    ratio = fleet_ratio(registered, open_count)
    return f"auto-activation: {open_count} of {registered} breakers OPEN ({ratio:.0f}%) on consecutive checks"


def decide(current: LevelState, registered: int, open_count: int, settings: ActivationSettings, now: float) -> Decision:
    """One auto-activation judgement of the fleet's counts against the shared record.

    A check closer than 3/4 of ``settings.interval`` to the last counted one is a duplicate
    (a second beat scheduler) and writes nothing; one more than 2.5 intervals after it (or
    before it: a clock step) starts a new streak. The second consecutive check over the
    threshold declares level 3 for ``settings.minutes``, unless a level 3 is already in
    force or the last freeze ended less than ``settings.stabilization`` seconds ago. A level
    set by an operator is never lowered.

    Args:
        current: the shared record (readable; a corrupt one is the caller's error).
        registered: breakers in the shared store's registry.
        open_count: how many of them are OPEN (forced open included).
        settings: the rule's knobs.
        now: Unix wall-clock seconds.

    Returns:
        Decision: the record to write and the summary.
    """
    interval = settings.interval
    last = current.check_at
    if last is not None and 0 <= now - last < 0.75 * interval:
        return Decision(
            record=None,
            streak=current.check_streak,
            level=current.effective(now),
            declared=False,
            note="duplicate check (another run counted this interval)",
        )
    over = is_over(registered, open_count, settings.min_breakers, settings.ratio)
    fresh = last is None or now < last or now - last > 2.5 * interval
    streak = 0 if not over else (1 if fresh or current.check_streak < 1 else current.check_streak + 1)
    new = replace(current, check_at=now, check_streak=streak)
    level = current.effective(now)
    note, declared = "", False
    if streak >= 2:
        ended = current.freeze_end(now)
        if level >= FREEZE_LEVEL:
            note = "level 3 already in force"
        elif ended is not None and now - ended < settings.stabilization:
            note = f"stabilizing: the last freeze ended {now - ended:.0f} s ago"
        else:
            new = replace(
                new,
                level=FREEZE_LEVEL,
                expires_at=now + settings.minutes * 60.0,
                reason=reason_text(registered, open_count),
                actor=AUTO_ACTOR,
                source="auto",
                set_at=now,
            )
            declared, note, level = True, "declared level 3", FREEZE_LEVEL
    elif over:
        note = "over the threshold: waiting for a consecutive check"
    return Decision(
        record=new, streak=streak, level=level, declared=declared, note=note, previous=current.effective(now)
    )
