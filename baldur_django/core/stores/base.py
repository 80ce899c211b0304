"""The shared-store protocol: a breaker's shared record, changed only by whole transitions.

A store keeps one JSON record per breaker name plus a registry of names. Every
operation below is one atomic read-modify-write (Redis: one Lua script; database: one
transaction with row locks; memory: one lock) that first *normalises* the record with
the store's own clock:

* a force whose lifetime is over is lapsed (a forced open lapses to HALF_OPEN, a
  forced closed to CLOSED) and the answer says ``lapsed`` so exactly one caller
  publishes ``force_lapsed``;
* probe leases past their expiry are dropped, so a worker that died mid-probe gives
  its slot back.

Every answer carries the record after the operation and the store's clock reading
``now`` (Unix seconds), so a worker converts shared deadlines into its own monotonic
clock without trusting its wall clock (hosts with skewed clocks agree).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

from ..errors import ConfigError

__all__ = [
    "Record",
    "Answer",
    "StateStore",
    "StoreUnavailable",
    "encode",
    "decode",
    "safe_key",
    "TRIPPED",
    "BLOCKED",
    "ALREADY",
    "STORE_METHODS",
    "missing_store_methods",
    "import_store_class",
    "make_store",
]

TRIPPED = "tripped"  # the trip was written
BLOCKED = "blocked"  # a force refused it: adopt the record, log trip_blocked
ALREADY = "already"  # the record was not CLOSED any more (a peer decided): adopt silently


class StoreUnavailable(Exception):
    """The store did not answer (connection, timeout, read-only, database error...).

    Raised by store implementations; the breaker turns it into local judgement.
    Never reaches a protected call's caller.
    """


@dataclass(slots=True)
class Record:
    """The state of one breaker: a store's shared record (times in the store clock's Unix
    seconds), and every breaker's own state (a breaker is a record; times in its monotonic
    seconds). Changed only by :func:`~baldur_django.core.steps.step`."""

    state: str = "closed"
    version: int = 0
    opened_at: float | None = None
    open_until: float | None = None
    trigger: str | None = None
    forced: str | None = None
    force_expires_at: float | None = None
    force_reason: str = ""
    force_actor: str | None = None
    probes: dict[str, float] = field(default_factory=dict)  # token -> lease expiry
    successes: int = 0
    updated_at: float | None = None
    opens: int = 0  # consecutive automatic opens since the last close, capped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Answer:
    """What a store operation returns.

    Attributes:
        record: the record after the operation.
        now: the store clock when it ran (Unix seconds).
        result: operation-specific outcome (``TRIPPED``/``BLOCKED``/``ALREADY`` for
            ``trip``; True/False for ``acquire_probe``; the previous force for ``release``;
            the transition made for ``finish_probe``: ``"closed"``, ``"open"`` or None).
        lapsed: the previous force when this operation lapsed it, else None.
        moved: True when the operation itself changed ``state`` (the caller decided a transition).
    """

    record: Record
    now: float
    result: Any = None
    lapsed: str | None = None
    moved: bool = False


def encode(record: Record) -> str:
    """JSON text of *record* (never pickle)."""
    return json.dumps(record.to_dict(), separators=(",", ":"), sort_keys=True)


def decode(raw: Any) -> Record:
    """A :class:`Record` from JSON text/bytes or a dict; never raises.

    A missing record, or one that is corrupt, reads as a fresh CLOSED record (version 0).
    Corrupt means: not JSON, not an object, no ``state`` or ``version``, or a field of the
    wrong type or with an impossible value: a state other than ``closed``/``open``/
    ``half_open``; a ``version``, ``successes`` or ``opens`` that is not a whole number from
    0 to 2**53 - 1 (``3.0`` reads as 3; ``true`` is not a number); a time that is not a
    number; ``trigger``, ``force_reason`` or ``force_actor`` that is not text; ``forced``
    other than ``open``/``closed``; ``probes`` that is not an object of token -> lease
    time. A field that is absent or null takes its default (an older release's record);
    an empty JSON array of probes counts as none (the Lua decoder cannot tell it from
    ``{}``); unknown fields are ignored. The Redis store's Lua (``_record.lua``) applies
    the same rule.
    """
    if raw is None:
        return Record()
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
    except (ValueError, RecursionError):  # not JSON (a UnicodeDecodeError is a ValueError)
        return Record()
    if not isinstance(data, dict):
        return Record()
    fields: dict[str, Any] = {}
    for name, check in _CHECKS.items():
        value = data.get(name)
        if value is None:
            if name in _REQUIRED:
                return Record()
            continue  # absent or null: the default
        value = check(value)
        if value is _CORRUPT:
            return Record()
        fields[name] = value
    return Record(**fields)


_CORRUPT: Any = object()  # what a field check returns for a value of the wrong type or an impossible one
_REQUIRED = ("state", "version")
_MAX_COUNT = 2**53 - 1  # the largest whole number a double (the Lua's only number) holds exactly


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> Any:
    """A version or count: a whole number from 0 to 2**53 - 1, as an int."""
    if not _is_number(value) or not 0 <= value <= _MAX_COUNT or (isinstance(value, float) and not value.is_integer()):
        return _CORRUPT
    return int(value)


def _time(value: Any) -> Any:
    return value if _is_number(value) else _CORRUPT


def _text(value: Any) -> Any:
    return value if isinstance(value, str) else _CORRUPT


def _one_of(*allowed: str) -> Callable[[Any], Any]:
    return lambda value: value if isinstance(value, str) and value in allowed else _CORRUPT


def _probes(value: Any) -> Any:
    """Token -> lease expiry; an empty JSON array counts as no probes."""
    if value == []:
        return {}
    if not isinstance(value, dict):
        return _CORRUPT
    if not all(isinstance(token, str) and _is_number(until) for token, until in value.items()):
        return _CORRUPT
    return dict(value)


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "state": _one_of("closed", "open", "half_open"),
    "version": _count,
    "opened_at": _time,
    "open_until": _time,
    "trigger": _text,
    "forced": _one_of("open", "closed"),
    "force_expires_at": _time,
    "force_reason": _text,
    "force_actor": _text,
    "probes": _probes,
    "successes": _count,
    "updated_at": _time,
    "opens": _count,
}


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_key(name: str) -> str:
    """A key fragment for breaker *name* that never collides and never breaks a key.

    Readable prefix (unsafe characters replaced, at most 40 characters) plus a SHA-256
    digest of the full name: ``"pay_me-3f2a..."``. Contains no braces, spaces or colons.
    """
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:24]
    return f"{_UNSAFE.sub('_', name)[:40]}-{digest}"


class StateStore(Protocol):
    """Operations on shared breaker records; each one atomic. Raise StoreUnavailable on trouble.

    The breaker name is the only positional argument; everything else is keyword-only.
    Times and lifetimes are in seconds (floats), stored times in the store clock's Unix
    seconds. *frozen* is the caller's reading of Emergency Mode: True while Level 3 holds, which stops every automatic step (no trip, no probe, no sweep, a trial only
    gives its slot back; a forced open that lapses stays OPEN). A store never reads the
    emergency level itself. ``docs/stores.md`` describes each operation for implementers.
    """

    backend: str  # "memory", "database", "redis", or a third-party store's own label

    def load(self, name: str, *, frozen: bool = False) -> Answer:
        """Normalise and return the record; registers *name* (touching its last-seen time)."""

    def inspect(self, name: str, *, frozen: bool = False) -> Answer:
        """Like :meth:`load` (lapses included) without touching the registry: for fleet tasks.
        A name without a record keeps none (nothing is written)."""

    def trip(
        self,
        name: str,
        *,
        trigger: str,
        recovery_timeout: float,
        backoff_factor: float = 1.0,
        recovery_timeout_max: float = math.inf,
        frozen: bool = False,
    ) -> Answer:
        """CLOSED (unforced) -> OPEN for the backed-off duration of one more consecutive open
        (*recovery_timeout* seconds times *backoff_factor* per consecutive open, at
        most *recovery_timeout_max* seconds). ``result``: TRIPPED, BLOCKED (a force holds)
        or ALREADY (not CLOSED any more, or *frozen*)."""

    def acquire_probe(
        self, name: str, *, token: str, max_calls: int, lease_seconds: float, frozen: bool = False
    ) -> Answer:
        """OPEN past its timeout -> HALF_OPEN, then admit *token* if one of the round's
        *max_calls* slots is free, holding it for *lease_seconds* (``result`` True/False)."""

    def finish_probe(
        self,
        name: str,
        *,
        token: str,
        version: int,
        outcome: str,
        max_calls: int,
        recovery_timeout: float,
        backoff_factor: float = 1.0,
        recovery_timeout_max: float = math.inf,
        frozen: bool = False,
    ) -> Answer:
        """Record a trial ``"success"``, ``"failure"``, ``"slow"`` or ``"abandon"`` (slot back)
        of round *version*. A reopen lasts the backed-off duration (seconds as in
        :meth:`trip`). Stale tokens and versions are ignored (``result`` None)."""

    def force(
        self,
        name: str,
        *,
        mode: str,
        ttl_seconds: float,
        reason: str = "",
        actor: str | None = None,
        frozen: bool = False,
    ) -> Answer:
        """Hold the record ``"open"`` or ``"closed"`` for *ttl_seconds* seconds."""

    def release(self, name: str, *, frozen: bool = False) -> Answer:
        """Remove a force (``result`` = previous force or None). Forced open -> HALF_OPEN."""

    def clear(self, name: str, *, frozen: bool = False) -> Answer:
        """Reset the record to a fresh CLOSED one, whatever it held (force, probing round,
        backoff count), in a new version; applies while *frozen* too. ``result`` = the force
        removed or None. Registers *name*."""

    def sweep(self, name: str, *, frozen: bool = False) -> Answer:
        """Recovery sweep for one record: OPEN past its timeout (unforced) -> HALF_OPEN.
        Does not register *name*, and writes nothing for a name without a record. ``result``
        True when it moved."""

    def names(self) -> dict[str, float]:
        """Registered breaker names -> last-seen store time (Unix seconds)."""

    def prune(self, *, older_than: float) -> list[str]:
        """Forget registry entries (and their records) last seen before *older_than* (store
        time, Unix seconds) whose record is CLOSED and unforced; returns the names forgotten."""

    def lock(self, name: str, *, ttl_seconds: float) -> str | None:
        """Take the expiring lock *name* for *ttl_seconds* seconds; returns its owner token,
        or None when it is held."""

    def extend(self, name: str, *, token: str, ttl_seconds: float) -> bool:
        """Renew the lock for *ttl_seconds* seconds from now if *token* still owns it; False
        when it expired or another owner holds it (the caller has lost it and must stop)."""

    def unlock(self, name: str, *, token: str) -> bool:
        """Release the lock only if *token* still owns it (compare-and-delete)."""

    def reset(self, name: str) -> None:
        """Delete the record of *name* and its registry entry (operators' forget, tests)."""


#: The methods every store implements (the :class:`StateStore` protocol).
STORE_METHODS = (
    "load",
    "inspect",
    "trip",
    "acquire_probe",
    "finish_probe",
    "force",
    "release",
    "clear",
    "sweep",
    "names",
    "prune",
    "lock",
    "extend",
    "unlock",
    "reset",
)


def missing_store_methods(candidate: object) -> list[str]:
    """The :data:`STORE_METHODS` that *candidate* (a store class or instance) lacks or has
    as something other than a callable; empty when it looks like a store.

    Only the names are checked, not the signatures: the contract suite
    (:mod:`baldur_django.core.stores.contract`) checks the behaviour.
    """
    return [name for name in STORE_METHODS if not callable(getattr(candidate, name, None))]


def _import_dotted(path: str) -> Any:
    """``module.attr`` -> the attribute, like Django's ``import_string`` (without Django)."""
    import importlib

    module, _, attribute = path.rpartition(".")
    if not module:
        raise ImportError(f"{path!r} is not a dotted path")
    try:
        return getattr(importlib.import_module(module), attribute)
    except AttributeError as exc:
        raise ImportError(f"module {module!r} has no attribute {attribute!r}") from exc


def import_store_class(path: str, *, importer: Callable[[str], Any] | None = None) -> Any:
    """Import the store class *path* names (``BALDUR_STATE_BACKEND``) without calling it.

    Args:
        path: a dotted path such as ``"myproject.stores.MyStore"``.
        importer: how to import it; the Django layer passes ``import_string``. Default: a
            plain ``importlib`` lookup (plain-Python use).

    Returns:
        The class (or any callable that returns a store and has the protocol's methods).

    Raises:
        ConfigError: the path cannot be imported, or what it names is not callable or lacks
            methods of the protocol; the message starts with ``BALDUR_STATE_BACKEND=<path>``.
    """
    try:
        candidate = (importer or _import_dotted)(path)
    except ImportError as exc:
        raise ConfigError(f"BALDUR_STATE_BACKEND={path!r}: cannot import it ({exc})") from exc
    except Exception as exc:  # the module itself fails while importing
        raise ConfigError(f"BALDUR_STATE_BACKEND={path!r}: importing it failed ({type(exc).__name__}: {exc})") from exc
    missing = missing_store_methods(candidate)
    if not callable(candidate) or missing:
        what = "is not callable" if not callable(candidate) else "lacks " + ", ".join(missing)
        raise ConfigError(
            f"BALDUR_STATE_BACKEND={path!r} is not a store class: {getattr(candidate, '__name__', type(candidate).__name__)} "
            f'{what} (the store protocol is described in the documentation: "Shared stores", section "Writing a '
            'store of your own")'
        )
    return candidate


def make_store(path: str, *, importer: Callable[[str], Any] | None = None) -> StateStore:
    """Import the store class *path* names and call it with no arguments.

    Args:
        path: a dotted path (``BALDUR_STATE_BACKEND``).
        importer: as for :func:`import_store_class`.

    Returns:
        The store.

    Raises:
        ConfigError: as :func:`import_store_class`; also when calling the class fails or the
            store's ``backend`` attribute is not a non-empty string other than ``"memory"``.
    """
    factory = import_store_class(path, importer=importer)
    try:
        store = factory()
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"BALDUR_STATE_BACKEND={path!r}: calling the store class with no arguments failed "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    label = getattr(store, "backend", None)
    if not isinstance(label, str) or not label or label == "memory":
        raise ConfigError(
            f"BALDUR_STATE_BACKEND={path!r}: the store's 'backend' attribute must be a non-empty string naming "
            f"it (not 'memory'), got {label!r}"
        )
    return cast(StateStore, store)
