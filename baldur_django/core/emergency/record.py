"""The emergency record: what is stored, how it is checked, and its JSON codec.

Pure values and functions, no I/O and no clock: times are passed in (Unix wall-clock
seconds). The backends store the text :func:`encode` gives and read it back with
:func:`decode`; the process cache keeps the decoded :class:`LevelState`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..config import settings as _settings
from ..errors import BaldurError, ConfigError
from ..knobs import MAX_LIFETIME_MINUTES

__all__ = [
    "LEVELS",
    "FREEZE_LEVEL",
    "SOURCES",
    "AUTO_ACTOR",
    "EmergencyStateError",
    "EmergencyReadError",
    "LevelState",
    "validate_level",
    "validate_minutes",
    "check_reason",
    "check_actor",
    "encode",
    "decode",
    "with_level",
    "one_lower",
]

#: The valid levels; 0 is normal operation.
LEVELS = (0, 1, 2, 3)
#: The level that freezes every breaker's automatic decisions.
FREEZE_LEVEL = 3
#: Who may have written a level: an operator or the auto-activation.
SOURCES = ("manual", "auto")
#: The actor recorded on a level the auto-activation declared.
AUTO_ACTOR = "auto-activation"
_MAX_REASON = 1000
_MAX_ACTOR = 150


class EmergencyStateError(BaldurError):
    """The emergency level could not be stored (or, for a strict read, read). Nothing changed."""


class EmergencyReadError(Exception):
    """A backend could not read the level, or found a corrupt document (internal to reads)."""


# --------------------------------------------------------------------------- validation
def validate_level(level: Any) -> int:
    """Check an emergency level.

    Args:
        level: an ``int`` 0..3 (booleans are refused).

    Returns:
        The level.

    Raises:
        ConfigError: anything else.
    """
    if isinstance(level, bool) or not isinstance(level, int) or level not in LEVELS:
        raise ConfigError(f"level={level!r}: expected a whole number 0, 1, 2 or 3")
    return level


def validate_minutes(minutes: Any, default: float | None = None) -> float:
    """Check a level's lifetime.

    Args:
        minutes: minutes, a number > 0 and <= 1440 (fractions allowed); None means *default*.
        default: used for None (``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES`` when not given).

    Returns:
        The lifetime in minutes (float).

    Raises:
        ConfigError: not a number, a boolean, NaN/infinite, <= 0 or above 1440.
    """
    if minutes is None:
        minutes = default if default is not None else _settings.get("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES")
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)):
        raise ConfigError(
            f"minutes={minutes!r}: expected a number of minutes (more than 0, at most {MAX_LIFETIME_MINUTES})"
        )
    value = float(minutes)
    if not math.isfinite(value) or value <= 0 or value > MAX_LIFETIME_MINUTES:
        raise ConfigError(
            f"minutes={minutes!r}: the lifetime must be more than 0 and at most {MAX_LIFETIME_MINUTES} minutes"
        )
    return value


def check_reason(reason: Any) -> str:
    """Check the free-text reason of a level.

    Args:
        reason: text of at most 1000 characters; None reads as ``""``.

    Returns:
        The reason.

    Raises:
        ConfigError: not text, or too long.
    """
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ConfigError(f"reason={reason!r}: expected text")
    if len(reason) > _MAX_REASON:
        raise ConfigError(f"reason: {len(reason)} characters, at most {_MAX_REASON} allowed")
    return reason


def check_actor(actor: Any) -> str | None:
    """Check who changed the level.

    Args:
        actor: text (cut to 150 characters) or None when unknown.

    Returns:
        The actor, or None.

    Raises:
        ConfigError: neither text nor None.
    """
    if actor is None:
        return None
    if not isinstance(actor, str):
        raise ConfigError(f"actor={actor!r}: expected text or None")
    return actor[:_MAX_ACTOR]


# ------------------------------------------------------------------------------- record
@dataclass(frozen=True)
class LevelState:
    """The shared emergency record. Times are Unix wall-clock seconds.

    Attributes:
        level: the stored level 0..3 (see :meth:`effective` for expiry).
        expires_at: when the level ends on its own (None: level 0).
        reason, actor: what the operator (or the auto-activation) gave.
        source: ``"manual"`` or ``"auto"``.
        set_at: when it was written.
        freeze_ended_at: when the last level-3 freeze ended by a step down or a new level
            (an expiry is read from ``expires_at``); the start of the auto-activation's stabilization period.
        check_at / check_streak: the last counted auto-activation check and how many
            consecutive checks found the fleet over the threshold.
    """

    level: int = 0
    expires_at: float | None = None
    reason: str = ""
    actor: str | None = None
    source: str = "manual"
    set_at: float | None = None
    freeze_ended_at: float | None = None
    check_at: float | None = None
    check_streak: int = 0

    def expired(self, now: float) -> bool:
        """True when a level above 0 has passed its expiry at wall time *now*."""
        return self.level > 0 and self.expires_at is not None and now >= self.expires_at

    def effective(self, now: float) -> int:
        """The level in force at wall time *now* (0 once expired)."""
        return 0 if self.expired(now) else self.level

    def freeze_end(self, now: float) -> float | None:
        """When the last level-3 freeze ended (None: never, or still in force)."""
        ends = [t for t in (self.freeze_ended_at,) if t is not None]
        if self.level >= FREEZE_LEVEL and self.expired(now) and self.expires_at is not None:
            ends.append(self.expires_at)
        return max(ends) if ends else None


def with_level(
    current: LevelState | None,
    *,
    level: int,
    lifetime: float | None,
    reason: str,
    actor: str | None,
    source: str,
    now: float,
) -> LevelState:
    """The record after an operator (or a tool) sets *level* at wall time *now*.

    Args:
        current: the stored record; None when it was missing or corrupt (replaced).
        level: the checked level 0..3.
        lifetime: the checked lifetime in **minutes**; None for level 0.
        reason, actor, source: checked values to store.
        now: Unix wall-clock seconds.

    Returns:
        The new record; a level-3 freeze that ends here is recorded in ``freeze_ended_at``.
    """
    previous = current or LevelState()
    ended = previous.freeze_end(now)
    if previous.effective(now) >= FREEZE_LEVEL and level < FREEZE_LEVEL:
        ended = now
    return replace(
        previous,
        level=level,
        expires_at=(now + lifetime * 60.0) if level and lifetime is not None else None,
        reason=reason,
        actor=actor,
        source=source,
        set_at=now,
        freeze_ended_at=ended,
    )


def one_lower(current: LevelState, *, actor: str | None, now: float) -> LevelState | None:
    """The record after a step down at wall time *now*.

    Args:
        current: the stored record.
        actor: who stepped it down (checked).
        now: Unix wall-clock seconds.

    Returns:
        The record one level lower with its expiry kept, or None when the level in force is
        already 0 (nothing to write).
    """
    level = current.effective(now)
    if level == 0:
        return None
    ended = current.freeze_end(now)
    if level >= FREEZE_LEVEL:
        ended = now
    lower = level - 1
    return replace(
        current,
        level=lower,
        expires_at=current.expires_at if lower else None,
        actor=actor,
        source="manual",
        set_at=now,
        freeze_ended_at=ended,
    )


# -------------------------------------------------------------------------------- codec
def _number(value: Any, *, optional: bool = True) -> bool:
    if value is None:
        return optional
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def encode(state: LevelState) -> str:
    """The JSON document of *state*.

    Args:
        state: the record.

    Returns:
        str: compact JSON with sorted keys.
    """
    return json.dumps(asdict(state), separators=(",", ":"), sort_keys=True)


def decode(raw: Any) -> LevelState:
    """A :class:`LevelState` from JSON text or bytes; None/empty reads as level 0 never set.

    Args:
        raw: ``str``, ``bytes`` or None.

    Returns:
        LevelState: the record.

    Raises:
        EmergencyReadError: the document is not a valid emergency record (corrupt).
    """
    if raw is None:
        return LevelState()
    try:
        data = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise EmergencyReadError(f"corrupt emergency state ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise EmergencyReadError("corrupt emergency state (not a JSON object)")
    level = data.get("level")
    if isinstance(level, bool) or not isinstance(level, int) or level not in LEVELS:
        raise EmergencyReadError(f"corrupt emergency state (level={level!r})")
    checks = (
        _number(data.get("expires_at")),
        _number(data.get("set_at")),
        _number(data.get("freeze_ended_at")),
        _number(data.get("check_at")),
        isinstance(data.get("reason", ""), str),
        data.get("actor") is None or isinstance(data.get("actor"), str),
        data.get("source", "manual") in SOURCES,
        isinstance(data.get("check_streak", 0), int) and not isinstance(data.get("check_streak", 0), bool),
    )
    if not all(checks):
        raise EmergencyReadError("corrupt emergency state (a field has the wrong type)")
    fields = {k: data[k] for k in LevelState.__dataclass_fields__ if k in data}
    return LevelState(**fields)
