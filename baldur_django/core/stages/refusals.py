"""The count of calls refused because their deadline had passed, per breaker.

The other stages keep their own refusal counts (the gate, the throttle and the bulkhead
count the calls they refuse; the retry budget the retries it refuses). A deadline has no
object of its own, and a deadline set around a call reaches breakers without any stage, so
its refusals are counted here, by the breaker's core, on the refusal path only: nothing is
counted, looked up or allocated for a call that goes ahead. The counts are read when
metrics are collected (:func:`deadline_refusals`).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref

from .budget import count_of

__all__ = ["count_deadline", "deadline_refusals"]

#: a breaker's core -> the calls refused for their deadline (made by the first refusal)
_counts: weakref.WeakKeyDictionary[object, itertools.count[int]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def count_deadline(core: object) -> None:
    """Count one call of *core*'s breaker refused because its deadline had passed.

    Args:
        core: the breaker's core (any object that can be weakly referenced).
    """
    counter = _counts.get(core)
    if counter is None:
        with _lock:
            counter = _counts.setdefault(core, itertools.count())
    next(counter)  # one atomic step: no lock for the second refusal on


def deadline_refusals(core: object) -> int:
    """The calls of *core*'s breaker refused for their deadline in this process (0 when
    none was); only grows."""
    counter = _counts.get(core)
    return 0 if counter is None else count_of(counter)


def _after_fork_in_child() -> None:
    """A thread of the parent may have held the lock at the fork: the child's is new."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
