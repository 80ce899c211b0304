"""The ``stages`` scenario: the CLOSED success through ``@protected`` with one outbound
stage on at a time, each compared with the same decorator without it.

Rows (each a ``@protected`` function returning 1, warmed up to the steady CLOSED state):

* ``protected, no stage`` and ``protected(retry), no stage``: the references;
* ``deadline=5.0``, ``honor_retry_after=True``, ``max_concurrent_calls=100`` and
  ``adaptive_throttling_k=2.0``, each alone (compared with ``protected, no stage``);
* ``retry_budget_ratio=0.2`` with a retry policy (compared with ``protected(retry), no stage``).

A deadline block or a request deadline entered anywhere in a process makes every wrapper
read the current deadline from then on (it arms the process); the ``deadline`` knob does
not, so no row disarms anything, and the scenario checks that the process is still
unarmed at its end (the rows are measured as in a process where no deadline was ever
entered).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import baldur_django as baldur
from baldur_django.core.stages.deadline import ARMED

from .harness import interleave, loop_calls

__all__ = ["STAGE_ROWS", "STAGE_GOALS", "NO_STAGE_ROW", "NO_STAGE_RETRY_ROW", "bench_stages"]

NO_STAGE_ROW = "protected, no stage"
NO_STAGE_RETRY_ROW = "protected(retry), no stage"
DEADLINE_ROW = "protected(deadline=5.0)"
GATE_ROW = "protected(honor_retry_after=True)"
BULKHEAD_ROW = "protected(max_concurrent_calls=100)"
BUDGET_ROW = "protected(retry, retry_budget_ratio=0.2)"
THROTTLE_ROW = "protected(adaptive_throttling_k=2.0)"

#: row -> (knobs given to ``protected``, the reference row it is compared with)
STAGE_ROWS: dict[str, tuple[dict[str, Any], str]] = {
    DEADLINE_ROW: ({"deadline": 5.0}, NO_STAGE_ROW),
    GATE_ROW: ({"honor_retry_after": True}, NO_STAGE_ROW),
    BULKHEAD_ROW: ({"max_concurrent_calls": 100}, NO_STAGE_ROW),
    BUDGET_ROW: ({"retry": True, "retry_budget_ratio": 0.2}, NO_STAGE_RETRY_ROW),
    THROTTLE_ROW: ({"adaptive_throttling_k": 2.0}, NO_STAGE_ROW),
}

#: (goal text, subject row, reference row, limit): read by ``report.GOALS``
STAGE_GOALS = tuple(
    (f"{row} CLOSED overhead <= 1.5 x the overhead without stages", row, reference, 1.5)
    for row, (_, reference) in STAGE_ROWS.items()
)

_ids = itertools.count()


def _target() -> int:
    return 1


def _steady(func: Callable[[], Any], warmup: int) -> None:
    breaker = func.breaker  # type: ignore[attr-defined]
    for _ in range(max(warmup, 2 * breaker.config.sliding_window_size + 10)):
        func()
    snap = breaker.snapshot()
    if snap["state"] != "closed" or snap["window_failures"]:
        raise RuntimeError(f"{breaker.name}: warm-up did not reach the steady CLOSED state: {snap}")


def bench_stages(settings: Any) -> Any:
    """The ``stages`` scenario (see the module's text): median ns over a bare call."""
    from .scenarios import ScenarioResult

    funcs: dict[str, Callable[[], Any]] = {
        NO_STAGE_ROW: baldur.protected(f"bench.stages.none.{next(_ids)}")(_target),
        NO_STAGE_RETRY_ROW: baldur.protected(f"bench.stages.retry.{next(_ids)}", retry=True)(_target),
    }
    for row, (knobs, _) in STAGE_ROWS.items():
        funcs[row] = baldur.protected(f"bench.stages.{next(_ids)}", **knobs)(_target)
    runners: dict[str, Callable[[int], int]] = {"bare": lambda n: loop_calls(_target, n)}
    for row, func in funcs.items():
        _steady(func, settings.warmup)
        runners[row] = lambda n, f=func: loop_calls(f, n)
    ARMED.clear()  # as in a process where no deadline was ever entered (a test may have armed it)
    samples = interleave(runners, baseline="bare", rounds=settings.rounds, n=settings.calls, seed=settings.seed)
    if ARMED:
        raise RuntimeError("the deadline row armed the process: its knob must not")
    for row, func in funcs.items():
        snap = func.breaker.snapshot()  # type: ignore[attr-defined]
        if snap["state"] != "closed" or snap["window_failures"]:
            raise RuntimeError(f"{row}: the run disturbed the breaker: {snap}")
    bare = samples.pop("bare")
    return ScenarioResult("stages", "CLOSED success, one outbound stage on", False, bare.median, {}, extra=samples)
