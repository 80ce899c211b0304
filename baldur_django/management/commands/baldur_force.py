"""``manage.py baldur_force {open,close,release} SERVICE [--ttl MINUTES] [--reason TEXT] [--new]``.

Forces a breaker open or closed for a lifetime in minutes, or releases it, through
:mod:`baldur_django.services` (audit source ``command``, actor ``command:<OS user>``).

* Bad input (a lifetime that is not a number, <= 0 or above 1440; ``--ttl`` with
  ``release``; an empty name; a reason too long) exits non-zero with a message and
  changes nothing.
* A name that no process or setting knows (not in the shared registry, ``BALDUR_SERVICES``
  or ``BALDUR_DOMAIN_MAPPING``) is refused (non-zero) with the closest known names, so a
  typo creates no ghost breaker; ``--new`` forces a service before its first call.
* On the memory backend it refuses (non-zero): a force made in this short-lived process
  could not reach the running workers, which each keep their own breakers.
* A force the shared store could not record exits non-zero.
* Before ``manage.py migrate`` it exits 1 saying to run it.
* Releasing a breaker that was not forced exits 0 and says so.
"""

from __future__ import annotations

import getpass
import math
import os
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from baldur_django import services
from baldur_django.core.errors import BaldurError, ConfigError
from baldur_django.core.knobs import MAX_LIFETIME_MINUTES
from baldur_django.core.names import name_problem, show_name

from .baldur_status import Utf8OutputMixin, format_time, require_migrated

__all__ = ["Command", "MEMORY_REFUSAL", "parse_ttl", "command_actor"]

MEMORY_REFUSAL = (
    f"Refusing to act: {services.MEMORY_NOTICE} "
    "A force made by this command would live only in this short-lived process and cannot reach the "
    "running workers. Use the Django admin of a running process, call baldur_django.force_open_circuit() "
    "inside the process, or switch BALDUR_STATE_BACKEND to 'database' or 'redis'."
)


def parse_ttl(raw: str | None) -> float | None:
    """Parse ``--ttl``: minutes, a number > 0 and <= 1440; None when not given.

    Raises:
        CommandError: not a number, NaN/infinite or out of range.
    """
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise CommandError(
            f"--ttl {raw!r}: expected a number of minutes (more than 0, at most {MAX_LIFETIME_MINUTES})"
        ) from None
    if not math.isfinite(value) or value <= 0 or value > MAX_LIFETIME_MINUTES:
        raise CommandError(
            f"--ttl {raw!r}: the lifetime must be more than 0 and at most {MAX_LIFETIME_MINUTES} minutes (24 hours)"
        )
    return value


def command_actor() -> str:
    """``"command:<OS user name>"`` (``"command:uid-<n>"`` when the name is unknown)."""
    try:
        return f"command:{getpass.getuser()}"
    except Exception:
        uid = getattr(os, "getuid", lambda: None)()
        return f"command:uid-{uid}" if uid is not None else "command"


class Command(Utf8OutputMixin, BaseCommand):
    help = (
        "Force a circuit breaker open or closed for a lifetime (minutes), or release it back to "
        "automatic judgement. Needs a shared state backend (database or redis)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["open", "close", "release"], help="force open, force closed, or release")
        parser.add_argument("service", metavar="SERVICE", help="the breaker's name")
        parser.add_argument(
            "--ttl",
            metavar="MINUTES",
            default=None,
            help=f"lifetime of the force in minutes, more than 0 and at most {MAX_LIFETIME_MINUTES} (default BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES)",
        )
        parser.add_argument("--reason", metavar="TEXT", default="", help="why; recorded in the log and the audit")
        parser.add_argument(
            "--new",
            action="store_true",
            help="force a service that no process or setting knows yet (before its first call)",
        )

    def handle(
        self,
        *args: Any,
        action: str,
        service: str,
        ttl: str | None = None,
        reason: str = "",
        new: bool = False,
        **options: Any,
    ) -> None:
        require_migrated()
        minutes = _checked_ttl(action, service, ttl, reason, new)
        _require_shared_backend()
        actor = command_actor()
        if action == "release":
            changed = _run(
                action,
                service,
                lambda: services.release(service, actor=actor, source="command", reason=reason, allow_unknown=False),
            )
            if changed:
                self.stdout.write(f"Released {service!r}: back to automatic judgement.")
            else:
                self.stdout.write(f"{service!r} was not forced: nothing to release, nothing changed.")
            return
        snapshot = _run(
            action,
            service,
            lambda: services.force(
                service, action, minutes, reason=reason, actor=actor, source="command", allow_new=new
            ),
        )
        what = "open" if action == "open" else "closed"
        used = minutes if minutes is not None else services.default_ttl_minutes()
        self.stdout.write(
            f"Forced {service!r} {what} for {used:g} minute{'' if used == 1 else 's'} (until {format_time(snapshot.get('force_expires_at'))}); "
            f"state now {snapshot.get('state')}."
        )


def _checked_ttl(action: str, service: str, ttl: str | None, reason: str, new: bool) -> float | None:
    """Refuse bad input before anything is touched; returns the lifetime in minutes (None: the default)."""
    if not service:
        raise CommandError("SERVICE: a breaker name must be a non-empty string")
    if action != "release" and name_problem(service) is not None:  # a release may clean up an old odd name
        raise CommandError(
            f"SERVICE {show_name(service, limit=60)} is not a valid breaker name: it {name_problem(service)}. "
            "Nothing was changed."
        )
    if action == "release" and ttl is not None:
        raise CommandError("--ttl applies to 'open' and 'close' only; a release has no lifetime")
    if action == "release" and new:
        raise CommandError("--new applies to 'open' and 'close' only; there is nothing to release on a new service")
    minutes = parse_ttl(ttl)
    if len(reason) > services.MAX_REASON_LENGTH:
        raise CommandError(f"--reason: {len(reason)} characters, at most {services.MAX_REASON_LENGTH} allowed")
    return minutes


def _require_shared_backend() -> None:
    """Refuse on the memory backend: a force made here could not reach the running workers."""
    try:
        shared = services.is_shared_backend()
    except ConfigError as exc:
        raise CommandError(f"invalid setting: {exc}") from None
    if not shared:
        raise CommandError(MEMORY_REFUSAL)


def _run(action: str, service: str, act: Callable[[], Any]) -> Any:
    """Call *act* (the force or release), turning its errors into the command's messages."""
    try:
        return act()
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    except services.UnknownServiceError as exc:
        text = str(exc) if str(exc).endswith("?") else f"{exc}."
        text += " No process or setting (the shared registry, BALDUR_SERVICES, BALDUR_DOMAIN_MAPPING) knows it"
        if action != "release":
            text += "; pass --new to force a service before its first call"
        raise CommandError(text + ". Nothing was changed.") from None
    except BaldurError as exc:
        verb = "release" if action == "release" else "force"
        raise CommandError(f"the {verb} of {service!r} was not stored, nothing changed for the fleet: {exc}") from None
