"""System checks of the outbound stages' knobs, beyond each value's own validation.

A bad value of any stage knob is already an error with the knob's own id
(:func:`baldur_django.checks.check_settings`). Here:

* ``baldur.E112``: ``BALDUR_BULKHEAD_SCOPE = "fleet"`` (or a ``BALDUR_SERVICES`` entry's
  ``bulkhead_scope``) without the Redis state backend: a fleet-wide bulkhead counts its
  slots in Redis;
* ``baldur.E113``: the same for ``BALDUR_RETRY_BUDGET_SCOPE`` / ``retry_budget_scope``;
* ``baldur.W006`` (the reserved-knob warning of the settings) for a ``BALDUR_SERVICES``
  entry that sets a key of a stage that is not built yet: the value has no effect.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from .conf import django_lookup
from .core.config import SettingsSource
from .core.knobs import KNOBS, RESERVED

__all__ = ["StageCodes", "check_stages"]


class StageCodes:
    """Ids of the stage checks that are not one knob's bad value."""

    BULKHEAD_FLEET_WITHOUT_REDIS = "baldur.E112"
    RETRY_BUDGET_FLEET_WITHOUT_REDIS = "baldur.E113"
    RESERVED_SERVICE_KEY = "baldur.W006"


#: scope knob -> (its per-call / BALDUR_SERVICES key, the check id, what counts in Redis)
_FLEET_SCOPES = {
    "BALDUR_BULKHEAD_SCOPE": ("bulkhead_scope", StageCodes.BULKHEAD_FLEET_WITHOUT_REDIS, "the bulkhead's slots"),
    "BALDUR_RETRY_BUDGET_SCOPE": (
        "retry_budget_scope",
        StageCodes.RETRY_BUDGET_FLEET_WITHOUT_REDIS,
        "the retry budget's counts",
    ),
}

#: per-call / BALDUR_SERVICES keys of the stages that are not built yet
_RESERVED_KEYS = {KNOBS[name].key: name for name in RESERVED if KNOBS[name].key}


def _read(source: SettingsSource, name: str) -> Any:
    """The knob's value, or None when it is bad (its own check reports that; a validator
    that fails unexpectedly is reported there too, so it is never raised here)."""
    try:
        return source.get(name)
    except Exception:
        return None


@register("baldur")
def check_stages(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Check the stage knobs against each other and the state backend.

    Returns:
        list[CheckMessage]: E112 / E113 for a fleet scope (global or in a
        ``BALDUR_SERVICES`` entry) without ``BALDUR_STATE_BACKEND = "redis"``; W006 for a
        ``BALDUR_SERVICES`` entry setting a key of a stage not built yet. Never raises.
    """
    source = SettingsSource(lookup=django_lookup)
    redis = _read(source, "BALDUR_STATE_BACKEND") == "redis"
    services = _read(source, "BALDUR_SERVICES") or {}
    messages: list[CheckMessage] = []
    for name, (key, code, what) in _FLEET_SCOPES.items():
        if redis:
            break
        places = [name] if _read(source, name) == "fleet" else []
        places += [f"BALDUR_SERVICES[{svc!r}][{key!r}]" for svc, entry in services.items() if entry.get(key) == "fleet"]
        messages.extend(
            Error(
                f"{place}='fleet' needs the Redis state backend: {what} are kept in Redis",
                hint="Set BALDUR_STATE_BACKEND = 'redis' (with BALDUR_REDIS_URL), or use the scope 'worker'.",
                id=code,
            )
            for place in places
        )
    for service, entry in services.items():
        for key in sorted(set(entry) & set(_RESERVED_KEYS)):
            messages.append(
                Warning(
                    f"BALDUR_SERVICES[{service!r}][{key!r}] has no effect: the feature behind it is not built yet",
                    hint=f"{key} ({KNOBS[_RESERVED_KEYS[key]].help}) is reserved: baldur_django reads and "
                    "validates it, but this version does not act on it. Remove it to silence this warning.",
                    id=StageCodes.RESERVED_SERVICE_KEY,
                )
            )
    return messages
