"""Emergency Mode: the fleet-wide level 0-3, where it is kept, and each process's cache of it.

Level 0 is normal operation; levels 1 and 2 are recorded, shown and stepped through; at
level 3 every breaker's automatic decisions are frozen (EM-2, woven into the breaker).
A level carries an expiry (Unix wall-clock seconds in the stored record) and reads 0
once it has passed.

Where the level lives (``BALDUR_EMERGENCY_BACKEND``):

* ``"file"`` (default): one JSON file per host, ``BALDUR_EMERGENCY_STATE_FILE``. Every write
  goes to a temporary file with a unique name in the same directory, is flushed to disk
  and renamed over the old one (``os.replace``), so a reader sees the old or the new
  document and never a torn one. Writers serialise their read-modify-write with an
  ``flock`` on ``<file>.lock`` (readers take no lock).
* ``"redis"``: one key, ``baldur:{emergency}:level`` (hash-tagged for Redis Cluster), on the
  Redis the breaker store uses (``BALDUR_REDIS_URL``, a Redis Cluster with
  ``BALDUR_REDIS_CLUSTER``, or in Django the django-redis alias); a read-modify-write reads
  the key and stores the new value with a compare-and-set script, trying again when another
  writer changed it in between (one key: the same on a cluster).

Reading (:func:`current_level`, :func:`frozen`) goes through a per-process cache of
``BALDUR_EMERGENCY_CACHE_SECONDS``: while it is fresh a read costs one monotonic clock
reading and two comparisons, no I/O. When it has gone stale the next read asks the
backend. A failed read, or a corrupt file or record, logs ``emergency.read_failed`` (at
most once per ``BALDUR_STORE_WARNING_INTERVAL_SECONDS``), keeps the last level read (with
its own expiry) and retries after another cache period; a process that never read a level
runs at 0. These functions never raise. A level that expires logs ``emergency.expired``
once per process.

Writing (:func:`set_level`, :func:`step_down`) validates first and writes nothing on bad
input (:class:`ConfigError`); a level that cannot be stored raises
:class:`EmergencyStateError` (a :class:`BaldurError`). The writing process sees the new
level at once (its cache is updated); others within their cache period. Each change is
published on the event bus as :class:`~baldur_django.core.events.EmergencyLevelChanged`
and logged on logger ``baldur.emergency`` (``emergency.level_set``,
``emergency.stepped_down``, ``emergency.auto_activated``).

:func:`record_check` is the auto-activation rule (EM-4); it keeps "the previous check" in
the same shared record, so two beat schedulers or a restarted worker neither double nor
lose a check. The fleet job that counts the breakers and calls it is
:func:`baldur_django.core.maintenance.emergency_check`.

Tests and tools set the level directly, with an injected clock::

    from baldur_django.core import emergency
    from baldur_django.core.testing import FakeClock

    clock = FakeClock()
    emergency.use_backend(emergency.MemoryLevelBackend())   # or FileLevelBackend(tmp_path / "level.json")
    emergency.use_clock(clock)
    emergency.set_level(3, minutes=5)      # frozen() is True at once in this process
    clock.advance(301)                      # the level expires on its own schedule
    assert emergency.current_level() == 0
    emergency.reset()                       # back to the backend named by the settings, cache forgotten

Implements EM-1, EM-4 (rule), the level side of EM-3.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from .clock import SYSTEM_CLOCK, Clock
from .config import SettingsSource
from .config import settings as _settings
from .errors import BaldurError, ConfigError
from .events import EmergencyLevelChanged, bus

__all__ = [
    "LEVELS",
    "FREEZE_LEVEL",
    "LevelState",
    "LevelBackend",
    "FileLevelBackend",
    "RedisLevelBackend",
    "MemoryLevelBackend",
    "EmergencyStateError",
    "EmergencyReadError",
    "EmergencyMode",
    "mode",
    "current_level",
    "frozen",
    "refresh",
    "set_level",
    "step_down",
    "status",
    "record_check",
    "validate_level",
    "validate_minutes",
    "use_backend",
    "use_clock",
    "reset",
    "set_redis_client_factory",
    "logger",
]

logger = logging.getLogger("baldur.emergency")

#: The valid levels; 0 is normal operation.
LEVELS = (0, 1, 2, 3)
#: The level that freezes every breaker's automatic decisions (EM-2).
FREEZE_LEVEL = 3
_SOURCES = ("manual", "auto")
_MAX_MINUTES = 1440.0
_MAX_REASON = 1000
_MAX_ACTOR = 150
AUTO_ACTOR = "auto-activation"


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
        raise ConfigError(f"minutes={minutes!r}: expected a number of minutes (more than 0, at most 1440)")
    value = float(minutes)
    if not math.isfinite(value) or value <= 0 or value > _MAX_MINUTES:
        raise ConfigError(f"minutes={minutes!r}: the lifetime must be more than 0 and at most 1440 minutes")
    return value


def _check_reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ConfigError(f"reason={reason!r}: expected text")
    if len(reason) > _MAX_REASON:
        raise ConfigError(f"reason: {len(reason)} characters, at most {_MAX_REASON} allowed")
    return reason


def _check_actor(actor: Any) -> str | None:
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
            (an expiry is read from ``expires_at``); the start of EM-4's stabilization.
        check_at / check_streak: the last counted auto-activation check and how many
            consecutive checks found the fleet over the threshold (EM-4).
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


def _number(value: Any, *, optional: bool = True) -> bool:
    if value is None:
        return optional
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def encode(state: LevelState) -> str:
    """The JSON document of *state*."""
    return json.dumps(asdict(state), separators=(",", ":"), sort_keys=True)


def decode(raw: Any) -> LevelState:
    """A :class:`LevelState` from JSON text or bytes; None/empty reads as level 0 never set.

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
        data.get("source", "manual") in _SOURCES,
        isinstance(data.get("check_streak", 0), int) and not isinstance(data.get("check_streak", 0), bool),
    )
    if not all(checks):
        raise EmergencyReadError("corrupt emergency state (a field has the wrong type)")
    fields = {k: data[k] for k in LevelState.__dataclass_fields__ if k in data}
    return LevelState(**fields)


# ----------------------------------------------------------------------------- backends
Change = Callable[["LevelState | None"], "LevelState | None"]


class LevelBackend(Protocol):
    """Where the level is kept. ``name`` is ``"file"``, ``"redis"`` or ``"memory"``."""

    name: str

    def read(self) -> LevelState:
        """The stored record (level 0 when none). Raises EmergencyReadError."""

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        """Atomic read-modify-write. *change* gets the current record (None when it is
        corrupt) and returns the new one, or None to write nothing; it may run more than
        once and must not have side effects. Returns ``(before, written)``.

        Raises:
            EmergencyStateError: the record could not be stored; nothing changed.
        """


class MemoryLevelBackend:
    """The level in this process only: tests and single-process tools (not a setting)."""

    name = "memory"

    def __init__(self, raw: str | None = None) -> None:
        self._raw = raw
        self._lock = threading.Lock()

    def read(self) -> LevelState:
        return decode(self._raw)

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        with self._lock:
            try:
                current: LevelState | None = decode(self._raw)
            except EmergencyReadError:
                current = None
            new = change(current)
            if new is not None:
                self._raw = encode(new)
            return current, new

    def corrupt(self, raw: str) -> None:
        """Store *raw* as it is (tests of corrupt records)."""
        self._raw = raw


class FileLevelBackend:
    """The level in a JSON file on this host, replaced atomically (EM-1).

    Args:
        path: the state file (``BALDUR_EMERGENCY_STATE_FILE``). Its directory must exist.
    """

    name = "file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def read(self) -> LevelState:
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return LevelState()
        except OSError as exc:
            raise EmergencyReadError(f"cannot read {self.path}: {exc}") from None
        return decode(raw)

    def _write(self, data: bytes) -> None:
        """Temp file with a unique name in the same directory, fsync, rename over the file."""
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        try:
            lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EmergencyStateError(f"cannot write the emergency level to {self.path}: {exc}") from None
        try:
            try:
                import fcntl

                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            except ImportError:  # pragma: no cover - not POSIX: the rename is still atomic
                pass
            try:
                current: LevelState | None = self.read()
            except EmergencyReadError:
                current = None
            new = change(current)
            if new is not None:
                try:
                    self._write(encode(new).encode("utf-8"))
                except OSError as exc:
                    raise EmergencyStateError(f"cannot write the emergency level to {self.path}: {exc}") from None
            return current, new
        finally:
            os.close(lock_fd)  # releases the flock


#: Compare-and-set of the level key: KEYS[1] the key; ARGV[1] "1" when the writer read a
#: value (ARGV[2]), "0" when it read none; ARGV[3] the new document. 1 when stored, 0 when
#: another writer changed the key since it was read.
_COMPARE_AND_SET = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if current ~= ARGV[2] then return 0 end
elseif current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
"""
_CAS_ATTEMPTS = 20


class RedisLevelBackend:
    """The level in Redis key ``<prefix>:{emergency}:level`` (EM-1).

    A change reads the key, computes the new state and stores it with a compare-and-set
    script (one key, so the same on a Redis Cluster); when another writer got there
    first it reads again (at most 20 attempts).

    Args:
        client: a redis-py client (the one the breaker store would use), a cluster client included.
        prefix: key prefix, ``"baldur"`` by default.
    """

    name = "redis"

    def __init__(self, client: Any, prefix: str = "baldur") -> None:
        self.client = client
        self.key = f"{prefix}:{{emergency}}:level"
        self._cas = client.register_script(_COMPARE_AND_SET)

    def read(self) -> LevelState:
        try:
            raw = self.client.get(self.key)
        except Exception as exc:  # redis.RedisError, OSError: the backend did not answer
            raise EmergencyReadError(f"redis read failed: {type(exc).__name__}: {exc}") from None
        return decode(raw)

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        for _ in range(_CAS_ATTEMPTS):
            try:
                raw = self.client.get(self.key)
            except Exception as exc:  # redis errors: nothing was stored
                raise EmergencyStateError(
                    f"cannot read the emergency level from Redis: {type(exc).__name__}: {exc}"
                ) from None
            try:
                current: LevelState | None = decode(raw)
            except EmergencyReadError:
                current = None
            new = change(current)
            if new is None:
                return current, None
            try:
                stored = self._cas(
                    keys=[self.key], args=["0" if raw is None else "1", raw or "", encode(new)], client=self.client
                )
            except Exception as exc:  # redis errors: nothing was stored
                raise EmergencyStateError(
                    f"cannot write the emergency level to Redis: {type(exc).__name__}: {exc}"
                ) from None
            if stored:
                return current, new
        raise EmergencyStateError(
            f"cannot write the emergency level to Redis: other writers changed it {_CAS_ATTEMPTS} times in a row"
        )


def _default_redis_client(source: SettingsSource) -> Any:
    url = source.get("BALDUR_REDIS_URL")
    if not url:
        raise ConfigError("BALDUR_EMERGENCY_BACKEND='redis' without Django needs BALDUR_REDIS_URL")
    from .stores.redis import connect

    return connect(
        url,
        source.get("BALDUR_REDIS_SOCKET_TIMEOUT"),
        source.get("BALDUR_REDIS_MAX_CONNECTIONS"),
        cluster=source.get("BALDUR_REDIS_CLUSTER"),
    )


_redis_client_factory: Callable[[], Any] | None = None


def set_redis_client_factory(factory: Callable[[], Any] | None) -> None:
    """Install how the redis backend gets its client (the Django layer passes the store's
    builder, which also knows the django-redis alias). None: ``BALDUR_REDIS_URL`` only."""
    global _redis_client_factory
    _redis_client_factory = factory
    mode.forget_backend()


# -------------------------------------------------------------------------- the process
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
        self._expires_mono = math.inf  # monotonic deadline of the cached level
        self._expired_logged: tuple[int, float | None, float | None] | None = None
        self._warned_at: float | None = None
        self._last_error: str | None = None

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
                client = (
                    _redis_client_factory() if _redis_client_factory is not None else _default_redis_client(self.source)
                )
                backend = RedisLevelBackend(client)
            else:
                backend = FileLevelBackend(self.source.get("BALDUR_EMERGENCY_STATE_FILE"))
            self._backend, self._backend_version = backend, version
        return self._backend

    def forget_backend(self) -> None:
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
        """The level in force, through the cache; never raises (EM-1)."""
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
        """True while level 3 is in force (the EM-2 freeze); never raises."""
        return self.current_level() >= FREEZE_LEVEL

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
                return self._cached(now)
            self._adopt(state, now)
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
        """The level after a fresh read, for operators (section 0's ``status()``).

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
        self._fresh_until = self.clock.monotonic() + self._interval("BALDUR_EMERGENCY_CACHE_SECONDS", 30.0)

    def set_level(
        self, level: Any, minutes: Any = None, reason: Any = "", actor: Any = None, source: str = "manual"
    ) -> LevelState:
        """Set the level for *minutes* (see the module's :func:`set_level`)."""
        level = validate_level(level)
        lifetime = (
            validate_minutes(minutes, self.source.get("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES"))
            if (level or minutes is not None)
            else None
        )
        reason = _check_reason(reason)
        actor = _check_actor(actor)
        if source not in _SOURCES:
            raise ConfigError(f"source={source!r}: expected 'manual' or 'auto'")
        backend = self.backend()
        wall = self.clock.wall()

        def change(current: LevelState | None) -> LevelState:
            previous = current or LevelState()
            ended = previous.freeze_end(wall)
            if previous.effective(wall) >= FREEZE_LEVEL and level < FREEZE_LEVEL:
                ended = wall
            return replace(
                previous,
                level=level,
                expires_at=(wall + lifetime * 60.0) if level and lifetime is not None else None,
                reason=reason,
                actor=actor,
                source=source,
                set_at=wall,
                freeze_ended_at=ended,
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
        """One level lower, expiry kept (see the module's :func:`step_down`)."""
        actor = _check_actor(actor)
        backend = self.backend()
        wall = self.clock.wall()

        def change(current: LevelState | None) -> LevelState | None:
            if current is None:
                raise EmergencyStateError("the emergency state is unreadable (corrupt); set a level to replace it")
            level = current.effective(wall)
            if level == 0:
                return None
            ended = current.freeze_end(wall)
            if level >= FREEZE_LEVEL:
                ended = wall
            lower = level - 1
            return replace(
                current,
                level=lower,
                expires_at=current.expires_at if lower else None,
                actor=actor,
                source="manual",
                set_at=wall,
                freeze_ended_at=ended,
            )

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
        """One EM-4 judgement of the fleet's counts, kept in the shared record.

        Over the threshold means ``registered >= BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS``
        and ``open_count`` at least ``BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO`` percent of it.
        A check closer than 3/4 of ``BALDUR_TASK_EMERGENCY_CHECK_SECONDS`` to the last counted
        one is a duplicate (a second beat scheduler) and changes nothing; one more than 2.5
        intervals after it starts a new streak. The second consecutive check over the
        threshold declares level 3 for ``BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES`` (source
        ``"auto"``), unless a level 3 is already in force or the last freeze ended less than
        ``BALDUR_EMERGENCY_STABILIZATION_SECONDS`` ago. An operator's level is never lowered.

        Args:
            registered: breakers in the shared store's registry.
            open_count: how many of them are OPEN (forced open included).

        Returns:
            A dict: ``enabled``, ``registered``, ``open``, ``ratio`` (percent), ``over``,
            ``streak``, ``declared``, ``level`` (in force after the check), ``note``.

        Raises:
            EmergencyStateError: the shared record could not be read or written.
        """
        s = self.source
        enabled = bool(s.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED"))
        ratio = (open_count * 100.0 / registered) if registered else 0.0
        over = registered >= s.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_MIN_BREAKERS") and ratio >= s.get(
            "BALDUR_EMERGENCY_AUTO_ACTIVATION_RATIO"
        )
        summary: dict[str, Any] = {
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
        if not enabled:
            summary["note"] = "auto-activation is off (BALDUR_EMERGENCY_AUTO_ACTIVATION_ENABLED)"
            summary["level"] = self.current_level()
            return summary
        interval = float(s.get("BALDUR_TASK_EMERGENCY_CHECK_SECONDS"))
        minutes = float(s.get("BALDUR_EMERGENCY_AUTO_ACTIVATION_MINUTES"))
        stabilization = float(s.get("BALDUR_EMERGENCY_STABILIZATION_SECONDS"))
        wall = self.clock.wall()
        reason = f"auto-activation: {open_count} of {registered} breakers OPEN ({ratio:.0f}%) on consecutive checks"
        outcome: dict[str, Any] = {}

        def change(current: LevelState | None) -> LevelState | None:
            outcome.clear()
            if current is None:
                raise EmergencyStateError("the emergency state is unreadable (corrupt)")
            last = current.check_at
            if last is not None and 0 <= wall - last < 0.75 * interval:
                outcome.update(
                    note="duplicate check (another run counted this interval)",
                    streak=current.check_streak,
                    level=current.effective(wall),
                    declared=False,
                )
                return None
            fresh = last is None or wall < last or wall - last > 2.5 * interval
            streak = 0 if not over else (1 if fresh or current.check_streak < 1 else current.check_streak + 1)
            new = replace(current, check_at=wall, check_streak=streak)
            level = current.effective(wall)
            note, declared = "", False
            if streak >= 2:
                ended = current.freeze_end(wall)
                if level >= FREEZE_LEVEL:
                    note = "level 3 already in force"
                elif ended is not None and wall - ended < stabilization:
                    note = f"stabilizing: the last freeze ended {wall - ended:.0f} s ago"
                else:
                    new = replace(
                        new,
                        level=FREEZE_LEVEL,
                        expires_at=wall + minutes * 60.0,
                        reason=reason,
                        actor=AUTO_ACTOR,
                        source="auto",
                        set_at=wall,
                    )
                    declared, note, level = True, "declared level 3", FREEZE_LEVEL
            elif over:
                note = "over the threshold: waiting for a consecutive check"
            outcome.update(note=note, streak=streak, level=level, declared=declared, previous=current.effective(wall))
            return new

        _before, after = self.backend().update(change)
        summary.update(
            streak=outcome.get("streak", 0),
            level=outcome.get("level"),
            declared=outcome.get("declared", False),
            note=outcome.get("note", ""),
        )
        if after is not None:
            self._written(after)
        if summary["declared"]:
            previous = outcome.get("previous", 0)
            logger.warning(
                "emergency.auto_activated level=3 open=%d registered=%d ratio=%.1f%% minutes=%g",
                open_count,
                registered,
                ratio,
                minutes,
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
                    reason=reason,
                    expires_at=after.expires_at if after else None,
                    minutes=minutes,
                    action="auto",
                )
            )
        return summary

    def reset(self) -> None:
        """Forget the cache and any injected backend (tests)."""
        self._override = None
        self._backend = None
        self._forget()


#: The process-wide Emergency Mode state used by the breakers and the facade.
mode = EmergencyMode()


def current_level() -> int:
    """The emergency level in force, through the process cache (EM-1).

    No I/O while the cache is fresh; an expired level reads 0. Never raises: a failed read
    keeps the last level (0 in a process that never read one) and logs
    ``emergency.read_failed`` at most once per ``BALDUR_STORE_WARNING_INTERVAL_SECONDS``.

    Returns:
        int: 0..3.
    """
    return mode.current_level()


def frozen() -> bool:
    """True while Level 3 is in force (EM-2's freeze), through the process cache. Never raises.

    Returns:
        bool.
    """
    return mode.frozen()


def refresh() -> int:
    """Read the backend now, whatever the cache (fleet tasks before a decision). Never raises.

    Returns:
        int: the level in force, 0..3.
    """
    return mode.refresh()


def set_level(
    level: int, minutes: float | None = None, reason: str = "", actor: str | None = None, source: str = "manual"
) -> LevelState:
    """Set the emergency level (EM-1).

    Args:
        level: 0..3 (an ``int``; booleans are refused); 0 clears.
        minutes: lifetime in **minutes**, > 0 and <= 1440; None uses
            ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``. Ignored for level 0.
        reason: free text, at most 1000 characters.
        actor: who set it; None when unknown.
        source: ``"manual"`` or ``"auto"``.

    Returns:
        LevelState: the stored record. This process's cache holds it at once.

    Raises:
        ConfigError: a bad argument or setting; nothing is written.
        EmergencyStateError: the level could not be stored; nothing changed.
    """
    return mode.set_level(level, minutes, reason, actor, source)


def step_down(actor: str | None = None) -> int:
    """Lower the level in force by one, keeping its expiry; 0 stays 0 (EM-3).

    Args:
        actor: who stepped it down; None when unknown.

    Returns:
        int: the new level.

    Raises:
        EmergencyStateError: the record is unreadable, or could not be stored.
    """
    return mode.step_down(actor)


def status(strict: bool = False) -> dict[str, Any]:
    """The level after a fresh read, as a dict (see :meth:`EmergencyMode.status`)."""
    return mode.status(strict)


def record_check(registered: int, open_count: int) -> dict[str, Any]:
    """One EM-4 judgement (see :meth:`EmergencyMode.record_check`)."""
    return mode.record_check(registered, open_count)


def use_backend(backend: LevelBackend | None) -> None:
    """Use *backend* in this process (tests, tools); None goes back to the settings' backend."""
    mode.use_backend(backend)


def use_clock(clock: Clock) -> None:
    """Drive the cache and expiries with *clock* (a FakeClock in tests); forgets the cache."""
    mode.clock = clock
    mode._forget()


def reset() -> None:
    """Back to the settings' backend and the system clock, cache forgotten (tests)."""
    mode.clock = SYSTEM_CLOCK
    mode.reset()
