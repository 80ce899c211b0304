"""Emergency Mode: the fleet-wide level 0-3 (public facade).

::

    from baldur_django import emergency

    emergency.set_level(3, minutes=30, reason="payments and search down", actor="alice")
    emergency.get_level()        # -> 3 (through this process's cache)
    emergency.step_down()        # -> 2 (expiry kept); level 3's freeze is lifted
    emergency.status()           # -> {"level": 2, "expires_at": ..., "reason": ..., "actor": ...,
                                 #     "source": "manual", "backend": "file", ...}
    emergency.check_auto_activation()   # one auto-activation check (what tasks.emergency_check runs)

Level 3 freezes every breaker's automatic decisions; levels 1 and 2 change no
behaviour. A level expires on its own. The level lives in a per-host file
(``BALDUR_EMERGENCY_BACKEND="file"``, ``BALDUR_EMERGENCY_STATE_FILE``) or in Redis
(``"redis"``, the same Redis as the breaker store), and each process caches it for
``BALDUR_EMERGENCY_CACHE_SECONDS``. Every change is published as
:class:`~baldur_django.core.events.EmergencyLevelChanged`, sent as the Django signal
``baldur_django.signals.emergency_level_changed`` and logged on logger ``baldur.emergency``.

Importing this module needs no Django settings; in a Django process the Redis backend
reaches Redis the way the breaker store does (``BALDUR_REDIS_URL`` or the django-redis
alias ``BALDUR_REDIS_CACHE_ALIAS``). The engine is :mod:`baldur_django.core.emergency`.
"""

from __future__ import annotations

from typing import Any

from .core import emergency as _core
from .core import maintenance as _maintenance
from .core.emergency import EmergencyStateError

__all__ = ["set_level", "get_level", "step_down", "status", "check_auto_activation", "EmergencyStateError"]


def _django_redis_client() -> Any:
    from .backends import redis_client

    return redis_client("BALDUR_EMERGENCY_BACKEND='redis'")


_core.set_redis_client_factory(_django_redis_client)


def set_level(level: int, minutes: float | None = None, reason: str = "", actor: str | None = None) -> dict[str, Any]:
    """Set the emergency level for a lifetime.

    Args:
        level (int): 0..3 (booleans are refused); 0 clears.
        minutes (float | None): lifetime in **minutes**, > 0 and <= 1440 (fractions allowed);
            None uses ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``. Ignored for level 0.
        reason (str): free text (at most 1000 characters) for the log, audit and status.
        actor (str | None): who set it.

    Returns:
        dict: :func:`status` after the change; this process sees the new level at once, other
        processes within ``BALDUR_EMERGENCY_CACHE_SECONDS``.

    Raises:
        ConfigError: a bad level, lifetime, reason or actor; nothing is written.
        EmergencyStateError: (a ``BaldurError``) the level could not be stored; nothing changed.
    """
    _core.set_level(level, minutes, reason, actor, source="manual")
    return _core.mode.status()


def get_level() -> int:
    """The effective emergency level, through the process cache (an expired level reads 0).

    Returns:
        int: 0..3. Never raises: a failed read keeps the last level read.
    """
    return _core.current_level()


def step_down(actor: str | None = None) -> int:
    """Lower the level by one, keeping its expiry; 0 stays 0.

    Args:
        actor (str | None): who stepped it down.

    Returns:
        int: the new level.

    Raises:
        EmergencyStateError: the state is unreadable or could not be stored.
    """
    return _core.step_down(actor)


def status() -> dict[str, Any]:
    """The emergency level after a fresh read.

    Returns:
        dict: ``level``, ``expires_at`` (Unix seconds or None), ``reason``, ``actor``,
        ``source`` (``"manual"`` or ``"auto"``), ``backend`` (``"file"`` or ``"redis"``),
        plus ``set_at``, ``frozen`` and ``error`` (None, or why the read failed: the values
        are then the last ones this process read). Never raises.
    """
    return _core.status()


def check_auto_activation() -> dict[str, Any]:
    """Run one auto-activation check under the fleet lock (what ``tasks.emergency_check`` runs).

    Returns:
        dict: ``job``, ``skipped`` (None, ``"locked"``, ``"memory backend"``, ``"store
        unavailable"`` ...), ``breakers`` (registered), ``open``, and ``emergency``: the
        rule's summary (``enabled``, ``ratio``, ``over``, ``streak``, ``declared``,
        ``level``, ``note``).
    """
    return _maintenance.emergency_check().as_dict()
