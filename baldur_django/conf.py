"""``baldur_settings``: every ``BALDUR_*`` knob resolved Django setting -> env -> default.

There is one settings object for the whole process: the core's
:data:`baldur_django.core.config.settings`, built from the defaults table
:data:`baldur_django.core.knobs.KNOBS`. Until Django is ready it reads environment
variables and defaults only (plain-Python use); :func:`install`, called by
``BaldurDjangoConfig.ready()``, puts ``django.conf.settings`` in front of the environment.
Every resolved value remembers where it came from (``baldur_settings.source(name)`` ->
``"setting"``, ``"env"`` or ``"default"``).

The ``setting_changed`` receiver in :mod:`baldur_django.signals` calls :func:`reload`, so
``override_settings`` and the pytest-django ``settings`` fixture take effect at once, for
breakers that already exist too. Nothing here ever writes into
``django.conf.settings``.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from .backends import install_store
from .core.config import MISSING
from .core.config import settings as baldur_settings
from .core.errors import ConfigError
from .core.knobs import KNOBS

__all__ = [
    "baldur_settings",
    "django_lookup",
    "install",
    "reload",
    "reload_or_log",
    "known_settings",
    "closest_setting",
    "format_default",
    "redact",
    "add_reload_hook",
    "remove_reload_hook",
]

logger = logging.getLogger("baldur.config")

_PREFIX = "BALDUR_"
_hooks: list[Callable[[], Any]] = []
_hooks_lock = threading.Lock()


def django_lookup(name: str) -> Any:
    """Return the Django setting *name*, or :data:`MISSING` when it is not defined.

    Args:
        name (str): a ``BALDUR_*`` setting name.

    Returns:
        The raw value (unparsed), or ``MISSING``. A setting explicitly set to ``None``
        is returned as ``None`` (it counts as defined).
    """
    from django.conf import settings

    return getattr(settings, name, MISSING)


def install() -> None:
    """Make the process-wide settings read Django settings first.

    Called by ``BaldurDjangoConfig.ready()``; calling it again is harmless. Drops every
    cached value so the next read resolves through Django.
    """
    baldur_settings.set_lookup(django_lookup)


def known_settings() -> list[str]:
    """Every knob name, in the order of the defaults table."""
    return list(KNOBS)


def closest_setting(name: str) -> str | None:
    """The known knob a misspelt ``BALDUR_*`` *name* most likely meant, or None.

    The shared ``BALDUR_`` prefix is left out of the comparison, so an unrelated name
    (``BALDUR_TEST_DB``) is not matched to a knob merely for sharing the prefix.
    """
    stem = name[len(_PREFIX) :] if name.startswith(_PREFIX) else name
    stems = {knob[len(_PREFIX) :]: knob for knob in KNOBS}
    near = difflib.get_close_matches(stem, stems, n=1, cutoff=0.6)
    return stems[near[0]] if near else None


def format_default(name: str) -> str:
    """The default of knob *name* written as a Python literal for docs and hints.

    Status-code sets read as sorted lists, ``None`` reads ``unset`` and the emergency
    state file names the per-project file used while it is unset.

    Raises:
        KeyError: *name* is not a knob.
    """
    default = KNOBS[name].default
    if name == "BALDUR_EMERGENCY_STATE_FILE" and default is None:
        return "unset (<system temp dir>/baldur_emergency_<project hash>.json)"
    if default is None:
        return "unset"
    if isinstance(default, (set, frozenset)):
        return repr(sorted(default))
    if isinstance(default, str):
        return f'"{default}"'
    return repr(default)


_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@")


def redact(text: str) -> str:
    """Mask the password of any ``scheme://user:password@host`` URL inside *text*.

    Used for every message built from a setting's value (a Redis URL may carry a password).
    """
    return _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:***@", text)


def add_reload_hook(hook: Callable[[], Any]) -> Callable[[], Any]:
    """Call *hook()* after every successful :func:`reload` (e.g. to rebuild a shared store).

    Idempotent; returns *hook* so it can serve as a decorator. A hook that raises is
    logged on logger ``baldur.config`` and the other hooks still run.
    """
    with _hooks_lock:
        if hook not in _hooks:
            _hooks.append(hook)
    return hook


def remove_reload_hook(hook: Callable[[], Any]) -> None:
    """Undo :func:`add_reload_hook` (no error when *hook* was not added)."""
    with _hooks_lock:
        if hook in _hooks:
            _hooks.remove(hook)


def reload(setting: str | None = None) -> None:
    """Drop cached values and re-resolve every breaker's configuration.

    All or nothing: every breaker's new configuration is built first and swapped in only
    when all of them are valid, so a bad value never leaves some breakers on the new
    settings and others on the old. Per-call overrides given to the decorators stay.
    After a failure the settings cache holds no stale values: the next read of the bad
    knob (a new breaker, for instance) raises the same :class:`ConfigError`. When one of
    :data:`baldur_django.backends.STORE_SETTINGS` changed, the shared store is rebuilt and installed after the
    configurations; a store that cannot be built also leaves everything unchanged.

    Args:
        setting (str | None): the Django setting that changed; names outside
            ``BALDUR_*`` are ignored, None reloads unconditionally (use it after changing
            environment variables at run time).

    Raises:
        ConfigError: the changed setting, or a setting some breaker needs, is invalid;
            the message names the setting and the value. Every breaker keeps its previous
            configuration.
    """
    if setting is not None and not setting.startswith(_PREFIX):
        return
    from .core.registry import registry

    baldur_settings.reset()
    if setting is not None:
        if setting in KNOBS:
            baldur_settings.get(setting)  # validate it even when no breaker reads it
        else:
            near = closest_setting(setting)
            logger.warning(
                "Unknown setting %s is ignored by baldur_django%s",
                setting,
                f"; did you mean {near}?" if near else "",
                extra={"setting": setting, "closest": near},
            )
    install_store(before=registry.reconfigure_all)
    for hook in list(_hooks):
        try:
            hook()
        except Exception:
            logger.exception("baldur_django settings reload hook %r failed", hook)


def reload_or_log(setting: str | None = None, *, when: str | None = None) -> bool:
    """:func:`reload`, logging a bad value instead of raising (for signal receivers).

    A receiver of ``setting_changed`` must not raise: ``override_settings`` would undo
    itself and hide the system checks that explain the problem.

    Args:
        setting (str | None): as for :func:`reload`.
        when (str | None): how the log line describes the occasion (default: which
            setting changed).

    Returns:
        bool: True when the reload applied, False when a bad value was logged (ERROR on
        logger ``baldur.config``) and every existing breaker kept its previous configuration.
    """
    try:
        reload(setting)
    except ConfigError as exc:
        logger.error(
            "baldur_django could not apply the BALDUR_* settings (%s): %s. Existing breakers "
            "keep their previous configuration, and whatever reads the bad setting next raises "
            "ConfigError until it is fixed; run `manage.py check` for a hint.",
            when or (f"after {setting} changed" if setting else "on reload"),
            redact(str(exc)),
            extra={"setting": setting},
        )
        return False
    return True
