"""A store class written from the store protocol alone: records in a plain dict (ST-6).

It exists to prove the protocol is implementable by a third party: the contract suite
runs on it (``tests/stores/test_contract.py``) and a test installs it through
``BALDUR_STATE_BACKEND = "tests.stores.dict_store.DictStore"``. It keeps the records as
dicts under one lock and lets the rules module decide every transition, as a Python
store should (see docs/stores.md). Not a production store: it shares nothing between
processes.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from baldur_django.core.steps import prunable, run
from baldur_django.core.stores.base import Answer, decode


class DictStore:
    """The store protocol on a dict. ``now``: wall-clock function (Unix seconds)."""

    backend = "dict"

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        self.now = now or time.time
        self.guard = threading.Lock()
        self.records: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, float] = {}
        self.locks: dict[str, tuple[str, float]] = {}

    def apply(self, name: str, op: str, *args: Any, frozen: bool, register: bool = True) -> Answer:
        """Run transition *op* on the record of *name* atomically (under the lock)."""
        with self.guard:
            now = self.now()
            answer = run(op, decode(self.records.get(name)), now, *args, frozen=frozen)
            if register or name in self.records:
                self.records[name] = answer.record.to_dict()
            if register:
                self.seen[name] = now
            answer.record = decode(dict(self.records.get(name) or answer.record.to_dict()))
            return answer

    def load(self, name: str, *, frozen: bool = False) -> Answer:
        return self.apply(name, "load", frozen=frozen)

    def inspect(self, name: str, *, frozen: bool = False) -> Answer:
        return self.apply(name, "inspect", frozen=frozen, register=False)

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
        return self.apply(name, "trip", trigger, recovery_timeout, backoff_factor, recovery_timeout_max, frozen=frozen)

    def acquire_probe(
        self, name: str, *, token: str, max_calls: int, lease_seconds: float, frozen: bool = False
    ) -> Answer:
        return self.apply(name, "acquire_probe", token, max_calls, lease_seconds, frozen=frozen)

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
        args = (token, version, outcome, max_calls, recovery_timeout, backoff_factor, recovery_timeout_max)
        return self.apply(name, "finish_probe", *args, frozen=frozen)

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
        return self.apply(name, "force", mode, ttl_seconds, reason, actor, frozen=frozen)

    def release(self, name: str, *, frozen: bool = False) -> Answer:
        return self.apply(name, "release", frozen=frozen)

    def clear(self, name: str, *, frozen: bool = False) -> Answer:
        return self.apply(name, "clear", frozen=frozen)

    def sweep(self, name: str, *, frozen: bool = False) -> Answer:
        return self.apply(name, "sweep", frozen=frozen, register=False)

    def names(self) -> dict[str, float]:
        with self.guard:
            return dict(self.seen)

    def prune(self, *, older_than: float) -> list[str]:
        with self.guard:
            gone = [n for n, seen in self.seen.items() if seen < older_than and prunable(decode(self.records.get(n)))]
            for name in gone:
                self.seen.pop(name, None)
                self.records.pop(name, None)
            return gone

    def lock(self, name: str, *, ttl_seconds: float) -> str | None:
        with self.guard:
            now = self.now()
            held = self.locks.get(name)
            if held is not None and held[1] > now:
                return None
            token = uuid.uuid4().hex
            self.locks[name] = (token, now + ttl_seconds)
            return token

    def extend(self, name: str, *, token: str, ttl_seconds: float) -> bool:
        with self.guard:
            now = self.now()
            held = self.locks.get(name)
            if held is None or held[0] != token or held[1] <= now:
                return False
            self.locks[name] = (token, now + ttl_seconds)
            return True

    def unlock(self, name: str, *, token: str) -> bool:
        with self.guard:
            held = self.locks.get(name)
            if held is None or held[0] != token:
                return False
            del self.locks[name]
            return True

    def reset(self, name: str) -> None:
        with self.guard:
            self.records.pop(name, None)
