"""The per-attempt stages of a service: what runs just before and just after one attempt.

Before an attempt, in this order (the first refusal ends it, nothing is contacted):

1. the Retry-After gate: :meth:`check` (ignored while the breaker is forced closed; the
   emergency levels do not lift it); a fleet gate first adopts the fleet's end when a read
   is due (:meth:`.service.ServiceStages.learn`);
2. adaptive throttling, while the breaker is CLOSED and not forced: :meth:`admit`;
3. the bulkhead: a slot, waiting at most the smaller of ``max_wait`` and the time the
   call's deadline leaves.

A refusal is raised as :class:`StageRefused` (see :mod:`.pipeline`) and published as a
``CallRejected`` event with its reason when a listener wants rejections.

After the attempt: the slot is given back on every way out; the gate looks at an answer
that asks for quiet (a rate-limit status or 503, raised or returned, with a usable
``Retry-After``); the throttle counts an accept when the attempt succeeded.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..classify import SUCCESS, exception_is_rate_limit, exception_status, status_of
from ..errors import BulkheadFullError, CallRefusedError, RateLimitCooldownError, ThrottledError
from ..events import CallRejected, bus
from ..states import CircuitState
from .deadline import current
from .gate import UNAVAILABLE

if TYPE_CHECKING:
    from ..calls import BreakerCore
    from .service import ServiceStages

__all__ = ["StageRefused", "refused", "admit", "aadmit", "after_result", "after_error", "leave", "aleave"]

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
    found = current()
    return None if found is None else max(0.0, found.left())


def _admit(stages: ServiceStages, core: BreakerCore) -> bool:
    """The gate and the throttle. Returns whether the throttle counted the request (an
    accept is then due on success). Raises StageRefused."""
    gate = stages.gate
    if gate is not None:
        try:
            gate.check(forced_closed=core.forced == "closed")
        except RateLimitCooldownError as refusal:
            raise refused(core, refusal) from None
    throttle = stages.throttle
    if throttle is None or core.state is not _CLOSED or core.forced is not None:
        return False
    if not throttle.admit():
        raise refused(core, ThrottledError(core.name))
    return True


def admit(stages: ServiceStages, core: BreakerCore) -> tuple[object, bool]:
    """Run the stages before one attempt of a ``def``.

    Returns:
        ``(ticket, counted)``: the bulkhead's ticket (None without a bulkhead) for
        :func:`leave`, and whether the throttle counted the request.

    Raises:
        StageRefused: the gate is closed, the throttle refused, or no bulkhead slot came
            free in time.
    """
    if stages.fleet_gate:
        stages.learn(core.clock.monotonic(), core.config.sync_interval)
    counted = _admit(stages, core)
    bulkhead = stages.bulkhead
    if bulkhead is None:
        return None, counted
    try:
        return bulkhead.enter(timeout=_time_left()), counted
    except BulkheadFullError as refusal:
        raise refused(core, refusal) from None


async def aadmit(stages: ServiceStages, core: BreakerCore) -> tuple[object, bool]:
    """:func:`admit` for ``async def``: the fleet gate's read and the bulkhead's wait never
    block the event loop."""
    if stages.fleet_gate and stages.read_due(core.clock.monotonic()):
        await asyncio.to_thread(stages.learn, core.clock.monotonic(), core.config.sync_interval)
    counted = _admit(stages, core)
    bulkhead = stages.bulkhead
    if bulkhead is None:
        return None, counted
    try:
        return await bulkhead.aenter(timeout=_time_left()), counted
    except BulkheadFullError as refusal:
        raise refused(core, refusal) from None


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
