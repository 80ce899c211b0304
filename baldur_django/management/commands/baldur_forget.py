"""``manage.py baldur_forget SERVICE [--yes] [--reason TEXT]``.

Removes a breaker from the shared record and the registry of breakers through
:func:`baldur_django.services.forget` (audit action ``forget``, source ``command``, actor
``command:<OS user>``): the way to get rid of a name created by mistake, or of a service
that no longer exists.

* Without ``--yes`` it asks for confirmation on the terminal. When stdin is not a
  terminal (cron, CI, a pipe) it refuses at once (non-zero) and says to pass ``--yes``,
  rather than wait for an answer that never comes. Any answer but ``y``/``yes`` cancels
  (non-zero, nothing changed).
* A forced breaker is refused (non-zero): release it first.
* A name neither the shared registry nor this process has is refused (non-zero) with the
  closest registered names.
* Before ``manage.py migrate`` it exits 1 saying to run it.
* On the memory backend every process keeps its own breakers: it says so on stderr, and
  can only forget what this short-lived process itself knows.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from baldur_django import services
from baldur_django.core.errors import BaldurError, ConfigError

from .baldur_emergency import command_text
from .baldur_force import command_actor
from .baldur_status import Utf8OutputMixin, require_migrated

__all__ = ["Command", "confirmed"]


def confirmed(service: str, stdin: Any, write: Any) -> bool:
    """Ask on the terminal whether to forget *service*.

    Args:
        service: the breaker's name.
        stdin: the stream the answer is read from; must be a terminal.
        write: writes the question (the command's stderr).

    Returns:
        bool: True for ``y`` or ``yes`` (any case); False for anything else or end of input.

    Raises:
        CommandError: *stdin* is missing, closed or not a terminal (so nobody could answer).
    """
    try:
        interactive = stdin is not None and not stdin.closed and stdin.isatty()
    except (AttributeError, ValueError, OSError):
        interactive = False
    if not interactive:
        raise CommandError(
            f"refusing to forget {service!r} without confirmation: stdin is not a terminal, so nobody can answer. "
            "Pass --yes to confirm on the command line. Nothing was changed."
        )
    write(
        f"Forget circuit breaker {service!r}? Its shared record and registry entry are removed "
        "(a process still using it registers it again, fresh). Type 'yes' to confirm: "
    )
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


class Command(Utf8OutputMixin, BaseCommand):
    help = (
        "Remove a circuit breaker from the shared record and the registry of breakers (a name made by "
        "mistake, a service that is gone). Refused while the breaker is forced. Asks for confirmation "
        "unless --yes."
    )
    stealth_options = ("stdin",)  # call_command(stdin=...) in tests, as createsuperuser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("service", metavar="SERVICE", help="the breaker's name")
        parser.add_argument(
            "--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)"
        )
        parser.add_argument("--reason", metavar="TEXT", default="", help="why; recorded in the audit")

    def handle(self, *args: Any, service: str, yes: bool = False, reason: str = "", **options: Any) -> None:
        require_migrated()
        service = command_text(service)
        if not service:
            raise CommandError("SERVICE: a breaker name must be a non-empty string")
        if len(reason) > services.MAX_REASON_LENGTH:
            raise CommandError(f"--reason: {len(reason)} characters, at most {services.MAX_REASON_LENGTH} allowed")
        try:
            shared = services.is_shared_backend()
        except ConfigError as exc:
            raise CommandError(f"invalid setting: {exc}") from None
        if not shared:
            self.stderr.write(
                f"Note: {services.MEMORY_NOTICE} This command can forget only a breaker of its own short-lived "
                "process, not one of your running workers: use the Django admin of a running process."
            )
        if not yes and not confirmed(service, options.get("stdin") or sys.stdin, self._ask):
            raise CommandError(f"cancelled: {service!r} was not forgotten, nothing changed.")
        try:
            result = services.forget(service, actor=command_actor(), source="command", reason=command_text(reason))
        except services.UnknownServiceError as exc:
            text = str(exc) if str(exc).endswith("?") else f"{exc}."
            raise CommandError(f"{text} Nothing was changed.") from None
        except services.BreakerForcedError as exc:
            raise CommandError(f"{exc}. Nothing was changed.") from None
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        except BaldurError as exc:
            raise CommandError(f"{exc}") from None
        where = "the shared record and registry" if result["shared"] else "this process (memory backend)"
        self.stdout.write(f"Forgot {service!r} (was {str(result['state']).upper()}): removed from {where}.")

    def _ask(self, text: str) -> None:
        self.stderr.write(text, ending="")
        self.stderr.flush()
