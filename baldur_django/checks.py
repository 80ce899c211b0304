"""System checks for ``BALDUR_*`` settings (CFG-3).

Each bad value is a ``baldur.E0xx`` error naming the setting and the value, with a
hint; a misspelt ``BALDUR_*`` name is a warning naming the closest known one. The
checks call the same validators as the core, so the message reads the same as a
``ConfigError``.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .core.config import MISSING
from .core.errors import ConfigError
from .core.knobs import KNOBS, closest_knob

__all__ = ["check_settings", "Codes"]


class Codes:
    INVALID_VALUE = "baldur.E001"
    MINIMUM_ABOVE_WINDOW = "baldur.E002"
    UNKNOWN_SETTING = "baldur.W001"


def _ids() -> dict[str, str]:
    # a stable id per knob: E010 + its row number, so a log search finds one setting
    return {name: f"baldur.E{10 + i:03d}" for i, name in enumerate(KNOBS)}


@register(Tags.compatibility)
def check_settings(app_configs=None, **kwargs):
    """Validate every ``BALDUR_*`` Django setting and environment variable."""
    import os

    messages = []
    ids = _ids()
    values = {}
    for name, knob in KNOBS.items():
        raw = getattr(settings, name, MISSING)
        from_env = False
        if raw is MISSING:
            if name not in os.environ:
                continue
            raw, from_env = os.environ[name], True
        try:
            values[name] = knob.coerce(raw, from_env=from_env)
        except ConfigError as exc:
            where = "environment variable" if from_env else "setting"
            messages.append(
                Error(
                    str(exc),
                    hint=f"Fix the {where} {name}: {knob.help}. Default: {knob.default!r}.",
                    id=ids[name],
                )
            )
    window = values.get("BALDUR_CB_SLIDING_WINDOW_SIZE", KNOBS["BALDUR_CB_SLIDING_WINDOW_SIZE"].default)
    minimum = values.get("BALDUR_CB_MINIMUM_CALLS", KNOBS["BALDUR_CB_MINIMUM_CALLS"].default)
    if minimum > window:
        messages.append(
            Error(
                f"BALDUR_CB_MINIMUM_CALLS={minimum!r} is above BALDUR_CB_SLIDING_WINDOW_SIZE={window!r}",
                hint="The rate trigger could never apply: lower BALDUR_CB_MINIMUM_CALLS or widen the window.",
                id=Codes.MINIMUM_ABOVE_WINDOW,
            )
        )
    for name in dir(settings):
        if name.startswith("BALDUR_") and name not in KNOBS:
            near = closest_knob(name)
            messages.append(
                Warning(
                    f"Unknown setting {name}" + (f"; did you mean {near}?" if near else ""),
                    hint="baldur_django ignores settings it does not know. See docs/settings.md.",
                    id=Codes.UNKNOWN_SETTING,
                )
            )
    return messages
