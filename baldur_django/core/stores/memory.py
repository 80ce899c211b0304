"""In-process implementation of the store protocol (the reference semantics of process-local breakers).

With ``BALDUR_STATE_BACKEND="memory"`` breakers keep their state locally and never call a
store; this class exists so the contract suite has a reference, and for tests and
single-process tools that want the protocol without a server.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable

from ..steps import prunable, run
from .base import Answer, Record, decode, encode

__all__ = ["MemoryStore"]


class MemoryStore:
    """Records as JSON strings in a dict, every operation under one lock.

    Args:
        now: wall-clock function (Unix seconds); a FakeClock's ``wall`` in tests.
    """

    backend = "memory"

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        import time

        self._now = now or time.time
        self._lock = threading.Lock()
        self._records: dict[str, str] = {}
        self._seen: dict[str, float] = {}
        self._locks: dict[str, tuple[str, float]] = {}

    def _op(self, name: str, op: str, *args: object, frozen: bool) -> Answer:
        with self._lock:
            now = self._now()
            touch = op not in ("inspect", "sweep")
            if not touch and name not in self._records:
                return run(op, decode(None), now, *args, frozen=frozen)  # a task's read registers nothing
            answer = run(op, decode(self._records.get(name)), now, *args, frozen=frozen)
            self._records[name] = encode(answer.record)
            if touch:
                self._seen[name] = now
            answer.record = decode(self._records[name])  # hand out a copy
            return answer

    def load(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "load", frozen=frozen)

    def inspect(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "inspect", frozen=frozen)

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
        return self._op(name, "trip", trigger, recovery_timeout, backoff_factor, recovery_timeout_max, frozen=frozen)

    def acquire_probe(
        self, name: str, *, token: str, max_calls: int, lease_seconds: float, frozen: bool = False
    ) -> Answer:
        return self._op(name, "acquire_probe", token, max_calls, lease_seconds, frozen=frozen)

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
            version,
            outcome,
            max_calls,
            recovery_timeout,
            backoff_factor,
            recovery_timeout_max,
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
        return self._op(name, "force", mode, ttl_seconds, reason, actor, frozen=frozen)

    def release(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "release", frozen=frozen)

    def clear(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "clear", frozen=frozen)

    def sweep(self, name: str, *, frozen: bool = False) -> Answer:
        return self._op(name, "sweep", frozen=frozen)

    def names(self) -> dict[str, float]:
        with self._lock:
            return dict(self._seen)

    def prune(self, *, older_than: float) -> list[str]:
        with self._lock:
            gone = [
                name
                for name, seen in self._seen.items()
                if seen < older_than and prunable(decode(self._records.get(name)))
            ]
            for name in gone:
                self._seen.pop(name, None)
                self._records.pop(name, None)
            return gone

    def lock(self, name: str, *, ttl_seconds: float) -> str | None:
        with self._lock:
            now = self._now()
            held = self._locks.get(name)
            if held is not None and held[1] > now:
                return None
            token = uuid.uuid4().hex
            self._locks[name] = (token, now + ttl_seconds)
            return token

    def extend(self, name: str, *, token: str, ttl_seconds: float) -> bool:
        with self._lock:
            now = self._now()
            held = self._locks.get(name)
            if held is None or held[0] != token or held[1] <= now:
                return False
            self._locks[name] = (token, now + ttl_seconds)
            return True

    def unlock(self, name: str, *, token: str) -> bool:
        with self._lock:
            held = self._locks.get(name)
            if held is not None and held[0] == token:
                del self._locks[name]
                return True
            return False

    def reset(self, name: str) -> None:
        with self._lock:
            self._records.pop(name, None)
            self._seen.pop(name, None)

    def raw(self, name: str) -> Record:
        """The stored record without normalising it (tests)."""
        with self._lock:
            return decode(self._records.get(name))
