"""The outbound stages of one protected call, and the wrappers that run them.

Order of the stages, outermost first::

    fallback > deadline > retry (and its budget) > admission (Retry-After gate, the
    breaker's state, adaptive throttling) > bulkhead > the call

The breaker's own wrapper (:mod:`..wrappers`) already runs the fallback, the admission by
state and the retry engine (:mod:`..runner`, :mod:`..retry`). A :class:`Pipeline` adds the
rest around and inside it:

* **outside** the breaker's wrapper (:meth:`Pipeline.around` / :meth:`Pipeline.aaround`):
  the deadline and the retry budget's count. A call whose deadline has passed is refused
  with :class:`~baldur_django.core.errors.DeadlineExceededError` before anything else
  (nothing contacted, nothing recorded) and answered by the fallback; otherwise the call's
  deadline is made current (:mod:`.deadline`), so the retry plan never waits past it and
  refuses an attempt that would start after it. A service with a retry budget counts the
  call (``note_call()``); the retry plan asks the budget before each retry
  (:func:`.service.budget_of`);
* **inside**, around every attempt (:meth:`Pipeline.attempt` / :meth:`Pipeline.aattempt`):
  the Retry-After gate, adaptive throttling and the bulkhead (:mod:`.admission`), then the
  call; an ``async def`` attempt still running at the deadline is cancelled and raises
  ``TimeoutError`` (a failure, as any timeout). A refusal there is carried out of the
  breaker's wrapper as :class:`StageRefused` (a ``BaseException`` that is not an
  ``Exception``: recorded as neither outcome, never retried, a trial's slot given back) and
  handed to the fallback by the outer wrapper.

The gate, throttle, bulkhead and budget are the service's, shared by every call site of the
breaker (:mod:`.service`); a pipeline finds them through the breaker's core on each call
and follows a reconfiguration. Which stages a call site has at all is chosen when it is
built (:func:`build_pipeline`, once per decorated function or route): without any stage
knob it is None and the breaker's wrapper runs exactly as before. A deadline set by
:func:`~.deadline.deadline` or the request middleware reaches the calls of breakers without
a pipeline too: their wrapper tests :data:`~.deadline.ARMED` (empty until a deadline was
ever set) and, while a deadline is current, runs the call through ``run_staged`` of
:mod:`..wrappers` (the deadline stage around a wrapper of the same call). A deadline a
staged call entered is marked with its breaker, so the breaker's own wrapper inside runs
the call as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import Token
from typing import Any

from ..calls import BreakerCore
from ..config import BreakerConfig
from ..errors import DeadlineExceededError
from ..events import CallRejected, bus
from ..runner import acall_fallback, call_fallback
from .admission import StageRefused, aadmit, admit, after_error, after_result, aleave, leave
from .deadline import Deadline, current, enter_at
from .deadline import leave as leave_deadline
from .service import ServiceStages, service_stages, wants_stages

__all__ = ["Pipeline", "StageRefused", "build_pipeline"]


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

    __slots__ = ("service", "deadline", "staged", "_held")

    def __init__(self, service: str, deadline: float | None, *, staged: bool = False) -> None:
        self.service = service
        self.deadline = deadline
        self.staged = staged
        self._held: ServiceStages | None = None

    def stages(self, core: BreakerCore) -> ServiceStages | None:
        """The service's stages for *core*'s current configuration (None: none is on)."""
        held = self._held
        if held is not None and core.config is held.config and core.sync is held.sync:
            return held
        held = self._held = service_stages(core)
        return held

    def enter(self, core: BreakerCore) -> Token[Deadline | None] | DeadlineExceededError | None:
        """Make the call's deadline current (its knob's, unless the current one is earlier).

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
            return enter_at(Deadline(clock.monotonic() + seconds, clock, core))
        left = found.left()
        if seconds is not None and seconds < left:
            clock = core.clock
            return enter_at(Deadline(clock.monotonic() + seconds, clock, core))
        if left <= 0:
            if bus.wants_rejections():  # tracing: a refusal, as the retry stage's are published
                bus.publish(CallRejected(self.service, core.clock.wall(), reason="deadline", retry_after=None))
            return DeadlineExceededError(self.service)
        if found.owner is not core:  # marked: the breaker's own wrapper below runs the call
            found = Deadline(found.at, found.clock, core)
        return enter_at(found)

    def begin(self, core: BreakerCore) -> None:
        """A call begins: the service's retry budget counts it."""
        held = self._held
        if held is None or core.config is not held.config or core.sync is not held.sync:
            held = self.stages(core)
        if held is not None and held.budget is not None:
            held.budget.note_call()

    def attempt(self, core: BreakerCore, func: Callable[..., Any]) -> Callable[..., Any]:
        """*func* with the per-attempt stages around it (:mod:`.admission`); *func* itself
        when the call site has none."""
        if not self.staged:
            return func

        def attempt(*args: Any, **kwargs: Any) -> Any:
            held = self._held  # set by begin() of this call
            if held is None or not held.per_attempt or held.config is not core.config:
                return func(*args, **kwargs)
            ticket, counted = admit(held, core)
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                if after_error(held, exc):
                    held.gate.observe(exc)  # type: ignore[union-attr]  # asked: a gate exists
                raise
            finally:
                leave(held, ticket)
            if after_result(held, result, counted):
                held.gate.observe(result)  # type: ignore[union-attr]
            return result

        return attempt

    def aattempt(self, core: BreakerCore, func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """The async :meth:`attempt`: an attempt still running at the deadline is cancelled
        and raises ``TimeoutError``, a failure; a fleet stage's store I/O runs off the event
        loop."""
        timed = _timed(self.service, func)
        if not self.staged:
            return timed

        async def attempt(*args: Any, **kwargs: Any) -> Any:
            held = self._held  # set by begin() of this call
            if held is None or not held.per_attempt or held.config is not core.config:
                return await timed(*args, **kwargs)
            ticket, counted = await aadmit(held, core)
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

    def around(self, core: BreakerCore, inner: Callable[..., Any], fallback: Any) -> Callable[..., Any]:
        """The wrapper of a ``def`` with stages: the deadline and the budget's count around
        *inner*, the breaker's own wrapper of :meth:`attempt` (see the module's text).

        Returns:
            A function with *inner*'s signature; it raises DeadlineExceededError (or another
            stage's refusal) when no fallback is given.
        """
        staged_site = self.staged

        def staged(*args: Any, **kwargs: Any) -> Any:
            token = self.enter(core)
            if type(token) is DeadlineExceededError:
                if fallback is None:
                    raise token
                return call_fallback(fallback, args, kwargs, token)
            try:
                if staged_site:
                    self.begin(core)
                return inner(*args, **kwargs)
            except StageRefused as carried:
                if fallback is None:
                    raise carried.refusal from None
                return call_fallback(fallback, args, kwargs, carried.refusal)
            finally:
                leave_deadline(token)  # type: ignore[arg-type]  # a Token or None here

        return staged

    def aaround(
        self, core: BreakerCore, inner: Callable[..., Awaitable[Any]], fallback: Any
    ) -> Callable[..., Awaitable[Any]]:
        """The async :meth:`around`; a coroutine-function fallback is awaited."""
        staged_site = self.staged

        async def staged(*args: Any, **kwargs: Any) -> Any:
            token = self.enter(core)
            if type(token) is DeadlineExceededError:
                if fallback is None:
                    raise token
                return await acall_fallback(fallback, args, kwargs, token)
            try:
                if staged_site:
                    self.begin(core)
                return await inner(*args, **kwargs)
            except StageRefused as carried:
                if fallback is None:
                    raise carried.refusal from None
                return await acall_fallback(fallback, args, kwargs, carried.refusal)
            finally:
                leave_deadline(token)  # type: ignore[arg-type]  # a Token or None here

        return staged


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
    return Pipeline(service, config.deadline, staged=staged)
