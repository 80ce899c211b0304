"""Status rows of the known breakers, read without creating breakers."""

from __future__ import annotations

import logging
from typing import Any

from ..core import emergency as emergency_core
from ..core import registry as registry_module
from ..core.config import build_config
from ..core.errors import ConfigError
from ..core.events import ForceLapsed, bus
from ..core.stores.base import Answer, Record
from .common import UnknownServiceError
from .names import closest_services, store_names

_log = logging.getLogger("baldur.audit")


def status_rows(service: str | None = None) -> list[dict[str, Any]]:
    """Rows of the known breakers, sorted by name.

    This is the one place that decides which breakers are "known": the breakers of this
    process's registry plus, with a shared store, every name in the store's registry.

    With *service*, the breaker is loaded into this process on first use (which adopts its
    shared record) and its :meth:`CircuitBreaker.snapshot` is returned. Without it, the rows
    come from :func:`status_rows_for` over every known name, read a batch of
    :data:`STATUS_BATCH` records per store round trip where the store can: a breaker this
    process does not hold is described from its shared record and is *not* created here
    (a fresh worker listing 10,000 breakers no longer builds 10,000 of them).

    Args:
        service: only this breaker; None for all.

    Returns:
        A list of row dicts (keys as :meth:`CircuitBreaker.snapshot`: ``service``,
        ``state``, ``consecutive_failures``, ``window_calls``, ``window_failures``,
        ``opened_at``, ``forced``, ``force_expires_at`` (Unix seconds), ``force_reason``,
        ``force_actor``, ``dry_run_rejections``, ``backend``..., plus ``from_record``; see
        :func:`record_row` for what a row read from a record cannot know). Reading them
        applies due lapses and recovery timeouts and never takes a trial slot.

    Raises:
        UnknownServiceError: *service* is given and not known here or in the shared store
            (``suggestions``: the closest names that are).
        ConfigError: a ``BALDUR_SERVICES`` entry is invalid (the configuration of a row
            read from a record is resolved from the settings).
    """
    registry = registry_module.registry
    if service is not None:
        breaker = registry.get(service, create=False) if isinstance(service, str) and service else None
        stored = store_names() if breaker is None else []
        if breaker is None and isinstance(service, str) and service in stored:
            breaker = registry.get(service)
        if breaker is None:
            registered = set(registry.names()) | set(stored)
            raise UnknownServiceError(str(service), closest_services(str(service), registered))
        return [_held_row(breaker)]
    names = status_names()
    rows: list[dict[str, Any]] = []
    for start in range(0, len(names), STATUS_BATCH):
        rows.extend(status_rows_for(names[start : start + STATUS_BATCH]))
    return rows


#: Rows of one admin page (:func:`status_page`'s default *limit*).
PAGE_SIZE = 100
#: Records :func:`status_rows` reads per store round trip when the store has a bulk read.
STATUS_BATCH = 500


def status_names() -> list[str]:
    """Every known breaker name, sorted: this process's breakers plus the names in the
    shared store's registry. Reads the store's name registry only (one
    round trip on Redis); no record is read and no breaker is created.

    Returns:
        list[str]: the names, sorted; this process's names only when the store cannot
        answer (a warning is logged).
    """
    return sorted(set(registry_module.registry.names()) | set(store_names()))


def status_page(offset: int = 0, limit: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], int]:
    """One page of :func:`status_rows`, for the admin's breaker list.

    The names are sorted as in :func:`status_rows`; only the page's records are read, in
    one bulk store call where the store offers ``inspect_many`` (else one ``inspect`` per
    name of the page), and no breaker is created.

    Args:
        offset: rows to skip (an int >= 0).
        limit: rows to return at most (an int >= 1).

    Returns:
        tuple[list[dict], int]: the page's rows (as :func:`status_rows_for`) and the number
        of known breakers in all.

    Raises:
        ConfigError: *offset* or *limit* is not an int in range, or a ``BALDUR_SERVICES``
            entry is invalid.
    """
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ConfigError(f"status page offset {offset!r}: must be an int >= 0")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigError(f"status page limit {limit!r}: must be an int >= 1")
    names = status_names()
    return status_rows_for(names[offset : offset + limit]), len(names)


def status_rows_for(names: list[str]) -> list[dict[str, Any]]:
    """The rows of breakers *names*, in that order, without creating any breaker.

    A breaker this process holds gives its :meth:`CircuitBreaker.snapshot`
    (``from_record`` False). Every other name is read from the shared store, all of them in
    one ``store.inspect_many(names, frozen=...)`` call when the store has it (the Redis
    store pipelines it: one round trip), else one ``store.inspect`` per name, and described
    by :func:`record_row` (``from_record`` True). A force that the read lapses is announced
    (``force_lapsed``), as a breaker adopting the record would. Callers decide which names
    are known (:func:`status_names`); a name the store has no record of reads as a fresh
    CLOSED record.

    Args:
        names: breaker names (non-empty strings); their number is the caller's batch size.

    Returns:
        list[dict]: one row per name. When the store cannot answer, a name this process
        does not hold gets the row of a fresh CLOSED record with ``store_available`` False
        (what a breaker created now would judge locally) and a warning is logged.

    Raises:
        ConfigError: a ``BALDUR_SERVICES`` entry is invalid.
    """
    registry = registry_module.registry
    held = {name: registry.get(name, create=False) for name in names}
    missing = [name for name in names if held[name] is None]
    store = registry.store
    answers: dict[str, Answer | None] = {}
    if missing:
        answers = dict(zip(missing, _inspect_many(store, missing), strict=True))
    configs = _RowConfigs(registry.source, registry.clock)
    backend = store.backend if store is not None else "memory"
    rows = []
    for name in names:
        breaker = held[name]
        if breaker is not None:
            rows.append(_held_row(breaker))
        else:
            rows.append(record_row(name, answers.get(name), configs.get(name), backend))
    return rows


def _held_row(breaker: Any) -> dict[str, Any]:
    row: dict[str, Any] = breaker.snapshot()
    row["from_record"] = False
    return row


def _inspect_many(store: Any, names: list[str]) -> list[Answer | None]:
    """The store's answers for *names* (None each when there is no store or it failed)."""
    if store is None:
        return [None] * len(names)
    frozen = emergency_core.frozen()
    try:
        many = getattr(store, "inspect_many", None)
        answers: list[Answer | None]
        if many is not None:
            answers = list(many(names, frozen=frozen))
        else:
            answers = [store.inspect(name, frozen=frozen) for name in names]
    except Exception as exc:  # show what can be shown rather than fail
        _log.warning(
            "baldur.status_store_unavailable: the shared records of %d breaker(s) could not be read (%s); "
            "showing them as a fresh breaker would judge them locally",
            len(names),
            type(exc).__name__,
        )
        return [None] * len(names)
    for name, answer in zip(names, answers, strict=True):
        if answer is not None and answer.lapsed is not None:  # this read lapsed it: announce
            bus.publish(
                ForceLapsed(
                    name, answer.now, previous=answer.lapsed, from_state=answer.lapsed, to_state=answer.record.state
                )
            )
    return answers


class _RowConfigs:
    """The settings' configuration of breakers this process does not hold, as the snapshot's
    ``config`` dict: built once for every name without a ``BALDUR_SERVICES`` entry (they
    all resolve alike), once per name with one."""

    def __init__(self, source: Any, clock: Any) -> None:
        self._source = source
        self._clock = clock
        self._services = source.get("BALDUR_SERVICES")
        self._default: dict[str, Any] | None = None

    def get(self, name: str) -> dict[str, Any]:
        if name in self._services:
            return self._build(name)
        if self._default is None:
            self._default = self._build(name)
        return dict(self._default)

    def _build(self, name: str) -> dict[str, Any]:
        config = build_config(name, {}, self._source, self._clock)
        return {key: getattr(config, key) for key in ROW_CONFIG_KEYS}


#: The keys of a row's ``config`` dict (as :meth:`CircuitBreaker.snapshot`'s).
ROW_CONFIG_KEYS = (
    "failure_threshold",
    "failure_rate_threshold",
    "sliding_window_size",
    "sliding_window_type",
    "sliding_window_seconds",
    "recovery_backoff_factor",
    "recovery_timeout_max",
    "slow_call_duration",
    "slow_call_rate_threshold",
    "minimum_calls",
    "recovery_timeout",
    "half_open_max_calls",
)


def record_row(name: str, answer: Answer | None, config: dict[str, Any], backend: str) -> dict[str, Any]:
    """The status row of breaker *name* built from its shared record, for a breaker this
    process does not hold.

    The keys are those of :meth:`CircuitBreaker.snapshot`. What the shared record holds is
    exact: ``state``, ``opened_at``, ``open_until``, ``open_duration`` (the backed-off
    length of the current or last open), ``consecutive_opens``, the force fields,
    ``half_open_trials`` (live trial leases of the whole fleet) and ``half_open_successes``,
    ``last_trigger`` (the trigger of the record's last open) and ``shared_version``.
    What a record does not hold, because it is each process's own, reads as zero:
    ``consecutive_failures``, ``window_calls``, ``window_failures``,
    ``window_slow_calls``, ``dry_run_rejections`` and ``cooldown_remaining`` are those of
    this process, which has made no call through the breaker. ``config`` is what the
    settings resolve for the name (``BALDUR_SERVICES`` and the global knobs); per-call
    overrides that a worker passed are not in the record and do not show.

    Args:
        name: the breaker name.
        answer: the store's answer of ``inspect``; None when it could not be read (the row
            of a fresh CLOSED record, ``store_available`` False).
        config: the ``config`` dict of the row.
        backend: the store's label (``"redis"``, ``"database"``...).

    Returns:
        dict: the row, with ``from_record`` True.
    """
    record = answer.record if answer is not None else Record()
    state = record.state
    forced = record.forced
    open_until, open_duration = _open_timing(record)
    half_open = state == "half_open"
    return {
        "service": name,
        "state": state,
        "consecutive_failures": 0,
        "window_calls": 0,
        "window_failures": 0,
        "window_slow_calls": 0,
        "opened_at": record.opened_at,
        "open_until": open_until,
        "open_duration": open_duration,
        "consecutive_opens": record.opens,
        "forced": forced,
        "force_expires_at": record.force_expires_at if forced else None,
        "force_reason": record.force_reason if forced else None,
        "force_actor": record.force_actor if forced else None,
        "half_open_trials": len(record.probes) if half_open else 0,
        "half_open_successes": record.successes if half_open else 0,
        "cooldown_remaining": 0.0,
        "dry_run_rejections": 0,
        "last_trigger": record.trigger,
        "backend": backend,
        "config": config,
        "store_available": answer is not None,
        "shared_version": record.version if answer is not None else -1,
        "from_record": True,
    }


def _open_timing(record: Record) -> tuple[float | None, float | None]:
    """``(open_until, open_duration)`` of a row: when the open ends (Unix seconds; a forced
    open's expiry) and the backed-off length of the current or last open (seconds)."""
    if record.state == "closed":
        return None, None
    if record.forced == "open":
        return record.force_expires_at, None
    open_until = record.open_until if record.state == "open" else None
    known = record.open_until is not None and record.opened_at is not None
    return open_until, record.open_until - record.opened_at if known else None  # type: ignore[operator]
