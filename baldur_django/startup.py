"""Refuse to start a server on settings the system checks reject.

``manage.py check``, ``runserver`` and ``migrate`` run Django's system checks and stop on an
error, but gunicorn, uvicorn or a Celery worker never run them: a misspelt or bad ``BALDUR_*``
value would otherwise surface as a ``ConfigError`` on the first request that reads it. So the
app's ``ready()`` runs the package's own setting checks once and raises
:class:`~django.core.exceptions.ImproperlyConfigured` before the first request can be served.
Management commands are left to Django's check framework, which prints each error with its id
and hint and exits with status 1.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from types import FrameType

from django.conf import settings
from django.core.checks import CheckMessage
from django.core.exceptions import ImproperlyConfigured

# Django's command-line entry point: while a frame of it is on the stack, django.setup() was
# called by a management command, whose own check run reports the errors.
_MANAGEMENT = ("django", "core", "management")


def _called_by_management_command() -> bool:
    frame: FrameType | None = inspect.currentframe()  # this function's own frame first: not Django's
    while frame is not None:
        parts = frame.f_code.co_filename.replace("\\", "/").split("/")
        if tuple(parts[-4:-1]) == _MANAGEMENT:
            return True
        frame = frame.f_back
    return False


def blocking_errors(messages: Iterable[CheckMessage]) -> list[CheckMessage]:
    """The messages that must stop a start: errors (or worse) not named in ``SILENCED_SYSTEM_CHECKS``.

    Args:
        messages (Iterable[CheckMessage]): what the package's checks returned.

    Returns:
        list[CheckMessage]: the serious, unsilenced ones, in their order.
    """
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()) or ())
    return [m for m in messages if m.is_serious() and m.id not in silenced]


def refuse_bad_settings(check: Callable[[], list[CheckMessage]], *, force: bool = False) -> None:
    """Raise when the package's setting checks find an error, unless a management command runs.

    Args:
        check (Callable[[], list[CheckMessage]]): the check to run (it never raises).
        force (bool): check even under a management command (for tests).

    Raises:
        ImproperlyConfigured: naming every blocking error with its id and hint, so the
            server's log says what to fix before any request is served.
    """
    if not force and _called_by_management_command():
        return
    errors = blocking_errors(check())
    if not errors:
        return
    lines = [f"{m.id}: {m.msg}" + (f"\n    HINT: {m.hint}" if m.hint else "") for m in errors]
    raise ImproperlyConfigured(
        f"baldur_django: {len(errors)} setting error(s) stop the start (`manage.py check` lists them too):\n"
        + "\n".join(lines)
    )
