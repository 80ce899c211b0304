"""The per-process view of the emergency level: which backend, the cache, reads and writes.

:class:`EmergencyMode` picks the backend from the settings (or an injected one), caches the
level for ``BALDUR_EMERGENCY_CACHE_SECONDS`` (a fresh read costs one monotonic clock reading
and two comparisons), keeps the last level when a read fails, lets a cached level expire on
its own schedule, and performs the writes: it validates, asks the backend for an atomic
change built by :mod:`.record` or :mod:`.activation`, updates its own cache at once, logs on
logger ``baldur.emergency`` and publishes
:class:`~baldur_django.core.events.EmergencyLevelChanged`.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..config import SettingsSource
from ..config import settings as _settings
from ..errors import ConfigError
from ..events import EmergencyLevelChanged, bus
from .activation import ActivationSettings, Decision, decide, fleet_ratio, is_over, reason_text
from .backends import (
    FileLevelBackend,
    LevelBackend,
    RedisLevelBackend,
    default_redis_client,
    project_level_file,
    redis_client_factory,
)
from .record import (
    AUTO_ACTOR,
    FREEZE_LEVEL,
    SOURCES,
    EmergencyStateError,
    LevelState,
    check_actor,
    check_reason,
    one_lower,
    validate_level,
    validate_minutes,
    with_level,
)

__all__ = ["EmergencyMode", "logger"]

logger = logging.getLogger("baldur.emergency")


class EmergencyMode:
    """The process's view of the level: backend, cache, logging and writes.

    Args:
        source: settings to read the knobs from.
        clock: time source (``monotonic`` for the cache, ``wall`` for expiries).
    """

    def __init__(self, source: SettingsSource = _settings, clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self.clock = clock
        self._refresh_lock = threading.Lock()
        self._override: LevelBackend | None = None
        self._backend: LevelBackend | None = None
        self._backend_version: int | None = None
        self._forget()

    def _forget(self) -> None:
        self._state = LevelState()
        self._have_read = False
        self._level = 0
        self._fresh_until = -math.inf  # monotonic
        self._read_at = -math.inf  # monotonic time of the last backend read (or write)
        self._expires_mono = math.inf  # monotonic deadline of the cached level
        self._expired_logged: tuple[int, float | None, float | None] | None = None
        self._warned_at: float | None = None
        self._last_error: str | None = None

    def use_clock(self, clock: Clock) -> None:
        """Drive the cache and expiries with *clock* from now on; forgets the cache."""
        self.clock = clock
        self._forget()

    # ------------------------------------------------------------------ backend
    def backend(self) -> LevelBackend:
        """The backend in use (an injected one, else built from the settings).

        Raises:
            ConfigError: a bad emergency or Redis setting.
        """
        if self._override is not None:
            return self._override
        version = self.source.version
        if self._backend is None or self._backend_version != version:
            name = self.source.get("BALDUR_EMERGENCY_BACKEND")
            backend: LevelBackend
            if name == "redis":
                factory = redis_client_factory()
                client = factory() if factory is not None else default_redis_client(self.source)
                backend = RedisLevelBackend(client)
            else:
                backend = FileLevelBackend(self.source.get("BALDUR_EMERGENCY_STATE_FILE") or project_level_file())
            self._backend, self._backend_version = backend, version
        return self._backend

    def forget_backend(self) -> None:
        """Build the settings' backend again on the next use (a new Redis client factory)."""
        self._backend = None

    def use_backend(self, backend: LevelBackend | None) -> None:
        """Use *backend* instead of the settings' one (None: back to the settings); forgets the cache."""
        self._override = backend
        self._forget()

    # -------------------------------------------------------------------- reads
    def _interval(self, knob: str, fallback: float) -> float:
        try:
            return float(self.source.get(knob))
        except Exception:
            return fallback

    def current_level(self) -> int:
        """The level in force, through the cache; never raises."""
        now = self.clock.monotonic()
        if now < self._fresh_until:
            if now < self._expires_mono:
                return self._level
            return self._expire(now)
        try:
            return self._refresh(now)
        except Exception:  # belt and braces: a reader never fails
            logger.exception("emergency.read_failed unexpected error while reading the level")
            return self._level

    def frozen(self) -> bool:
        """True while level 3 is in force (automatic decisions frozen); never raises."""
        return self.current_level() >= FREEZE_LEVEL

    def recent_level(self, max_age: float) -> int:
        """The level in force, read from the backend when the last read is older than
        *max_age* seconds (monotonic); never raises.

        For readers that must follow a change quickly (the health view) without giving up
        the cache everyone else reads through: a fresh read also refreshes the cache. When
        another thread is reading the backend right now, the cached level is returned.

        Args:
            max_age: seconds; how old the last backend read may be.

        Returns:
            int: 0..3, as :meth:`current_level`.
        """
        now = self.clock.monotonic()
        if now - self._read_at < max_age:
            return self.current_level()
        try:
            return self._refresh(now)
        except Exception:  # belt and braces: a reader never fails
            logger.exception("emergency.read_failed unexpected error while reading the level")
            return self._level

    def known_level(self) -> int:
        """The cached level (expiry applied), without any backend I/O; never raises.

        Returns:
            int: 0..3; 0 in a process that never read a level.
        """
        return self._cached(self.clock.monotonic())

    def refresh(self) -> int:
        """Read the backend now (whatever the cache), then answer like :meth:`current_level`."""
        self._fresh_until = -math.inf
        return self.current_level()

    def _expire(self, now: float) -> int:
        if self._level:
            key = (self._state.level, self._state.expires_at, self._state.set_at)
            if self._expired_logged != key:
                self._expired_logged = key
                logger.info(
                    "emergency.expired level=%d expires_at=%s",
                    self._state.level,
                    self._state.expires_at,
                    extra={
                        "event": "emergency.expired",
                        "level": self._state.level,
                        "expires_at": self._state.expires_at,
                    },
                )
            self._level = 0
        self._expires_mono = math.inf
        return 0

    def _refresh(self, now: float) -> int:
        if not self._refresh_lock.acquire(blocking=False):
            return self._cached(now)  # another thread is reading the backend
        try:
            cache = self._interval("BALDUR_EMERGENCY_CACHE_SECONDS", 30.0)
            try:
                state = self.backend().read()
            except Exception as exc:  # EmergencyReadError, ConfigError, anything: keep the last level
                self._read_failed(exc, now)
                self._fresh_until = now + cache
                self._read_at = now
                return self._cached(now)
            self._adopt(state, now)
            self._read_at = now
            self._fresh_until = now + cache
            return self._cached(now)
        finally:
            self._refresh_lock.release()

    def _cached(self, now: float) -> int:
        if now >= self._expires_mono:
            return self._expire(now)
        return self._level

    def _adopt(self, state: LevelState, mono: float) -> None:
        wall = self.clock.wall()
        self._state = state
        self._have_read = True
        self._last_error = None
        self._level = state.level
        if state.level and state.expires_at is not None:
            self._expires_mono = mono + (state.expires_at - wall)
        else:
            self._expires_mono = math.inf
        self._cached(mono)

    def _read_failed(self, exc: BaseException, now: float) -> None:
        self._last_error = f"{type(exc).__name__}: {exc}"
        interval = self._interval("BALDUR_STORE_WARNING_INTERVAL_SECONDS", 60.0)
        if self._warned_at is not None and now - self._warned_at < interval:
            return
        self._warned_at = now
        logger.warning(
            "emergency.read_failed %s; keeping level %d%s",
            self._last_error,
            self._level,
            "" if self._have_read else " (never read one: running unfrozen)",
            extra={"event": "emergency.read_failed", "level": self._level, "error": self._last_error},
        )

    def status(self, strict: bool = False) -> dict[str, Any]:
        """The level after a fresh read, for operators (what the public ``emergency.status()`` returns).

        Returns:
            ``level`` (effective), ``expires_at`` (Unix s or None), ``reason``, ``actor``,
            ``source`` (``"manual"``/``"auto"``), ``backend``, ``set_at``, ``frozen``, and
            ``error`` (None, or why the read failed: the values are then the last ones read).

        Raises:
            EmergencyStateError: only when *strict* and the read failed.
        """
        level = self.refresh()
        try:
            backend = self.backend().name
        except ConfigError as exc:
            backend = "?"
            self._last_error = self._last_error or str(exc)
        if strict and self._last_error is not None:
            raise EmergencyStateError(f"the emergency level could not be read: {self._last_error}")
        state = self._state
        return {
            "level": level,
            "expires_at": state.expires_at if level else None,
            "reason": state.reason if level else "",
            "actor": state.actor if level else None,
            "source": state.source,
            "set_at": state.set_at,
            "backend": backend,
            "frozen": level >= FREEZE_LEVEL,
            "error": self._last_error,
        }

    # ------------------------------------------------------------------- writes
    def _written(self, state: LevelState) -> None:
        self._adopt(state, self.clock.monotonic())
        self._read_at = self.clock.monotonic()
        self._fresh_until = self.clock.monotonic() + self._interval("BALDUR_EMERGENCY_CACHE_SECONDS", 30.0)

    def set_level(
        self, level: Any, minutes: Any = None, reason: Any = "", actor: Any = None, source: str = "manual"
    ) -> LevelState:
        """Set the level for *minutes* (see the package's :func:`set_level`)."""
        level = validate_level(level)
        lifetime = (
            validate_minutes(minutes, self.source.get("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES"))
            if (level or minutes is not None)
            else None
        )
        reason = check_reason(reason)
        actor = check_actor(actor)
        if source not in SOURCES:
            raise ConfigError(f"source={source!r}: expected 'manual' or 'auto'")
        backend = self.backend()
        wall = self.clock.wall()

        def change(current: LevelState | None) -> LevelState:
            return with_level(
                current, level=level, lifetime=lifetime, reason=reason, actor=actor, source=source, now=wall
            )

        before, after = backend.update(change)
        assert after is not None
        previous_level = before.effective(wall) if before is not None else 0
        self._written(after)
        logger.warning(
            "emergency.level_set level=%d previous=%d minutes=%s actor=%s reason=%r",
            level,
            previous_level,
            lifetime if level else None,
            actor,
            reason,
            extra={
                "event": "emergency.level_set",
                "level": level,
                "previous": previous_level,
                "actor": actor,
                "reason": reason,
                "expires_at": after.expires_at,
                "source": source,
            },
        )
        bus.publish(
            EmergencyLevelChanged(
                "",
                wall,
                level=level,
                previous=previous_level,
                source=source,
                actor=actor,
                reason=reason,
                expires_at=after.expires_at,
                minutes=lifetime if level else None,
                action="set",
            )
        )
        return after

    def step_down(self, actor: Any = None) -> int:
        """One level lower, expiry kept (see the package's :func:`step_down`)."""
        actor = check_actor(actor)
        backend = self.backend()
        wall = self.clock.wall()

        def change(current: LevelState | None) -> LevelState | None:
            if current is None:
                raise EmergencyStateError("the emergency state is unreadable (corrupt); set a level to replace it")
            return one_lower(current, actor=actor, now=wall)

        before, after = backend.update(change)
        if after is None:
            if before is not None:
                self._written(before)
            return 0
        previous = before.effective(wall) if before is not None else 0
        self._written(after)
        logger.warning(
            "emergency.stepped_down level=%d previous=%d actor=%s",
            after.level,
            previous,
            actor,
            extra={
                "event": "emergency.stepped_down",
                "level": after.level,
                "previous": previous,
                "actor": actor,
                "expires_at": after.expires_at,
            },
        )
        bus.publish(
            EmergencyLevelChanged(
                "",
                wall,
                level=after.level,
                previous=previous,
                source="manual",
                actor=actor,
                reason=after.reason,
                expires_at=after.expires_at,
                action="step_down",
            )
        )
        return after.level

    # ------------------------------------------------------------ auto-activation
    def record_check(self, registered: int, open_count: int) -> dict[str, Any]:
        """One auto-activation judgement of the fleet's counts, kept in the shared record.

        Reads the settings and the wall clock, applies the pure rule
        :func:`~baldur_django.core.emergency.activation.decide` inside the backend's atomic
        change (so two beat schedulers or a restarted worker neither double nor lose a
        check), then updates the cache, logs ``emergency.auto_activated`` and publishes the
        change when level 3 was declared.

        Args:
            registered: breakers in the shared store's registry.
            open_count: how many of them are OPEN (forced open included).

        Returns:
            A dict: ``enabled``, ``registered``, ``open``, ``ratio`` (percent), ``over``,
            ``streak``, ``declared``, ``level`` (in force after the check), ``note``.

        Raises:
            EmergencyStateError: the shared record could not be read or written.
            ConfigError: a bad setting.
        """
        s = self.source
        enabled = bool(s.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED"))
        ratio = fleet_ratio(registered, open_count)
        over = is_over(
            registered,
            open_count,
            s.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS"),
            s.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO"),
        )
        summary = _summary(enabled, registered, open_count, ratio, over)
        if not enabled:
            summary["note"] = "auto-activation is off (BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED)"
            summary["level"] = self.current_level()
            return summary
        knobs = ActivationSettings.from_source(s)
        wall = self.clock.wall()
        decisions: list[Decision] = []

        def change(current: LevelState | None) -> LevelState | None:
            decisions.clear()
            if current is None:
                raise EmergencyStateError("the emergency state is unreadable (corrupt)")
            decision = decide(current, registered, open_count, knobs, wall)
            decisions.append(decision)
            return decision.record

        _before, after = self.backend().update(change)
        decision = decisions[-1]
        summary.update(streak=decision.streak, level=decision.level, declared=decision.declared, note=decision.note)
        if after is not None:
            self._written(after)
        if decision.declared:
            self._announce_activation(decision, after, registered, open_count, knobs, wall)
        return summary

    def _announce_activation(
        self,
        decision: Decision,
        after: LevelState | None,
        registered: int,
        open_count: int,
        knobs: ActivationSettings,
        wall: float,
    ) -> None:
        """Log ``emergency.auto_activated`` and publish the level change a check declared."""
        ratio = fleet_ratio(registered, open_count)
        previous = decision.previous or 0
        logger.warning(
            "emergency.auto_activated level=3 open=%d registered=%d ratio=%.1f%% minutes=%g",
            open_count,
            registered,
            ratio,
            knobs.minutes,
            extra={
                "event": "emergency.auto_activated",
                "level": FREEZE_LEVEL,
                "previous": previous,
                "open": open_count,
                "registered": registered,
                "ratio": ratio,
                "source": "auto",
            },
        )
        bus.publish(
            EmergencyLevelChanged(
                "",
                wall,
                level=FREEZE_LEVEL,
                previous=previous,
                source="auto",
                actor=AUTO_ACTOR,
                reason=reason_text(registered, open_count),
                expires_at=after.expires_at if after else None,
                minutes=knobs.minutes,
                action="auto",
            )
        )

    def reset(self) -> None:
        """Forget the cache and any injected backend (tests)."""
        self._override = None
        self._backend = None
        self._forget()


def _summary(enabled: bool, registered: int, open_count: int, ratio: float, over: bool) -> dict[str, Any]:
    """The answer of :meth:`EmergencyMode.record_check` before its decision is known."""
    return {
        "enabled": enabled,
        "registered": registered,
        "open": open_count,
        "ratio": round(ratio, 2),
        "over": over,
        "streak": 0,
        "declared": False,
        "level": None,
        "note": "",
    }
