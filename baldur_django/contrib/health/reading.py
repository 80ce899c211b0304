"""What the health view reads, bounded in time: the emergency level and the critical breakers.

The view must answer within a probe's timeout whatever the shared store or the level's
backend does, and its cost must not grow with the number of breakers a process knows. So
one read runs in a worker thread and the view waits for it at most
:data:`READ_TIMEOUT_SECONDS`:

* the emergency level, read from its backend when the last read is older than
  :data:`LEVEL_MAX_AGE_SECONDS` (a level set or cleared elsewhere shows within that time;
  the process cache everyone else reads through is refreshed on the way);
* the shared records of the critical breakers, in one batched store call when the store
  offers one (``inspect_many``; the Redis store pipelines it), else one ``inspect`` each.

Only one read is out at a time: while a read hangs (a stopped Redis), later views wait for
that same read rather than start another, so a hung store costs one thread, not one per
probe. A view whose read did not come back answers from the process's own knowledge and
says so (:data:`NO_ANSWER`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
from typing import Any

from ...core import emergency as emergency_core
from ...core import rules
from ...core.events import ForceLapsed, bus
from ...core.registry import registry
from ...core.states import CircuitState
from ...core.stores.base import Answer

__all__ = [
    "READ_TIMEOUT_SECONDS",
    "LEVEL_MAX_AGE_SECONDS",
    "NO_STORE",
    "ANSWERED",
    "FAILED",
    "NO_ANSWER",
    "Reading",
    "read",
]

#: How long the view waits for its read, in seconds (a Kubernetes probe times out after 1 s).
READ_TIMEOUT_SECONDS = 0.5
#: How old the emergency level the view shows may be, in seconds.
LEVEL_MAX_AGE_SECONDS = 0.5

#: What became of the store read: no shared store (or no critical breaker) to read,
NO_STORE = "none"
#: the store answered,
ANSWERED = "answered"
#: the store raised (the critical breakers are shown as this process knows them),
FAILED = "failed"
#: or the read did not come back in time (everything is shown as this process knows it).
NO_ANSWER = "no answer"


@dataclasses.dataclass(frozen=True)
class Reading:
    """The result of one bounded read.

    Attributes:
        level (int): the emergency level in force, 0-3.
        states (dict[str, CircuitState]): the critical breakers' states as read (the shared
            record with a store, the breaker's own state without); a name the store holds no
            record of is left out (the process's own view stands).
        store (str): :data:`NO_STORE`, :data:`ANSWERED`, :data:`FAILED` or :data:`NO_ANSWER`.
    """

    level: int
    states: dict[str, CircuitState]
    store: str


def _record_state(answer: Answer, frozen: bool) -> CircuitState:
    """The state a shared record stands for: OPEN past its recovery timeout reads HALF_OPEN
    (the next call probes), as a breaker consulting the record would judge it."""
    record = answer.record
    if rules.recovery_due(
        state=record.state, forced=record.forced, now=answer.now, open_until=record.open_until, frozen=frozen
    ):
        return CircuitState.HALF_OPEN
    return CircuitState(record.state)


def _inspect(store: Any, names: list[str], frozen: bool) -> list[Answer]:
    many = getattr(store, "inspect_many", None)
    if many is not None:
        return list(many(names, frozen=frozen))
    return [store.inspect(name, frozen=frozen) for name in names]


def _job(names: tuple[str, ...]) -> Reading:
    """The read itself (in the worker thread): the level, then the critical breakers."""
    level = emergency_core.mode.recent_level(LEVEL_MAX_AGE_SECONDS)
    store = registry.store
    if store is None or not names:
        breakers = [registry.get(name, create=False) for name in names]
        return Reading(level, {b.name: b.state for b in breakers if b is not None}, NO_STORE)
    frozen = level >= emergency_core.FREEZE_LEVEL
    try:
        answers = _inspect(store, list(names), frozen)
    except Exception:  # StoreUnavailable, or a third-party store's own error: show local knowledge
        return Reading(level, {}, FAILED)
    states: dict[str, CircuitState] = {}
    for name, answer in zip(names, answers, strict=True):
        if answer.lapsed is not None:  # this read lapsed the force: announce it, as a breaker would
            bus.publish(
                ForceLapsed(
                    name, answer.now, previous=answer.lapsed, from_state=answer.lapsed, to_state=answer.record.state
                )
            )
        if answer.record.version:  # no record: the store knows nothing the process does not
            states[name] = _record_state(answer, frozen)
    return Reading(level, states, ANSWERED)


def _run(names: tuple[str, ...], future: concurrent.futures.Future[Reading]) -> None:
    if not future.set_running_or_notify_cancel():  # pragma: no cover - never cancelled
        return
    try:
        future.set_result(_job(names))
    except BaseException as exc:  # handed to the waiting view, which answers locally
        future.set_exception(exc)
    finally:
        from django.db import connections

        connections.close_all()  # this thread's own connections (a database store's)


class _Reader:
    """One read out at a time, per process; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flight: tuple[int, tuple[str, ...], concurrent.futures.Future[Reading]] | None = None

    def __call__(self, names: tuple[str, ...], timeout: float) -> Reading | None:
        with self._lock:
            flight = self._flight
            if flight is None or flight[0] != os.getpid() or flight[2].done():
                future: concurrent.futures.Future[Reading] = concurrent.futures.Future()
                self._flight = (os.getpid(), names, future)
                worker = threading.Thread(target=_run, args=(names, future), name="baldur-health-read", daemon=True)
                worker.start()
            elif flight[1] != names:
                return None  # another read is still out: do not pile up threads on a hung store
            else:
                future = flight[2]
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            return None
        except Exception:  # the read failed in an unexpected way: answer from local knowledge
            return None


_reader = _Reader()


def read(names: tuple[str, ...], timeout: float | None = None) -> Reading | None:
    """Read the level and the critical breakers *names*, waiting at most *timeout* seconds.

    Args:
        names: the critical breakers (already registered in this process).
        timeout: seconds to wait; None uses :data:`READ_TIMEOUT_SECONDS`.

    Returns:
        Reading | None: None when the read did not come back in time (or failed
        unexpectedly); the caller then answers from what the process knows.
    """
    return _reader(names, READ_TIMEOUT_SECONDS if timeout is None else timeout)
