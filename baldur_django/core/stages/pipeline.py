"""The outbound stages of one protected call, and the wrappers that run them.

Order of the stages, outermost first::

    fallback > deadline > retry (and its budget) > admission (Retry-After gate, the
    breaker's state, adaptive throttling) > bulkhead > the call

The breaker's own wrapper (:mod:`..wrappers`) already runs the fallback, the admission by
state and the retry engine (:mod:`..runner`, :mod:`..retry`). A :class:`Pipeline` adds the
rest around and inside it:

* **outside** the breaker's wrapper (:meth:`Pipeline.around` / :meth:`Pipeline.aaround`):
  the deadline, the retry budget's count and the Retry-After gate. A call whose deadline
  has passed is refused with :class:`~baldur_django.core.errors.DeadlineExceededError`
  before anything else (nothing contacted, nothing recorded) and answered by the fallback;
  otherwise the call's deadline is made current (:mod:`.deadline`), so the retry plan never
  waits past it and refuses an attempt that would start after it. A service with a retry
  budget counts the call (``note_call()``); the retry plan asks the budget before each
  retry (:func:`.service.budget_of`). The gate is asked before the breaker's state check,
  so a call it refuses never takes a HALF_OPEN trial slot;
* **inside**, around every attempt (:func:`.admission.attempt_of`): adaptive throttling
  and the bulkhead (and the gate again for the retries of a call), then the call; the gate
  looks at the outcome. An ``async def`` attempt still running at the deadline is
  cancelled and raises ``TimeoutError`` (a failure, as any timeout). A refusal there is
  carried out of the breaker's wrapper as :class:`StageRefused` (a ``BaseException`` that
  is not an ``Exception``: recorded as neither outcome, never retried, a trial's slot given
  back) and handed to the fallback by the outer wrapper.

The gate, throttle, bulkhead and budget are the service's, shared by every call site of the
breaker (:mod:`.service`). Which stages a call site has at all is chosen when it is built
(:func:`build_pipeline`, once per decorated function or route): without any stage knob it
is None and the breaker's wrapper runs exactly as before. With stages, the call site keeps
one route per configuration of its breaker (:meth:`Pipeline.route`): the breaker's wrapper
of an attempt made for exactly the stages that are on, their methods bound once; a
reconfiguration (or a new store link) builds the next route on the following call, so no
call looks the stages up or loops over them. A deadline set by
:func:`~.deadline.deadline` or the request middleware reaches the calls of breakers without
a pipeline too: their wrapper tests :data:`~.deadline.ARMED` (empty until such a deadline
was ever entered) and, while a deadline is current, runs the call through ``run_staged`` of
:mod:`..wrappers` (the deadline stage around a wrapper of the same call). A deadline a
staged call entered is marked with its breaker, so the breaker's own wrapper inside runs
the call as usual; a ``deadline`` knob's arms nothing (see :mod:`.deadline`).

A call site with one stage alone (or the ``deadline`` knob alone) also gets a lane in front
of its staged wrapper (:mod:`.lanes`): its CLOSED healthy calls in one frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import Token
from typing import Any

from ..calls import BreakerCore
from ..config import BreakerConfig
from ..errors import DeadlineExceededError, RateLimitCooldownError
from ..events import CallRejected, bus
from ..retry import RetryPolicy
from ..runner import acall_fallback
from .admission import (
    StageRefused,
    aadmit,
    acheck_gate,
    after_error,
    after_result,
    aleave,
    attempt_of,
    check_gate,
    refused,
)
from .deadline import ARMED, Deadline, current, reset_deadline, set_deadline
from .deadline import leave as leave_deadline
from .lanes import BULKHEAD, NO_LANE, build_lane, config_kind, lane_kind, refuse
from .refusals import count_deadline
from .service import ServiceStages, service_stages, wants_stages

__all__ = ["Pipeline", "StageRefused", "build_pipeline"]


class _Route:
    """What a call site runs under one configuration of its breaker: the breaker's wrapper
    of the attempt built for the service's stages then, and the stages the outer wrapper
    runs itself (rebuilt when the configuration or the store link changes)."""

    __slots__ = (
        "epoch", "config", "sync", "inner", "attempt", "held", "gate", "fleet_gate", "note_call",
        "kind", "throttle", "counts", "take", "put", "waiters", "grant",
    )  # fmt: skip

    def __init__(
        self,
        core: BreakerCore,
        inner: Callable[..., Any],
        attempt: Callable[..., Any],
        held: ServiceStages | None,
        deadline: float | None,
    ) -> None:
        self.epoch = core.epoch  # read first: a change made after it makes this route stale
        self.config = core.config
        self.sync: object = core.sync
        self.inner = inner
        self.attempt = attempt
        self.held = held
        self.gate = None if held is None else held.gate
        self.fleet_gate = held is not None and held.fleet_gate
        self.note_call = None if held is None or held.budget is None else held.budget.note_call
        # what a lane (.lanes) reads: its kind (None: no lane runs on this route), its stage
        self.kind = None if core.timed else lane_kind(held, deadline)
        self.throttle = None if held is None else held.throttle
        self.counts = None if held is None or held.budget is None else held.budget.counts
        self.take = self.put = self.waiters = self.grant = None
        if self.kind == BULKHEAD:
            self.take, self.put, self.waiters, self.grant = held.bulkhead.lane_steps()  # type: ignore[union-attr]


class Pipeline:
    """The stages of one call site, built from its breaker's configuration (see the
    module's text).

    Attributes:
        service (str): the breaker's name.
        deadline (float | None): the ``deadline`` knob, seconds; None: only a deadline set
            around the call applies.
        staged (bool): the configuration turned on a service stage (gate, throttle,
            bulkhead or retry budget) when the call site was built.
    """

    __slots__ = ("service", "deadline", "staged", "lane_kind", "retrying", "lane", "_held", "_route")

    def __init__(
        self, service: str, deadline: float | None, *, staged: bool = False, lane_kind: str | None = None
    ) -> None:
        self.service = service
        self.deadline = deadline
        self.staged = staged
        self.lane_kind = lane_kind
        self.retrying = False  # the lane's call site has a retry policy (set by around())
        self.lane: Any = NO_LANE
        self._held: ServiceStages | None = None
        self._route: _Route | None = None

    def stages(self, core: BreakerCore) -> ServiceStages | None:
        """The service's stages for *core*'s current configuration (None: none is on)."""
        held = self._held
        if held is not None and core.config is held.config and core.sync is held.sync:
            return held
        held = self._held = service_stages(core) if self.staged else None
        return held

    def enter(self, core: BreakerCore) -> Token[Deadline | None] | DeadlineExceededError | None:
        """Make the call's deadline current (its knob's, unless the current one is earlier).
        A knob's deadline arms nothing (see :mod:`.deadline`).

        Returns:
            The token to :func:`~.deadline.leave` with; None when the call has no deadline;
            the refusal when its deadline has passed already (nothing was entered).
        """
        found = current()
        seconds = self.deadline
        if found is None:
            if seconds is None:
                return None
            clock = core.clock  # the knob alone (the usual case): nothing to compare
            return set_deadline(Deadline(clock.monotonic() + seconds, clock, core))
        left = found.left()
        if seconds is not None and seconds < left:
            clock = core.clock
            return set_deadline(Deadline(clock.monotonic() + seconds, clock, core))
        if left <= 0:
            count_deadline(core)  # the refusal path only
            if bus.wants_rejections():  # tracing: a refusal, as the retry stage's are published
                bus.publish(CallRejected(self.service, core.clock.wall(), reason="deadline", retry_after=None))
            return DeadlineExceededError(self.service)
        if found.owner is not core:  # marked: the breaker's own wrapper below runs the call
            found = Deadline(found.at, found.clock, core)
        return set_deadline(found)

    def route(
        self, core: BreakerCore, build: Callable[[Callable[..., Any]], Callable[..., Any]], attempt: Any
    ) -> _Route:
        """The route of *core*'s current configuration: built again when it changed.

        Args:
            build: makes the breaker's wrapper of an attempt.
            attempt: ``attempt(held)``: the attempt for the service's stages *held* (None:
                no stage is on).
        """
        route = self._route
        if route is not None and route.config is core.config and route.sync is core.sync:
            return route
        held = self.stages(core)
        made = attempt(held)
        route = self._route = _Route(core, build(made), made, held, self.deadline)
        laned = route.kind is not None and route.kind == self.lane_kind
        self.lane = route if laned and not (self.retrying and core.cooldown_until) else NO_LANE
        return route

    def around(
        self,
        core: BreakerCore,
        func: Callable[..., Any],
        build: Callable[[Callable[..., Any]], Callable[..., Any]],
        fallback: Any,
        *,
        policy: RetryPolicy | None = None,
    ) -> Callable[..., Any]:
        """The wrapper of a ``def`` with stages: the deadline, the budget's count and the
        gate around the breaker's own wrapper (*build*) of the attempt (module's text).
        A call site with one load-aware stage gets the lane of that stage in front of it
        (:mod:`.lanes`).

        Args:
            func: the protected function; fallback: answers a refusal, or None.
            build: ``build(attempt)``: the breaker's wrapper of *attempt* (again after a
                reconfiguration); policy: the retry policy, or None (retries check the gate).

        Returns:
            A function with *func*'s signature; it raises DeadlineExceededError (or another
            stage's refusal) when no fallback is given.
        """
        staged = self._around(core, func, build, fallback, retrying=policy is not None)
        if self.lane_kind is None:
            return staged
        self.retrying = policy is not None
        return build_lane(self.lane_kind, self, core, func, policy, fallback, staged)

    def _around(
        self,
        core: BreakerCore,
        func: Callable[..., Any],
        build: Callable[[Callable[..., Any]], Callable[..., Any]],
        fallback: Any,
        *,
        retrying: bool,
    ) -> Callable[..., Any]:
        seconds = self.deadline
        clock = core.clock
        mono = clock.monotonic

        def attempt(held: ServiceStages | None) -> Callable[..., Any]:
            return func if held is None else attempt_of(held, core, func, retrying=retrying)

        def staged(*args: Any, **kwargs: Any) -> Any:
            route = self._route
            if route is None or route.config is not core.config or route.sync is not core.sync:
                route = self.route(core, build, attempt)
            if seconds is not None and current() is None:  # the knob alone: nothing to compare
                token: Any = set_deadline(Deadline(mono() + seconds, clock, core))  # (arms nothing)
            elif ARMED:
                token = self.enter(core)
                if type(token) is DeadlineExceededError:
                    return refuse(fallback, args, kwargs, token)
            else:
                token = None
            try:
                if route.note_call is not None:
                    route.note_call()
                if route.gate is not None:
                    if route.fleet_gate:
                        check_gate(route.held, core)  # type: ignore[arg-type]  # a gate: a holder
                    else:
                        try:
                            route.gate.check(forced_closed=core.forced == "closed")
                        except RateLimitCooldownError as refusal:
                            raise refused(core, refusal) from None
                return route.inner(*args, **kwargs)
            except StageRefused as carried:
                return refuse(fallback, args, kwargs, carried.refusal)
            finally:
                if token is not None:
                    reset_deadline(token)

        return staged

    def aaround(
        self,
        core: BreakerCore,
        func: Callable[..., Awaitable[Any]],
        build: Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]],
        fallback: Any,
        *,
        retrying: bool = False,
    ) -> Callable[..., Awaitable[Any]]:
        """The async :meth:`around`: an attempt still running at the deadline is cancelled
        and raises ``TimeoutError``, a failure; a fleet stage's store I/O runs off the event
        loop; a coroutine-function fallback is awaited."""
        timed = _timed(self.service, func)

        def attempt(held: ServiceStages | None) -> Callable[..., Awaitable[Any]]:
            return timed if held is None or not held.per_attempt else _aattempt(held, core, timed, retrying)

        async def staged(*args: Any, **kwargs: Any) -> Any:
            route = self._route
            if route is None or route.config is not core.config or route.sync is not core.sync:
                route = self.route(core, build, attempt)
            token = self.enter(core)
            if type(token) is DeadlineExceededError:
                if fallback is None:
                    raise token
                return await acall_fallback(fallback, args, kwargs, token)
            try:
                if route.note_call is not None:
                    route.note_call()
                if route.gate is not None:
                    await acheck_gate(route.held, core)  # type: ignore[arg-type]  # a gate: a holder
                return await route.inner(*args, **kwargs)
            except StageRefused as carried:
                if fallback is None:
                    raise carried.refusal from None
                return await acall_fallback(fallback, args, kwargs, carried.refusal)
            finally:
                leave_deadline(token)  # type: ignore[arg-type]  # a Token or None here

        return staged


def _aattempt(
    held: ServiceStages, core: BreakerCore, timed: Callable[..., Awaitable[Any]], retrying: bool
) -> Callable[..., Awaitable[Any]]:
    """The attempt of an ``async def`` with the per-attempt stages of *held* around it."""
    gated = retrying and held.gate is not None

    async def attempt(*args: Any, **kwargs: Any) -> Any:
        ticket, counted = await aadmit(held, core, gated=gated)
        try:
            result = await timed(*args, **kwargs)
        except BaseException as exc:
            if after_error(held, exc):
                await _observe(held, exc)
            raise
        finally:
            await aleave(held, ticket)
        if after_result(held, result, counted):
            await _observe(held, result)
        return result

    return attempt


def _timed(service: str, func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """*func* cancelled at the current deadline (``TimeoutError``); refused when it has
    passed already."""

    async def attempt(*args: Any, **kwargs: Any) -> Any:
        found = current()
        if found is None:
            return await func(*args, **kwargs)
        left = found.left()
        if left <= 0:
            raise StageRefused(DeadlineExceededError(service))
        async with asyncio.timeout(left):
            return await func(*args, **kwargs)

    return attempt


async def _observe(held: ServiceStages, outcome: object) -> None:
    gate = held.gate
    if gate is None:
        return
    if held.fleet_gate:
        await asyncio.to_thread(gate.observe, outcome)  # one store write: off the event loop
    else:
        gate.observe(outcome)


def build_pipeline(config: BreakerConfig, service: str) -> Pipeline | None:
    """The stages *config* asks for, or None when it asks for none (the breaker's wrapper
    then runs alone, as it always did)."""
    staged = wants_stages(config)
    if config.deadline is None and not staged:
        return None
    return Pipeline(service, config.deadline, staged=staged, lane_kind=config_kind(config))
