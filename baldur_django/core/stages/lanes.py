"""The fast lane of a ``def`` with one load-aware stage on: its CLOSED healthy success in
one frame.

A staged call normally runs through three frames (:meth:`.pipeline.Pipeline.around`, the
breaker's own wrapper and the per-attempt stages of :mod:`.admission`), and each stage's
steps are method calls. That costs more than twice the breaker's own overhead. A call
site with exactly one stage on (a bulkhead, adaptive throttling, a retry budget or a
Retry-After gate, each kept in this worker), or with the ``deadline`` knob alone, gets a
lane instead: one function that admits on the breaker's healthy lane as the wrapper does
(:mod:`..wrappers`), runs the stage's lock-free steps inline, calls the function and
counts its plain success without a lock. The deadline's lane keeps the call's deadline in
its own frame, where :func:`.deadline.in_force` finds it, instead of setting a context
variable per call.

The lane decides nothing on its own. It hands the call to the staged way (``slow``, the
pipeline's wrapper, which runs it in full) before anything happened whenever its fast
case does not hold:

* the breaker is not on its quiet CLOSED lane (``core.quiet_permit``), or a deadline block
  or request deadline was ever entered in the process (:data:`.deadline.ARMED`);
* the route was not built in the breaker's current epoch (its configuration or store link
  changed, or a 429 cooldown started: the pipeline builds the next route), or the route
  has no lane: its stages are not the lane's one stage, the breaker shares a store (its
  consults fall due), or a 429 cooldown gates a retry policy's first attempts (a policy
  with a time budget gets no lane at all);
* the stage itself would wait or decide: a waiter for a bulkhead slot or no free slot;
  the gate is closed; the budget's second has ended.

The throttle's lane reads the clock once, after the call, as the breaker's own healthy
lane does: a request is counted in, and weighed against, the second that was current
when the last call finished. Within that second's ``free`` requests it passes with one
comparison; past them :meth:`.throttle.AdaptiveThrottle.refuses` reads the clock and
weighs it against the window as of now. So only the first calls after a quiet spell can
be let through on the last second's figures (where a new second's might have asked for
the dice); they are counted in that earlier second, and the second is rolled when the
call ends.

After the call the lane keeps only the plain success. An exception or a value to judge
(a response) goes to :func:`finish_raised` / :func:`finish_returned`, which settle it as
the breaker's wrapper does, let the gate look at it, count the throttle's accept, and
hand a retry policy's further attempts to the retry engine with the route's per-attempt
stages (the pipeline's refusals answered by the fallback).

The stages' own objects document the lock-free steps the lanes inline:
:meth:`.bulkhead.Bulkhead.lane_steps`, :attr:`.throttle.AdaptiveThrottle.live`,
:attr:`.budget.RetryBudget.counts` and :attr:`.gate.RetryAfterGate.until`.
"""

from __future__ import annotations

import operator
import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import CallRefusedError, ThrottledError
from ..nesting import register, settled_elsewhere
from ..retry import Outcome, Raised, RetryPolicy, Returned, settled
from ..runner import call_fallback, continue_sync, settle_raised, settle_returned
from .admission import StageRefused, after_error, after_result, refused
from .budget import RetryBudget
from .bulkhead import Bulkhead
from .deadline import ARMED, register_lane
from .fleet_budget import FleetRetryBudget
from .gate import RetryAfterGate
from .throttle import AdaptiveThrottle

if TYPE_CHECKING:
    from ..calls import BreakerCore
    from ..config import BreakerConfig
    from .service import ServiceStages

__all__ = [
    "NO_LANE",
    "lane_kind",
    "config_kind",
    "build_lane",
    "finish_raised",
    "finish_returned",
    "finish_success",
    "refuse",
]

#: reads the breaker core of a lane's frame from its locals (see core/nesting.py)
_core_of = operator.itemgetter("core")

BULKHEAD, THROTTLE, BUDGET, GATE, DEADLINE = "bulkhead", "throttle", "budget", "gate", "deadline"


class _NoLane:
    """The lane's route while none of its kind is built: matches no configuration."""

    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = object()


#: what a pipeline's ``lane`` holds while no route of its lane's kind is built
NO_LANE: Any = _NoLane()

#: the stage objects each lane inlines the steps of
_SERVED: dict[str, tuple[type, ...]] = {
    BULKHEAD: (Bulkhead,),
    THROTTLE: (AdaptiveThrottle,),
    BUDGET: (RetryBudget, FleetRetryBudget),
    GATE: (RetryAfterGate,),
}


def lane_kind(held: ServiceStages | None, deadline: float | None) -> str | None:
    """The one stage *held* turns on, when a lane serves it: kept in this worker (a retry
    budget may be the fleet's: its calls are counted here too); or the ``deadline`` knob
    (*deadline* seconds) with no stage. None for no stage, several, or another kind."""
    if held is None:
        return None if deadline is None else DEADLINE
    if deadline is not None:
        return None
    stages = ((BULKHEAD, held.bulkhead), (THROTTLE, held.throttle), (BUDGET, held.budget), (GATE, held.gate))
    on = [(kind, stage) for kind, stage in stages if stage is not None]
    if len(on) != 1:
        return None
    kind, stage = on[0]
    return kind if isinstance(stage, _SERVED[kind]) else None


def config_kind(config: BreakerConfig) -> str | None:
    """The lane a call site built with *config* gets: the kind of its one load-aware stage
    (with no ``deadline`` knob), or the deadline's (the knob alone); None otherwise."""
    knobs = (
        (BULKHEAD, config.max_concurrent_calls is not None),
        (THROTTLE, config.adaptive_throttling_k is not None),
        (BUDGET, config.retry_budget_ratio is not None),
        (GATE, config.honor_retry_after),
    )
    on = [kind for kind, set_ in knobs if set_]
    if config.deadline is not None:
        return None if on else DEADLINE
    return on[0] if len(on) == 1 else None


def refuse(fallback: Any, args: tuple[Any, ...], kwargs: dict[str, Any], refusal: CallRefusedError) -> Any:
    """Raise *refusal*, or answer it with *fallback*."""
    if fallback is None:
        raise refusal
    return call_fallback(fallback, args, kwargs, refusal)


def finish_success(core: BreakerCore, permit: Any, mark: int, result: Any) -> Any:
    """Record a lane's plain success off the breaker's lock-free healthy lane (the window
    is not clean and full, or the cascade's second ended), unless a nested call through
    the same breaker recorded it. Returns *result*."""
    if not core.healthy_success(permit) and not settled_elsewhere(core, permit, mark):
        core.record_success(permit)
    return result


def finish_raised(
    route: Any,
    core: BreakerCore,
    permit: Any,
    mark: int,
    failed: Raised,
    policy: RetryPolicy | None,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The rest of a lane's call whose first attempt raised (*failed*; its stage has let
    go): the gate looks at the error, then it is settled as the breaker's wrapper settles
    it, or the retry engine goes on.

    Returns:
        The fallback's answer, or the retry sequence's result.

    Raises:
        BaseException: the error (or the sequence's final error, or a stage's refusal)
            when no fallback answers it.
    """
    held = route.held  # None on the deadline's lane
    exc = failed.error
    if held is not None and after_error(held, exc):
        held.gate.observe(exc)
    if policy is None or settled_elsewhere(core, permit, mark):
        answered = fallback is not None
        if settle_raised(core, permit, mark, exc, answered) and answered:
            return call_fallback(fallback, args, kwargs, exc)
        raise exc
    return _go_on(route, core, permit, policy, fallback, args, kwargs, failed)


def finish_returned(
    route: Any,
    core: BreakerCore,
    permit: Any,
    mark: int,
    result: Any,
    counted: bool,
    policy: RetryPolicy | None,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The rest of a lane's call whose first attempt returned *result*, a value to judge
    (a response): the throttle counts its accept when it succeeded and *counted*, the gate
    looks at it, then it is settled as the breaker's wrapper settles it, or the retry
    engine goes on. Returns *result*, or the retry sequence's result."""
    held = route.held  # None on the deadline's lane
    if held is not None and after_result(held, result, counted):
        held.gate.observe(result)
    if policy is None:
        settle_returned(core, permit, mark, result)
        return result
    if settled(core, permit, result, mark) or settled_elsewhere(core, permit, mark):
        return result
    return _go_on(route, core, permit, policy, fallback, args, kwargs, Returned(result))


def _go_on(
    route: Any,
    core: BreakerCore,
    permit: Any,
    policy: RetryPolicy,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    first: Outcome,
) -> Any:
    """The retry engine's further attempts, each through the route's per-attempt stages."""
    try:
        return continue_sync(core, permit, policy, route.attempt, args, kwargs, fallback, 0.0, first)
    except StageRefused as carried:
        return refuse(fallback, args, kwargs, carried.refusal)


def build_lane(
    kind: str,
    pipe: Any,
    core: BreakerCore,
    func: Callable[..., Any],
    policy: RetryPolicy | None,
    fallback: Any,
    slow: Callable[..., Any],
) -> Callable[..., Any]:
    """The lane of *kind* for a call site (see the module's text).

    Args:
        kind: one of the kinds :func:`lane_kind` returns.
        pipe: the call site's pipeline; its ``lane`` attribute is the route the lane
            runs with (:data:`NO_LANE` while none of *kind* is built).
        func: the protected function; policy: its retry policy or None; fallback: its
            fallback or None.
        slow: the pipeline's wrapper, which runs any call in full.

    Returns:
        A function with *func*'s signature: *slow* itself when a retry policy with a time
        budget times every first attempt.
    """
    if policy is not None and policy.budget_seconds is not None:
        return slow
    if kind == BULKHEAD:
        lane = _bulkhead_lane(pipe, core, func, (policy, fallback), slow)
    elif kind == THROTTLE:
        lane = _throttle_lane(pipe, core, func, (policy, fallback), slow)
    else:
        lane = _clock_lane(kind, pipe, core, func, (policy, fallback), slow)
        if kind == DEADLINE:
            register_lane(lane.__code__)  # its frames carry their call's deadline (see .deadline)
    register(lane.__code__, _core_of)  # its frames run calls (see core/nesting.py)
    return lane


# Each lane runs the call only on a route built in the breaker's current epoch (the
# pipeline's ``lane``: never one of a shared store, where consults fall due, nor one of a
# retry policy once a 429 cooldown gates first attempts), with the breaker on its quiet
# CLOSED lane and no deadline ever set in the process; else the slow way runs it all.


def _bulkhead_lane(pipe: Any, core: BreakerCore, func: Any, site: tuple[Any, Any], slow: Any) -> Callable[..., Any]:
    policy, fallback = site
    cascade = core.cascade
    monotonic = core.mono
    empty = queue.Empty

    def lane(*args: Any, **kwargs: Any) -> Any:
        route = pipe.lane
        permit = core.quiet_permit
        # (a waiter for a slot is served first: the slow way queues up behind it)
        if permit is None or route.epoch is not core.epoch or ARMED or route.waiters:
            return slow(*args, **kwargs)
        try:
            route.take()
        except empty:
            return slow(*args, **kwargs)  # every slot is taken: wait, or be refused
        mark = core.seq
        failed = None
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            failed = Raised(exc)
        finally:
            route.put(True)  # as Bulkhead.leave(): put first, look for waiters second
            if route.waiters:
                route.grant()
        if failed is not None:
            return finish_raised(route, core, permit, mark, failed, policy, fallback, args, kwargs)
        if type(result) not in core.plain_types:
            return finish_returned(route, core, permit, mark, result, False, policy, fallback, args, kwargs)
        if permit is not core.healthy_permit or monotonic() >= cascade.bucket_end:
            return finish_success(core, permit, mark, result)
        next(cascade.counter)
        return result

    return lane


def _throttle_lane(pipe: Any, core: BreakerCore, func: Any, site: tuple[Any, Any], slow: Any) -> Callable[..., Any]:
    policy, fallback = site
    cascade = core.cascade
    monotonic = core.mono

    def lane(*args: Any, **kwargs: Any) -> Any:
        route = pipe.lane
        permit = core.quiet_permit
        if permit is None or route.epoch is not core.epoch or ARMED:
            return slow(*args, **kwargs)
        throttle = route.throttle
        live = throttle.live  # the clock is read after the call (see the module's text)
        n = next(live.requests)  # as AdaptiveThrottle.admit()
        if n > live.free and throttle.refuses(live, n):
            return refuse(fallback, args, kwargs, refused(core, ThrottledError(core.name)).refusal)
        mark = core.seq
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            failed = Raised(exc)
        else:
            if type(result) not in core.plain_types:
                return finish_returned(route, core, permit, mark, result, True, policy, fallback, args, kwargs)
            now = monotonic()
            if now >= live.end or permit is not core.healthy_permit or now >= cascade.bucket_end:
                throttle.accepted()  # (the second the call began in ended: rolled there)
                return finish_success(core, permit, mark, result)
            next(live.accepts)  # as AdaptiveThrottle.accepted()
            next(cascade.counter)
            return result
        return finish_raised(route, core, permit, mark, failed, policy, fallback, args, kwargs)

    return lane


def _clock_lane(kind: str, pipe: Any, core: BreakerCore, func: Any, site: tuple[Any, Any], slow: Any) -> Any:
    """The lane of a stage whose step before the call is a clock read: the budget counts
    the call in its current second, the gate lets the call through once its end has
    passed, the deadline's call gets its deadline (a local of this frame)."""
    policy, fallback = site
    seconds = pipe.deadline
    budget, gate = kind == BUDGET, kind == GATE
    cascade = core.cascade
    monotonic = core.mono

    def lane(*args: Any, **kwargs: Any) -> Any:
        route = pipe.lane
        permit = core.quiet_permit
        if permit is None or route.epoch is not core.epoch or ARMED:
            return slow(*args, **kwargs)
        now = monotonic()
        if budget:
            end, counter = route.counts.live  # as RetryBudget.note_call()
            if now >= end:
                return slow(*args, **kwargs)  # a new second: the budget rolls its window there
            next(counter)
        elif gate:
            if route.gate.until > now:
                return slow(*args, **kwargs)  # the gate is closed: the slow way refuses the call
        else:
            at = now + seconds  # noqa: F841 - the call's deadline: deadline.in_force() reads it here
        mark = core.seq
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            failed = Raised(exc)
        else:
            if type(result) not in core.plain_types:
                return finish_returned(route, core, permit, mark, result, False, policy, fallback, args, kwargs)
            if permit is not core.healthy_permit or monotonic() >= cascade.bucket_end:
                return finish_success(core, permit, mark, result)
            next(cascade.counter)
            return result
        return finish_raised(route, core, permit, mark, failed, policy, fallback, args, kwargs)

    return lane
