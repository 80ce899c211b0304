"""``manage.py baldur_emergency {status [--json], set LEVEL [--minutes M] [--reason TEXT], step-down}``.

Shows, sets or steps down the Emergency Mode level through :mod:`baldur_django.services`
(audit source ``command``, actor ``command:<OS user>``).

* ``status`` prints the level in force, its expiry, who set it and why; ``--json`` prints
  one JSON document and nothing else on stdout. A state that cannot be read exits non-zero.
* ``set LEVEL``: LEVEL is 0, 1, 2 or 3 (0 clears); ``--minutes`` more than 0 and at most
  1440 (default ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``). Bad input exits non-zero and
  writes nothing; so does a level that could not be stored.
* ``step-down`` lowers the level by one, keeping its expiry; at 0 it exits 0 saying so.

Notices go to stderr, written by the command (never through logging); output is UTF-8
whatever the locale. Before ``manage.py migrate`` it exits 1 saying to run it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from baldur_django import services
from baldur_django.core.emergency.backends import project_level_file
from baldur_django.core.errors import BaldurError, ConfigError
from baldur_django.core.knobs import MAX_LIFETIME_MINUTES

from .baldur_force import command_actor
from .baldur_status import Utf8OutputMixin, format_time, require_migrated

__all__ = ["Command", "command_text", "parse_level", "parse_minutes"]


def command_text(raw: str) -> str:
    """Command-line text as the user typed it: under a C/POSIX locale Python decodes argv as
    ASCII with ``surrogateescape``; the original bytes are UTF-8."""
    try:
        return raw.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeError:
        return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def parse_level(raw: str) -> int:
    """``"0"``..``"3"`` -> int. Raises CommandError for anything else."""
    text = (raw or "").strip()
    if text not in ("0", "1", "2", "3"):
        raise CommandError(f"LEVEL {raw!r}: expected 0, 1, 2 or 3 (0 clears the emergency)")
    return int(text)


def parse_minutes(raw: str | None) -> float | None:
    """``--minutes``: a number > 0 and <= 1440; None when not given. Raises CommandError."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise CommandError(
            f"--minutes {raw!r}: expected a number of minutes (more than 0, at most {MAX_LIFETIME_MINUTES})"
        ) from None
    if not math.isfinite(value) or value <= 0 or value > MAX_LIFETIME_MINUTES:
        raise CommandError(
            f"--minutes {raw!r}: the lifetime must be more than 0 and at most {MAX_LIFETIME_MINUTES} minutes (24 hours)"
        )
    return value


class Command(Utf8OutputMixin, BaseCommand):
    help = (
        "Show, set or step down the Emergency Mode level (0 normal, 3 freezes every breaker's "
        "automatic decisions). status [--json] | set LEVEL [--minutes M] [--reason TEXT] | step-down"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", metavar="{status,set,step-down}", required=True)
        status = sub.add_parser("status", help="show the level in force")
        status.add_argument("--json", action="store_true", dest="as_json", help="print one JSON document on stdout")
        set_ = sub.add_parser("set", help="set the level for a lifetime")
        set_.add_argument("level", metavar="LEVEL", help="0, 1, 2 or 3 (0 clears)")
        set_.add_argument(
            "--minutes",
            metavar="M",
            default=None,
            help=f"lifetime in minutes, more than 0 and at most {MAX_LIFETIME_MINUTES} (default BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES)",
        )
        set_.add_argument(
            "--reason", metavar="TEXT", default="", help="why; recorded in the log, the audit and the status"
        )
        sub.add_parser("step-down", help="lower the level by one (its expiry is kept)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        require_migrated()
        self._scope_notice()
        if action == "status":
            self._status(bool(options.get("as_json")))
        elif action == "set":
            self._set(options["level"], options.get("minutes"), command_text(options.get("reason") or ""))
        else:
            self._step_down()

    def _scope_notice(self) -> None:
        try:
            backend = services.settings.get("BALDUR_EMERGENCY_BACKEND")
            shared = services.is_shared_backend()
        except ConfigError as exc:
            raise CommandError(f"invalid setting: {exc}") from None
        if backend == "file" and shared:
            self.stderr.write(
                "Note: BALDUR_EMERGENCY_BACKEND is 'file': the level is kept on this host only "
                f"({services.settings.get('BALDUR_EMERGENCY_STATE_FILE') or project_level_file()}); processes on other hosts "
                "do not see it. Use BALDUR_EMERGENCY_BACKEND='redis' for a fleet."
            )

    def _read(self) -> dict[str, Any]:
        try:
            return services.emergency_status(strict=True)
        except BaldurError as exc:
            raise CommandError(str(exc)) from None

    def _status(self, as_json: bool) -> None:
        status = self._read()
        if as_json:
            self.stdout.write(json.dumps(status, indent=2, ensure_ascii=False, default=str))
            return
        self.stdout.write(services.describe_emergency(status) + ".")
        if status["level"]:
            self.stdout.write(f"expires: {format_time(status.get('expires_at'))}")
        self.stdout.write(f"backend: {status['backend']}")

    def _set(self, raw_level: str, raw_minutes: str | None, reason: str) -> None:
        level = parse_level(raw_level)
        minutes = parse_minutes(raw_minutes)
        if len(reason) > services.MAX_REASON_LENGTH:
            raise CommandError(f"--reason: {len(reason)} characters, at most {services.MAX_REASON_LENGTH} allowed")
        before = self._read()["level"]
        try:
            status = services.set_emergency_level(
                level, minutes, reason=reason, actor=command_actor(), source="command"
            )
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        except BaldurError as exc:
            raise CommandError(f"the emergency level was not stored, nothing changed: {exc}") from None
        if level == 0:
            self.stdout.write(f"Emergency level cleared (was {before}).")
        else:
            self.stdout.write(
                f"Emergency level {level} until {format_time(status.get('expires_at'))} (was {before}). "
                f"Other processes see it within BALDUR_EMERGENCY_CACHE_SECONDS."
            )

    def _step_down(self) -> None:
        try:
            status = services.step_down_emergency(actor=command_actor(), source="command")
        except BaldurError as exc:
            raise CommandError(f"the emergency level was not stepped down, nothing changed: {exc}") from None
        if not status["changed"]:
            self.stdout.write("Emergency level is 0: nothing to step down, nothing changed.")
            return
        self.stdout.write(
            f"Emergency level {status['previous']} -> {status['level']}"
            + (f" (expiry kept: {format_time(status.get('expires_at'))})." if status["level"] else ".")
        )
