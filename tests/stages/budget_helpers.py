"""Shared pieces of the stage tests: fast thread switching, a barrier start, a lock that
protects nothing (meta-tests), a clock the threads of a test may move together."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from baldur_django.core.stages.budget import CallCounts
from baldur_django.core.testing import FakeClock


@pytest.fixture
def fast_switching():
    """Switch threads as often as the interpreter allows; restore the interval after."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


class NoLock:
    """Stands in for ``threading.Lock`` and protects nothing (meta-tests only)."""

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class YieldingCounts(CallCounts):
    """CallCounts whose ``spent`` goes through a Python getter and setter.

    Each access is a Python call, hence a point where the interpreter may switch threads:
    the check "``spent + 1`` within the budget" and the spend become read, (switch), write,
    as they can on a free-threaded interpreter (on CPython 3.11 with the GIL a straight-line
    step rarely contains a switch point, so a missing lock would rarely show). Under the
    owner's lock this changes nothing.
    """

    __slots__ = ("_spent",)

    def _get_spent(self) -> int:
        return self._spent

    def _set_spent(self, value: int) -> None:
        self._spent = value

    spent = property(_get_spent, _set_spent)  # type: ignore[assignment]


#: the counting class of each stage module, and its yielding stand-in for the meta-tests
YIELDING = {"CallCounts": YieldingCounts}


@contextmanager
def unlocked(module: Any, monkeypatch: pytest.MonkeyPatch):
    """Objects built inside this block by *module* get a :class:`NoLock` wherever they would
    take a ``threading.Lock`` (the module's own ``threading`` name is swapped) and count in
    the yielding stand-in of the module's counting class (:data:`YIELDING`)."""
    with monkeypatch.context() as patch:
        patch.setattr(module, "threading", SimpleNamespace(Lock=NoLock))
        for name, stand_in in YIELDING.items():
            if hasattr(module, name):
                patch.setattr(module, name, stand_in)
        yield


def run_threads(count: int, target: Callable[[int], None], timeout: float = 30.0) -> None:
    """Start *count* threads running ``target(i)``, released together by a barrier.

    Re-raises the first error a thread hit; fails if a thread is still running after
    *timeout* seconds.
    """
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), name=f"stage-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    if errors:
        raise errors[0]


class SharedClock(FakeClock):
    """A FakeClock the test's threads move forward together (``advance`` takes a lock)."""
