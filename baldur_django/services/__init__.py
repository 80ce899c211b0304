"""Operator use cases, shared by the admin, the management commands and tasks .

Every operator surface is a thin shell over this package: it parses its own input, calls
one function here and formats the answer. Nothing here knows about HTTP or argparse.

* :func:`force` / :func:`release` -- force a breaker open or closed with a lifetime, or
  hand it back to automatic judgement, tagging the audit row with its source.
  :func:`known_services` / :func:`check_known` decide which names exist, so a typo
  creates no ghost breaker.
* :func:`forget` -- remove a breaker from the shared record and registry, audited.
* :func:`require_migrated` -- every operator command first makes sure ``migrate`` has
  created the package's tables.
* :func:`status_rows` -- one row per known breaker; :func:`status_page` one page
  of them for the admin, read from the store's records without creating breakers.
* :func:`config_report` -- every effective ``BALDUR_*`` value and where it came from.
* :func:`emergency_status` / :func:`set_emergency_level` / :func:`step_down_emergency` --
  Emergency Mode's level for the admin and ``baldur_emergency``.
* :func:`install_audit_listener` -- the bus listener that writes :class:`BreakerAudit`
  rows for every force and release, and every emergency level change, from any source.
"""

from __future__ import annotations

from ..core.config import settings as settings  # re-exported: the commands read it
from .audit import audit_listener, install_audit_listener, uninstall_audit_listener
from .common import (
    MAX_REASON_LENGTH,
    MEMORY_NOTICE,
    SOURCES,
    BreakerForcedError,
    NotMigratedError,
    UnknownServiceError,
    backend_name,
    default_ttl_minutes,
    is_shared_backend,
    missing_tables,
    require_migrated,
    validate_lifetime,
)
from .common import (
    TASK_SOURCE as TASK_SOURCE,
)
from .config import config_report
from .emergency import (
    LEVEL_MEANINGS,
    describe_emergency,
    emergency_status,
    set_emergency_level,
    step_down_emergency,
)
from .forces import force, forget, release
from .names import check_known, closest_services, known_services
from .stages import stage_lines, stage_table
from .status import (
    PAGE_SIZE,
    STATUS_BATCH,
    record_row,
    status_names,
    status_page,
    status_rows,
    status_rows_for,
)
from .status import (
    ROW_CONFIG_KEYS as ROW_CONFIG_KEYS,
)

__all__ = [
    "stage_lines",
    "stage_table",
    "UnknownServiceError",
    "BreakerForcedError",
    "NotMigratedError",
    "missing_tables",
    "require_migrated",
    "forget",
    "known_services",
    "closest_services",
    "check_known",
    "SOURCES",
    "MAX_REASON_LENGTH",
    "MEMORY_NOTICE",
    "backend_name",
    "is_shared_backend",
    "default_ttl_minutes",
    "validate_lifetime",
    "force",
    "release",
    "status_rows",
    "status_names",
    "status_page",
    "status_rows_for",
    "record_row",
    "PAGE_SIZE",
    "STATUS_BATCH",
    "config_report",
    "emergency_status",
    "describe_emergency",
    "LEVEL_MEANINGS",
    "set_emergency_level",
    "step_down_emergency",
    "audit_listener",
    "install_audit_listener",
    "uninstall_audit_listener",
]
