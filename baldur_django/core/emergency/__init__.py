"""Emergency Mode: the fleet-wide level 0-3, where it is kept, and each process's cache of it.

Level 0 is normal operation; levels 1 and 2 are recorded, shown and stepped through; at
level 3 every breaker's automatic decisions are frozen (woven into the breaker).
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

:func:`record_check` is the auto-activation rule; it keeps "the previous check" in
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

The package has four parts, each a module of its own:

* :mod:`.record` -- the record (:class:`LevelState`), its validation and its JSON codec;
* :mod:`.backends` -- the file, Redis and memory backends;
* :mod:`.cache` -- :class:`EmergencyMode`, the per-process cache, reads and writes;
* :mod:`.activation` -- the auto-activation rule as a pure function
  (:func:`~baldur_django.core.emergency.activation.decide`).

Everything is importable from here, as before the split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from .activation import ActivationSettings, Decision, decide
from .backends import (
    Change,
    FileLevelBackend,
    LevelBackend,
    MemoryLevelBackend,
    RedisLevelBackend,
    install_redis_client_factory,
)
from .cache import EmergencyMode, logger
from .record import (
    AUTO_ACTOR,
    FREEZE_LEVEL,
    LEVELS,
    EmergencyReadError,
    EmergencyStateError,
    LevelState,
    decode,
    encode,
    validate_level,
    validate_minutes,
)

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
    # the codec and the rule, importable here too
    "AUTO_ACTOR",
    "Change",
    "encode",
    "decode",
    "ActivationSettings",
    "Decision",
    "decide",
]


def set_redis_client_factory(factory: Callable[[], Any] | None) -> None:
    """Install how the redis backend gets its client (the Django layer passes the store's
    builder, which also knows the django-redis alias). None: ``BALDUR_REDIS_URL`` only."""
    install_redis_client_factory(factory)
    mode.forget_backend()


#: The process-wide Emergency Mode state used by the breakers and the facade.
mode = EmergencyMode()


def current_level() -> int:
    """The emergency level in force, through the process cache.

    No I/O while the cache is fresh; an expired level reads 0. Never raises: a failed read
    keeps the last level (0 in a process that never read one) and logs
    ``emergency.read_failed`` at most once per ``BALDUR_STORE_WARNING_INTERVAL_SECONDS``.

    Returns:
        int: 0..3.
    """
    return mode.current_level()


def frozen() -> bool:
    """True while Level 3 is in force (the freeze of every automatic decision), through the process cache. Never raises.

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
    """Set the emergency level.

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
    """Lower the level in force by one, keeping its expiry; 0 stays 0.

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
    """One auto-activation judgement (see :meth:`EmergencyMode.record_check`)."""
    return mode.record_check(registered, open_count)


def use_backend(backend: LevelBackend | None) -> None:
    """Use *backend* in this process (tests, tools); None goes back to the settings' backend."""
    mode.use_backend(backend)


def use_clock(clock: Clock) -> None:
    """Drive the cache and expiries with *clock* (a FakeClock in tests); forgets the cache."""
    mode.use_clock(clock)


def reset() -> None:
    """Back to the settings' backend and the system clock, cache forgotten (tests)."""
    mode.use_clock(SYSTEM_CLOCK)
    mode.reset()
