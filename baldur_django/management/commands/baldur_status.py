"""``manage.py baldur_status [--json] [--service NAME] [--config]``.

Lists the known breakers with state, counts and force, or (``--config``) every effective
``BALDUR_*`` value with where it came from. While an Emergency Mode level is in force it is
shown after the table (and as ``"emergency"`` in the JSON document). A breaker with outbound
stages gets its stages' knobs and this process's figures in a second table (as ``"stages"``
in its JSON row). ``--json`` prints one JSON document and
nothing else on stdout; notices go to stderr. Output is UTF-8 whatever the locale. On the
memory backend it says on stderr that it shows only its own process. An unknown
``--service``, an invalid setting, or a database that ``migrate`` has not prepared yet is a
:class:`CommandError` (exit status 1).

While it runs, the log records of the ``baldur`` loggers are the command's notices: the
command writes them to its own stderr (:func:`command_notices`) instead of handing them to
the project's ``LOGGING``, so a project that sends ``baldur`` to stdout still gets one clean
JSON document there.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from baldur_django import services
from baldur_django.core.errors import ConfigError
from baldur_django.core.names import show_name

__all__ = [
    "Command",
    "utf8_streams",
    "format_time",
    "format_table",
    "command_notices",
    "NoticesToStderrMixin",
    "require_migrated",
]


def require_migrated() -> None:
    """First step of every operator command: before ``manage.py migrate`` has run, stop with
    exit status 1 and say to run it.

    Raises:
        CommandError: a table of the package does not exist yet.
    """
    try:
        services.require_migrated()
    except services.NotMigratedError as exc:
        raise CommandError(str(exc)) from None


def utf8_streams(*streams: Any) -> None:
    """Switch real text streams (``sys.stdout``/``sys.stderr``) to UTF-8 if they are not
    already, so a breaker name in any script prints under a C or Latin-1 locale.

    ``surrogateescape`` writes back the original bytes of text that Python decoded from
    a non-UTF-8 environment (an environment variable read under ``LC_ALL=C``)."""
    for stream in streams:
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding in ("utf-8", "utf8") or not hasattr(stream, "reconfigure"):
            continue
        try:
            stream.reconfigure(encoding="utf-8", errors="surrogateescape")
        except (ValueError, OSError):  # pragma: no cover - a detached or closed stream
            pass


class Utf8OutputMixin:
    """Commands whose output is UTF-8 whatever the locale; a caller's own
    ``stdout``/``stderr`` (``call_command``) are left alone."""

    def execute(self, *args: Any, **options: Any) -> Any:
        if not options.get("stdout"):
            utf8_streams(sys.stdout)
        if not options.get("stderr"):
            utf8_streams(sys.stderr)
        return super().execute(*args, **options)  # type: ignore[misc]


class _Notices(logging.Handler):
    """Hands every record it gets to the command's own ``write`` as one line of text."""

    def __init__(self, write: Callable[[str], Any]) -> None:
        super().__init__(logging.NOTSET)
        self._write = write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            self._write(f"{record.levelname.lower()}: {text}")
        except Exception:  # a notice must never break the command
            pass


@contextmanager
def command_notices(write: Callable[[str], Any], logger_name: str = "baldur") -> Iterator[None]:
    """Make the package's log records the command's own notices while the block runs.

    Every logger of the *logger_name* family (``baldur`` and ``baldur.*``) loses its
    handlers for the duration and propagates to ``baldur``, whose only handler passes each
    record to *write*; nothing reaches the project's ``LOGGING`` handlers (one of which may
    write to stdout) or the root logger. ``baldur`` lets warnings through even when the
    project set it quieter. Everything is put back afterwards, also on an exception.

    Args:
        write: called with one line of text per record (the command's stderr writer).
        logger_name: the family's top logger.

    Returns:
        A context manager.
    """
    top = logging.getLogger(logger_name)
    family = [top] + [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if name.startswith(logger_name + ".") and isinstance(logger, logging.Logger)
    ]
    saved = [(logger, logger.handlers[:], logger.propagate, logger.level, logger.disabled) for logger in family]
    try:
        for logger in family:
            logger.handlers = []
            logger.propagate = True
            logger.disabled = False
        top.handlers = [_Notices(write)]
        top.propagate = False
        if top.getEffectiveLevel() > logging.WARNING:
            top.setLevel(logging.WARNING)
        yield
    finally:
        for logger, handlers, propagate, level, disabled in saved:
            logger.handlers = handlers
            logger.propagate = propagate
            logger.setLevel(level)
            logger.disabled = disabled


class NoticesToStderrMixin:
    """Commands whose notices are written to their own stderr, never through logging.

    Wraps the whole of ``execute()`` (system checks included) in :func:`command_notices`
    writing to the command's stderr (``call_command(stderr=...)`` or ``sys.stderr``).
    """

    def execute(self, *args: Any, **options: Any) -> Any:
        def write(line: str) -> None:
            stream = options.get("stderr") or sys.stderr
            stream.write(line + "\n")
            stream.flush()

        with command_notices(write):
            return super().execute(*args, **options)  # type: ignore[misc]


#: Characters of a name the text table shows (``--json`` shows every name whole): a name
#: from before names were limited must not pad every row to its length.
NAME_COLUMN = 100


def format_time(timestamp: float | None) -> str:
    """Unix seconds -> ``"YYYY-MM-DD HH:MM:SS UTC"``; None -> ``"-"``."""
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_table(header: list[str], rows: Iterable[list[str]]) -> str:
    """Left-aligned plain-text columns separated by two spaces."""
    rows = [header] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    return "\n".join(lines)


class Command(Utf8OutputMixin, NoticesToStderrMixin, BaseCommand):
    help = (
        "Show every known circuit breaker (state, counts, force and expiry), or with --config every "
        "effective BALDUR_* setting and its source. --json prints only JSON on stdout."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON document on stdout")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--service", metavar="NAME", help="show only this breaker (error if unknown)")
        group.add_argument("--config", action="store_true", help="list every effective setting and where it came from")

    def handle(
        self, *args: Any, as_json: bool = False, service: str | None = None, config: bool = False, **options: Any
    ) -> None:
        require_migrated()
        if config:
            self._config(as_json)
            return
        try:
            backend = services.backend_name()
            shared = services.is_shared_backend()
        except ConfigError as exc:
            raise CommandError(f"invalid setting: {exc}") from None
        if not shared:
            self.stderr.write(
                f"Note: {services.MEMORY_NOTICE} This command shows only its own process (pid {os.getpid()}), not your "
                "running workers: look at the Django admin of a running process, or set BALDUR_STATE_BACKEND to "
                "'database' or 'redis' to share breakers."
            )
        try:
            rows = services.status_rows(service)
        except services.UnknownServiceError as exc:
            hint = "" if shared else " (the memory backend shows only this command's own process)"
            raise CommandError(f"{exc}{hint}") from None
        emergency = services.emergency_status()
        if emergency.get("error"):
            self.stderr.write(f"Note: the emergency level could not be read ({emergency['error']}).")
        if as_json:
            document: dict[str, Any] = {
                "backend": backend,
                "shared": shared,
                "scope": "shared store" if shared else f"this process only (pid {os.getpid()})",
                "breakers": rows,
            }
            if emergency["level"] or emergency.get("error"):
                document["emergency"] = emergency  # present while a level is in force
            self.stdout.write(json.dumps(document, indent=2, ensure_ascii=False, default=str))
            return
        self.stdout.write(f"backend: {backend}" + ("" if shared else " (this process only)"))
        self._rows(rows)
        self._stages(rows)
        if emergency["level"]:
            line = services.describe_emergency(emergency)
            self.stdout.write(line[0].upper() + line[1:] + ".")

    def _rows(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            self.stdout.write("No circuit breakers known.")
            return
        table = []
        for row in rows:
            forced = row.get("forced") or "-"
            if row.get("forced") and row.get("force_actor"):
                forced += f" by {show_name(row['force_actor'], limit=NAME_COLUMN)}"
            table.append(
                [
                    show_name(row["service"], limit=NAME_COLUMN),
                    row["state"].upper(),
                    forced,
                    format_time(row.get("force_expires_at")),
                    row["consecutive_failures"],
                    f"{row['window_calls']}/{row['window_failures']}",
                    format_time(row.get("opened_at")),
                    _open_for(row),
                    row.get("last_trigger") or "-",
                ]
            )
        header = [
            "SERVICE",
            "STATE",
            "FORCED",
            "FORCE EXPIRES",
            "CONSECUTIVE",
            "WINDOW CALLS/FAILURES",
            "OPENED AT",
            "OPEN FOR",
            "LAST TRIGGER",
        ]
        self.stdout.write(format_table(header, table))

    def _stages(self, rows: list[dict[str, Any]]) -> None:
        """The outbound stages of the breakers that have any (this process's figures), as a
        second table; nothing when none has."""
        table = [
            [show_name(service, limit=NAME_COLUMN), stage, text] for service, stage, text in services.stage_table(rows)
        ]
        if table:
            self.stdout.write("stages (this process):")
            self.stdout.write(format_table(["SERVICE", "STAGE", "FIGURES"], table))

    def _config(self, as_json: bool) -> None:
        rows = services.config_report()
        if as_json:
            self.stdout.write(json.dumps({"settings": rows}, indent=2, ensure_ascii=False, default=str))
            return
        table = [[row["name"], json.dumps(row["value"], ensure_ascii=False), row["source"]] for row in rows]
        self.stdout.write(format_table(["SETTING", "VALUE", "SOURCE"], table))


def _open_for(row: dict[str, Any]) -> str:
    """The current open's length in seconds and how many opens in a row, or ``-``."""
    duration = row.get("open_duration")
    if row.get("state") != "open" or duration is None:
        return "-"
    return f"{duration:g}s (#{row.get('consecutive_opens') or 1})"
