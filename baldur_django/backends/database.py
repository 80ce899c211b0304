"""The ``database`` state backend: the store protocol on the Django ORM.

Each transition is one transaction that locks the breaker's row
(``select_for_update``; on SQLite a no-op write first takes the database's write lock)
and applies the same pure step function as the memory store (``core/steps.py``). Shared
timestamps come from the database's clock. ORM work never runs on an event loop: called
from a thread with a running loop, the operation runs in a worker thread (Django's
async-safety rule). Every database error becomes ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, connections, router, transaction

from ..core.steps import prunable, run
from ..core.stores.base import Answer, StoreUnavailable, decode, encode, safe_key

__all__ = ["DatabaseStore", "db_now"]

T = TypeVar("T")
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="baldur-db")
        return _executor


def db_now(alias: str) -> float:
    """The database clock as Unix seconds (float). Falls back to ``time.time()`` for unknown vendors."""
    connection = connections[alias]
    vendor = connection.vendor
    if vendor == "postgresql":
        sql = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"
    elif vendor == "sqlite":
        sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"
    elif vendor == "mysql":
        sql = "SELECT UNIX_TIMESTAMP(NOW(6))"
    else:
        return time.time()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return float(cursor.fetchone()[0])


class DatabaseStore:
    """Breaker records in the ``BreakerRecord`` table of database *alias*.

    Args:
        alias: the Django database alias (``router.db_for_write`` of the model by default).
        record_ttl: seconds after its last write by a worker that a CLOSED, unforced record
            is removed (``BALDUR_REGISTRY_IDLE_SECONDS``): at the next read of the registry
            (:meth:`names`: the admin page, ``baldur_status``, the fleet jobs). An OPEN,
            half-open or forced record is never removed. None or 0: never.
    """

    backend = "database"

    def __init__(self, alias: str | None = None, *, record_ttl: float | None = None) -> None:
        from .models import BreakerRecord

        self.alias = alias or router.db_for_write(BreakerRecord)
        self.record_ttl = record_ttl

    # ---------------------------------------------------------------- plumbing
    def _off_loop(self, fn: Callable[[], T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn()
        return _worker().submit(self._in_thread, fn).result()

    def _in_thread(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        finally:
            connections[self.alias].close_if_unusable_or_obsolete()

    def _guarded(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return self._off_loop(fn)
        except StoreUnavailable:
            raise
        except (DatabaseError, OSError) as exc:
            raise StoreUnavailable(f"database {what} failed: {type(exc).__name__}: {exc}") from exc

    def _write_lock(self, cursor: Any, table: str, key: str) -> None:
        if connections[self.alias].vendor == "sqlite":
            # take SQLite's write lock before reading, so two writers cannot interleave
            cursor.execute(f'UPDATE "{table}" SET "key" = "key" WHERE "key" = %s', [key])

    def _op(self, name: str, op: str, *args: Any, frozen: bool, touch: bool = True) -> Answer:
        from .models import BreakerRecord

        key = safe_key(name)
        table = BreakerRecord._meta.db_table  # noqa: SLF001, RUF100 - Django documents Model._meta as public API
        held = frozen  # Level 3 holds automatic steps: the caller's reading

        def step() -> Answer:
            now = db_now(self.alias)
            row = BreakerRecord.objects.using(self.alias).select_for_update().filter(key=key).first()
            if row is None and not touch:
                return run(op, decode(None), now, *args, frozen=held)  # a task's read registers nothing
            if row is None:
                row = BreakerRecord.objects.using(self.alias).create(key=key, name=name, record="", last_seen=now)
            answer = run(op, decode(row.record or None), now, *args, frozen=held)
            row.record = encode(answer.record)
            if touch:
                row.last_seen = now
            row.save(update_fields=["record", "last_seen"])
            return answer

        return self._guarded(op, lambda: self._locked(table, key, step))

    def _locked(self, table: str, key: str, step: Callable[[], T]) -> T:
        """Run *step* in one transaction that first takes the write lock of *key*'s row of
        *table* (on SQLite, the database's); again, up to three times in all, when another
        writer created the row meanwhile (``IntegrityError``)."""
        for attempt in range(3):
            try:
                with transaction.atomic(using=self.alias):
                    with connections[self.alias].cursor() as cursor:
                        self._write_lock(cursor, table, key)
                    return step()
            except IntegrityError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    # ---------------------------------------------------------------- protocol
    def load(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "load", frozen=frozen)

    def inspect(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "inspect", frozen=frozen, touch=False)

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
        return self._op(
            name,
            "trip",
            trigger,
            float(recovery_timeout),
            float(backoff_factor),
            float(recovery_timeout_max),
            frozen=frozen,
        )

    def acquire_probe(
        self, name: str, *, token: str, max_calls: int, lease_seconds: float, frozen: bool = False
    ) -> Answer:
        return self._op(name, "acquire_probe", token, int(max_calls), float(lease_seconds), frozen=frozen)

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
        return self._op(
            name,
            "finish_probe",
            token,
            int(version),
            outcome,
            int(max_calls),
            float(recovery_timeout),
            float(backoff_factor),
            float(recovery_timeout_max),
            frozen=frozen,
        )

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
        return self._op(name, "force", mode, float(ttl_seconds), reason or "", actor, frozen=frozen)

    def release(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "release", frozen=frozen)

    def clear(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "clear", frozen=frozen)

    def sweep(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "sweep", frozen=frozen, touch=False)

    def names(self) -> dict[str, float]:
        from .models import BreakerRecord

        if self.record_ttl and self.record_ttl > 0:  # idle records leave first, as they expire on Redis
            ttl = float(self.record_ttl)
            self.prune(older_than=self._guarded("clock read", lambda: db_now(self.alias)) - ttl)

        def work() -> dict[str, float]:
            return dict(BreakerRecord.objects.using(self.alias).values_list("name", "last_seen"))

        return self._guarded("registry read", work)

    def prune(self, *, older_than: float) -> list[str]:
        from .models import BreakerRecord

        def work() -> list[str]:
            with transaction.atomic(using=self.alias):
                stale = BreakerRecord.objects.using(self.alias).select_for_update().filter(last_seen__lt=older_than)
                gone = [row for row in stale if prunable(decode(row.record or None))]
                BreakerRecord.objects.using(self.alias).filter(pk__in=[row.pk for row in gone]).delete()
                return [row.name for row in gone]

        return self._guarded("prune", work)

    # ---------------------------------------------------------------- the fleet's Retry-After gates
    def close_gate(self, service: str, seconds: float) -> float:
        """Keep *service*'s Retry-After gate closed at least *seconds* from now on the
        database clock, keeping a later end already stored (one transaction that locks the
        service's row; the fleet gate store protocol of ``core/stages/fleet_gate.py``).

        Returns:
            Seconds left until the stored end after the write.

        Raises:
            StoreUnavailable: the database did not answer.
        """
        from .models import GateEnd

        key = safe_key(service)
        table = GateEnd._meta.db_table  # noqa: SLF001, RUF100 - Django documents Model._meta as public API

        def step() -> float:
            now = db_now(self.alias)
            rows = GateEnd.objects.using(self.alias)
            row = rows.select_for_update().filter(key=key).first()
            if row is None:
                rows.create(key=key, name=service, until=now + seconds)
                return seconds
            if row.until < now + seconds:
                row.until = now + seconds
                row.save(update_fields=["until"])
            return max(0.0, row.until - now)

        return self._guarded("gate write", lambda: self._locked(table, key, step))

    def gates_left(self, services: list[str] | tuple[str, ...]) -> dict[str, float]:
        """Seconds left of each closed gate among *services*, on the database clock (the
        open ones are absent); one query for all of them.

        Raises:
            StoreUnavailable: the database did not answer.
        """
        from .models import GateEnd

        if not services:
            return {}
        names = {safe_key(service): service for service in services}

        def work() -> dict[str, float]:
            now = db_now(self.alias)
            found = GateEnd.objects.using(self.alias).filter(key__in=list(names), until__gt=now)
            return {names[key]: until - now for key, until in found.values_list("key", "until")}

        return self._guarded("gate read", work)

    def lock(self, name: str, *, ttl_seconds: float) -> str | None:
        from .models import BreakerLock

        table = BreakerLock._meta.db_table  # noqa: SLF001, RUF100 - Django documents Model._meta as public API

        def work() -> str | None:
            token = uuid.uuid4().hex
            with transaction.atomic(using=self.alias):
                with connections[self.alias].cursor() as cursor:
                    if connections[self.alias].vendor == "sqlite":
                        cursor.execute(f'UPDATE "{table}" SET "name" = "name" WHERE "name" = %s', [name])
                now = db_now(self.alias)
                row = BreakerLock.objects.using(self.alias).select_for_update().filter(name=name).first()
                if row is None:
                    try:
                        with transaction.atomic(using=self.alias):
                            BreakerLock.objects.using(self.alias).create(
                                name=name, token=token, expires_at=now + ttl_seconds
                            )
                    except IntegrityError:
                        return None  # a concurrent run created it first
                    return token
                if row.expires_at > now:
                    return None
                row.token = token
                row.expires_at = now + ttl_seconds
                row.save(update_fields=["token", "expires_at"])
                return token

        return self._guarded("lock", work)

    def extend(self, name: str, *, token: str, ttl_seconds: float) -> bool:
        from .models import BreakerLock

        def work() -> bool:
            with transaction.atomic(using=self.alias):
                now = db_now(self.alias)
                updated: int = (
                    BreakerLock.objects.using(self.alias)
                    .filter(name=name, token=token, expires_at__gt=now)
                    .update(expires_at=now + ttl_seconds)
                )
            return updated > 0

        return self._guarded("lock extend", work)

    def unlock(self, name: str, *, token: str) -> bool:
        from .models import BreakerLock

        def work() -> bool:
            deleted: int = BreakerLock.objects.using(self.alias).filter(name=name, token=token).delete()[0]
            return deleted > 0

        return self._guarded("unlock", work)

    def reset(self, name: str) -> None:
        from .models import BreakerRecord

        self._guarded("reset", lambda: BreakerRecord.objects.using(self.alias).filter(key=safe_key(name)).delete())
