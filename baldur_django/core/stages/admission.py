"""The stages of a service around one attempt, and the Retry-After gate before the breaker.

Before the breaker admits a call (its state), the Retry-After gate: :func:`check_gate`
(ignored while the breaker is forced closed; the emergency levels do not lift it); a fleet
gate first adopts the fleet's end when a read is due (:meth:`.service.ServiceStages.learn`).
A call the gate refuses never reaches the breaker's state check (no trial slot taken).

Before each attempt, in this order (the first refusal ends it, nothing is contacted):

1. the gate again, for the retries of a call with a retry policy (its first attempt was
   checked before the breaker);
2. adaptive throttling, while the breaker is CLOSED and not forced: ``admit()``;
3. the bulkhead: a slot, waiting at most the smaller of ``max_wait`` and the time the
   call's deadline leaves.

A refusal is raised as :class:`StageRefused` (see :mod:`.pipeline`) and published as a
``CallRejected`` event with its reason when a listener wants rejections.

After the attempt: the slot is given back on every way out; the gate looks at an answer
that asks for quiet (a rate-limit status or 503, raised or returned, with a usable
``Retry-After``); the throttle counts an accept when the attempt succeeded.

:func:`attempt_of` builds the attempt of a ``def`` for one service's stages, once per set
of stages (not per call): the components' methods bound as locals, a bulkhead alone in a
closure of its own; :func:`aadmit` / :func:`aleave` serve the ``async def`` attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..classify import SUCCESS, exception_is_rate_limit, exception_status, status_of
from ..errors import BulkheadFullError, CallRefusedError, RateLimitCooldownError, ThrottledError
from ..events import CallRejected, bus
from ..states import CircuitState
from .deadline import in_force
from .gate import UNAVAILABLE

if TYPE_CHECKING:
    from ..calls import BreakerCore
    from .service import ServiceStages

__all__ = [
    "StageRefused",
    "refused",
    "check_gate",
    "acheck_gate",
    "attempt_of",
    "admit",
    "aadmit",
    "after_result",
    "after_error",
    "leave",
    "aleave",
]

_CLOSED = CircuitState.CLOSED


class StageRefused(BaseException):
    """Carries a stage's refusal (:class:`CallRefusedError`) out of the breaker's wrapper:
    neither a success nor a failure, never retried; the outer wrapper hands
    :attr:`refusal` to the fallback, or raises it.

    Attributes:
        refusal (CallRefusedError): the refusal.
    """

    def __init__(self, refusal: CallRefusedError) -> None:
        super().__init__(refusal)
        self.refusal = refusal


def refused(core: BreakerCore, refusal: CallRefusedError) -> StageRefused:
    """*refusal* to raise from an attempt, published first as ``CallRejected`` (with its
    reason and ``retry_after``) when a listener wants rejections."""
    if bus.wants_rejections():
        bus.publish(CallRejected(core.name, core.clock.wall(), reason=refusal.reason, retry_after=refusal.retry_after))
    return StageRefused(refusal)


def _time_left() -> float | None:
    found = in_force()
    return None if found is None else max(0.0, found.left())


def check_gate(stages: ServiceStages, core: BreakerCore) -> None:
    """The Retry-After gate of a ``def``'s call (a fleet gate reads the store when a read
    is due). Raises StageRefused while the gate is closed, unless the breaker is forced
    closed."""
    if stages.fleet_gate:
        stages.learn(core.clock.monotonic(), core.config.sync_interval)
    try:
        stages.gate.check(forced_closed=core.forced == "closed")  # type: ignore[union-attr]  # asked: a gate
    except RateLimitCooldownError as refusal:
        raise refused(core, refusal) from None


async def acheck_gate(stages: ServiceStages, core: BreakerCore) -> None:
    """:func:`check_gate` for ``async def``: the fleet gate's read runs off the event loop."""
    if stages.fleet_gate and stages.read_due(core.clock.monotonic()):
        await asyncio.to_thread(stages.learn, core.clock.monotonic(), core.config.sync_interval)
    try:
        stages.gate.check(forced_closed=core.forced == "closed")  # type: ignore[union-attr]  # asked: a gate
    except RateLimitCooldownError as refusal:
        raise refused(core, refusal) from None


def _throttled(stages: ServiceStages, core: BreakerCore) -> bool:
    """The throttle before an attempt: whether it counted the request (an accept is due on
    success). Raises StageRefused."""
    throttle = stages.throttle
    if throttle is None or core.state is not _CLOSED or core.forced is not None:
        return False
    if not throttle.admit():
        raise refused(core, ThrottledError(core.name))
    return True


def _slot(stages: ServiceStages, core: BreakerCore) -> object:
    """A bulkhead slot, waiting at most the call's time left. Raises StageRefused."""
    try:
        return stages.bulkhead.enter(timeout=_time_left())  # type: ignore[union-attr]  # asked: a bulkhead exists
    except BulkheadFullError as refusal:
        raise refused(core, refusal) from None


def admit(stages: ServiceStages, core: BreakerCore, *, gated: bool = True) -> tuple[object, bool]:
    """Run the stages before one attempt of a ``def``.

    Args:
        gated: check the Retry-After gate too (the retries of a call; its first attempt
            was checked before the breaker).

    Returns:
        ``(ticket, counted)``: the bulkhead's ticket (None without a bulkhead) for
        :func:`leave`, and whether the throttle counted the request.

    Raises:
        StageRefused: the gate is closed, the throttle refused, or no bulkhead slot came
            free in time.
    """
    if gated and stages.gate is not None:
        check_gate(stages, core)
    counted = _throttled(stages, core)
    return (None if stages.bulkhead is None else _slot(stages, core)), counted


async def aadmit(stages: ServiceStages, core: BreakerCore, *, gated: bool = True) -> tuple[object, bool]:
    """:func:`admit` for ``async def``: the fleet gate's read and the bulkhead's wait never
    block the event loop."""
    if gated and stages.gate is not None:
        await acheck_gate(stages, core)
    counted = _throttled(stages, core)
    bulkhead = stages.bulkhead
    if bulkhead is None:
        return None, counted
    try:
        return await bulkhead.aenter(timeout=_time_left()), counted
    except BulkheadFullError as refusal:
        raise refused(core, refusal) from None


def attempt_of(
    stages: ServiceStages, core: BreakerCore, func: Callable[..., Any], *, retrying: bool
) -> Callable[..., Any]:
    """*func* with the per-attempt stages of *stages* around it, for a ``def``; *func*
    itself when none runs per attempt.

    Args:
        retrying: the call site has a retry policy: each attempt checks the gate too.
    """
    if stages.gate is None and stages.throttle is None:
        bulkhead = stages.bulkhead
        if bulkhead is None:
            return func
        return _bulkhead_attempt(stages, core, func)
    if stages.gate is None and stages.bulkhead is None:
        return _throttle_attempt(stages, core, func)
    if stages.throttle is None and stages.bulkhead is None and not retrying:
        return _observed(stages, func)
    return _attempt(stages, core, func, retrying)


def _observed(stages: ServiceStages, func: Callable[..., Any]) -> Callable[..., Any]:
    """*func* with the gate looking at its outcome (a gate alone, without retries: the
    gate was checked before the breaker)."""
    observe = stages.gate.observe  # type: ignore[union-attr]  # asked: a gate exists
    plain = stages.config.plain_types

    def attempt(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            if after_error(stages, exc):
                observe(exc)
            raise
        if type(result) not in plain and after_result(stages, result, False):
            observe(result)
        return result

    return attempt


def _throttle_attempt(stages: ServiceStages, core: BreakerCore, func: Callable[..., Any]) -> Callable[..., Any]:
    throttle: Any = stages.throttle
    ask, accepted = throttle.admit, throttle.accepted
    config = stages.config
    plain = config.plain_types

    def attempt(*args: Any, **kwargs: Any) -> Any:
        if core.state is not _CLOSED or core.forced is not None:
            return func(*args, **kwargs)  # throttling is for the CLOSED state only
        if not ask():
            raise refused(core, ThrottledError(core.name))
        result = func(*args, **kwargs)
        if type(result) in plain or config.classifier.result(result, stages.service) == SUCCESS:
            accepted()
        return result

    return attempt


def _bulkhead_attempt(stages: ServiceStages, core: BreakerCore, func: Callable[..., Any]) -> Callable[..., Any]:
    bulkhead: Any = stages.bulkhead
    take = getattr(bulkhead, "try_enter", None) or _no_slot  # a fleet bulkhead always asks the store
    give = bulkhead.leave

    def attempt(*args: Any, **kwargs: Any) -> Any:
        ticket = take()
        if ticket is None:
            ticket = _slot(stages, core)
        try:
            return func(*args, **kwargs)
        finally:
            give(ticket)

    return attempt


def _no_slot() -> None:
    return None


def _attempt(stages: ServiceStages, core: BreakerCore, func: Callable[..., Any], retrying: bool) -> Callable[..., Any]:
    gate = stages.gate
    gated = retrying and gate is not None
    plain = stages.config.plain_types
    throttle = stages.throttle

    def attempt(*args: Any, **kwargs: Any) -> Any:
        ticket, counted = admit(stages, core, gated=gated)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            if gate is not None and after_error(stages, exc):
                gate.observe(exc)
            raise
        finally:
            if ticket is not None:
                leave(stages, ticket)
        if type(result) in plain:
            if counted:
                throttle.accepted()  # type: ignore[union-attr]  # counted: a throttle exists
        elif after_result(stages, result, counted):
            gate.observe(result)  # type: ignore[union-attr]  # asked: a gate exists
        return result

    return attempt


def leave(stages: ServiceStages, ticket: object) -> None:
    """Give the bulkhead slot of *ticket* back (None: nothing to give back)."""
    if ticket is not None and stages.bulkhead is not None:
        stages.bulkhead.leave(ticket)


async def aleave(stages: ServiceStages, ticket: object) -> None:
    """:func:`leave` for ``async def``: a fleet slot is given back off the event loop."""
    bulkhead = stages.bulkhead
    if ticket is None or bulkhead is None:
        return
    give_back: Any = getattr(bulkhead, "aleave", None)
    if give_back is None:
        bulkhead.leave(ticket)
    else:
        await give_back(ticket)


def after_result(stages: ServiceStages, result: Any, counted: bool) -> bool:
    """Count an accept when the returned *result* is a success and the throttle counted
    the request (*counted*).

    Returns:
        True when *result* asks the gate for quiet (a rate-limit status or 503): the caller
        hands it to the gate's ``observe`` (a store write for a fleet gate).
    """
    config = stages.config
    plain = type(result) in config.plain_types
    if counted and (plain or config.classifier.result(result, stages.service) == SUCCESS):
        stages.throttle.accepted()  # type: ignore[union-attr]  # counted: a throttle exists
    if stages.gate is None or plain:
        return False
    code = status_of(result)
    return code is not None and (code == UNAVAILABLE or code in config.rate_limit_codes)


def after_error(stages: ServiceStages, error: BaseException) -> bool:
    """True when the raised *error* asks the gate for quiet (a rate-limit sighting or a
    503): the caller hands it to the gate's ``observe``."""
    if stages.gate is None or isinstance(error, StageRefused):
        return False
    codes = stages.config.rate_limit_codes
    return exception_is_rate_limit(error, codes) or exception_status(error) == UNAVAILABLE
