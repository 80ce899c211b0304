"""The outbound stages of one protected call, and the wrappers that run them.

Order of the stages, outermost first::

    fallback > deadline > retry (and its budget) > admission (Retry-After gate, the
    breaker's state, adaptive throttling) > bulkhead > the call

The breaker's own wrapper (:mod:`..wrappers`) already runs the fallback, the admission by
state and the retry engine (:mod:`..runner`, :mod:`..retry`). A :class:`Pipeline` adds the
rest around and inside it:

* **outside** the breaker's wrapper, :func:`stage_wrapper` / :func:`astage_wrapper`: the
  deadline. A call whose deadline has passed is refused with
  :class:`~baldur_django.core.errors.DeadlineExceededError` before anything else (nothing
  contacted, nothing recorded) and answered by the fallback; otherwise the call's deadline
  is made current (:mod:`.deadline`), so the retry plan never waits past it and refuses an
  attempt that would start after it;
* **inside**, around every attempt (:meth:`Pipeline.attempt` / :meth:`Pipeline.aattempt`):
  an ``async def`` attempt still running at the deadline is cancelled and raises
  ``TimeoutError`` (a failure, as any timeout). The other stages plug in here, in this
  order, through the hooks below; a refusal there is carried out of the breaker's wrapper
  as :class:`StageRefused` (a ``BaseException`` that is not an ``Exception``: recorded as
  neither outcome, never retried, a trial's slot given back) and handed to the fallback by
  the outer wrapper.

Hooks (each None until its stage is built; see docs/outbound-stages.md):

* :attr:`Pipeline.gate` - the Retry-After gate, asked before each attempt; refuses with
  ``RateLimitCooldownError(service, remaining, reason="retry_after")``;
* :attr:`Pipeline.throttle` - :class:`AdaptiveThrottle`-like (``admit()``, ``accepted()``),
  asked before each attempt while CLOSED; refuses with ``ThrottledError``;
* :attr:`Pipeline.bulkhead` - :class:`Bulkhead`-like (``enter(timeout=)`` / ``aenter`` /
  ``leave``) around each attempt; refuses with ``BulkheadFullError``; ``timeout`` is the
  time the deadline leaves;
* :attr:`Pipeline.budget` - :class:`RetryBudget`-like, for the retry plan: ``note_call()``
  when a call begins, ``try_retry()`` before each retry (none left: the last attempt's
  outcome is final).

A pipeline is built once per decorated function or route, from the breaker's configuration
at that time (:func:`build_pipeline`); without any stage knob it is None and the breaker's
wrapper runs exactly as before. A deadline set by :func:`~.deadline.deadline` or the
request middleware reaches the calls of breakers without a pipeline too: their wrapper
tests :data:`~.deadline.ARMED` (empty until a deadline was ever set) and, while a deadline
is current, runs the call through :func:`run_staged` (the deadline stage around a wrapper
of the same call, built on the first such call). A deadline a staged call entered is
marked with its breaker, so the breaker's own wrapper inside runs the call as usual.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from contextvars import Token
from typing import Any

from ..breaker import CircuitBreaker, core_of
from ..calls import BreakerCore
from ..config import BreakerConfig
from ..errors import CallRefusedError, DeadlineExceededError
from ..events import CallRejected, bus
from ..retry import RetryPolicy
from ..runner import acall_fallback, call_fallback
from ..wrappers import STAGED, build_awrapper, build_wrapper, trial_policy
from .deadline import Deadline, current, enter_at, leave

__all__ = [
    "Pipeline",
    "StageRefused",
    "build_pipeline",
    "stage_wrapper",
    "astage_wrapper",
    "protected_wrapper",
    "aprotected_wrapper",
    "run_staged",
    "arun_staged",
]


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


class Pipeline:
    """The stages of one breaker, built from its configuration (see the module's text).

    Attributes:
        service (str): the breaker's name.
        deadline (float | None): the ``deadline`` knob, seconds; None: only a deadline set
            around the call applies.
        gate, throttle, bulkhead, budget: the other stages' objects, or None (hooks).
    """

    __slots__ = ("service", "deadline", "gate", "throttle", "bulkhead", "budget")

    def __init__(self, service: str, deadline: float | None) -> None:
        self.service = service
        self.deadline = deadline
        self.gate: Any = None
        self.throttle: Any = None
        self.bulkhead: Any = None
        self.budget: Any = None

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

    def attempt(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """*func* with the per-attempt stages around it (none is built yet: *func* itself)."""
        return func

    def aattempt(self, func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """The async :meth:`attempt`: an attempt still running at the deadline is cancelled
        and raises ``TimeoutError``, a failure."""

        async def attempt(*args: Any, **kwargs: Any) -> Any:
            found = current()
            if found is None:
                return await func(*args, **kwargs)
            left = found.left()
            if left <= 0:
                raise StageRefused(DeadlineExceededError(self.service))
            async with asyncio.timeout(left):
                return await func(*args, **kwargs)

        return attempt


def build_pipeline(config: BreakerConfig, service: str) -> Pipeline | None:
    """The stages *config* asks for, or None when it asks for none (the breaker's wrapper
    then runs alone, as it always did)."""
    if config.deadline is None:
        return None
    return Pipeline(service, config.deadline)


def stage_wrapper(
    core: BreakerCore, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any, pipeline: Pipeline
) -> Callable[..., Any]:
    """The wrapper of a ``def`` protected by a breaker with stages: the deadline outside the
    breaker's own wrapper, the per-attempt stages inside it (see the module's text).

    Returns:
        A function with *func*'s signature; it raises DeadlineExceededError (or another
        stage's refusal) when no fallback is given.
    """
    inner = build_wrapper(core, pipeline.attempt(func), policy, trial_policy(policy), fallback)

    def staged(*args: Any, **kwargs: Any) -> Any:
        token = pipeline.enter(core)
        if type(token) is DeadlineExceededError:
            if fallback is None:
                raise token
            return call_fallback(fallback, args, kwargs, token)
        try:
            return inner(*args, **kwargs)
        except StageRefused as carried:
            if fallback is None:
                raise carried.refusal from None
            return call_fallback(fallback, args, kwargs, carried.refusal)
        finally:
            leave(token)  # type: ignore[arg-type]  # a Token or None here

    return staged


def astage_wrapper(
    core: BreakerCore,
    func: Callable[..., Awaitable[Any]],
    policy: RetryPolicy | None,
    fallback: Any,
    pipeline: Pipeline,
) -> Callable[..., Awaitable[Any]]:
    """The async :func:`stage_wrapper`: an attempt still running at the deadline is
    cancelled (a failure: ``TimeoutError``); a coroutine-function fallback is awaited."""
    inner = build_awrapper(core, pipeline.aattempt(func), policy, trial_policy(policy), fallback)

    async def staged(*args: Any, **kwargs: Any) -> Any:
        token = pipeline.enter(core)
        if type(token) is DeadlineExceededError:
            if fallback is None:
                raise token
            return await acall_fallback(fallback, args, kwargs, token)
        try:
            return await inner(*args, **kwargs)
        except StageRefused as carried:
            if fallback is None:
                raise carried.refusal from None
            return await acall_fallback(fallback, args, kwargs, carried.refusal)
        finally:
            leave(token)  # type: ignore[arg-type]  # a Token or None here

    return staged


def protected_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Any], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Any]:
    """The wrapper of a protected ``def``: with stages when the breaker's configuration asks
    for any (:func:`stage_wrapper`), else the breaker's own wrapper (which goes through
    :func:`run_staged` while a deadline is current)."""
    pipeline = build_pipeline(breaker.config, breaker.name)
    core = core_of(breaker)
    if pipeline is not None:
        return stage_wrapper(core, func, policy, fallback, pipeline)
    return build_wrapper(core, func, policy, trial_policy(policy), fallback)


def aprotected_wrapper(
    breaker: CircuitBreaker, func: Callable[..., Awaitable[Any]], policy: RetryPolicy | None, fallback: Any
) -> Callable[..., Awaitable[Any]]:
    """The async :func:`protected_wrapper`."""
    pipeline = build_pipeline(breaker.config, breaker.name)
    core = core_of(breaker)
    if pipeline is not None:
        return astage_wrapper(core, func, policy, fallback, pipeline)
    return build_awrapper(core, func, policy, trial_policy(policy), fallback)


#: a breaker's own wrapper -> the staged wrapper that runs its calls under a deadline
#: (built on the first such call; it goes with the wrapper)
_staged: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = weakref.WeakKeyDictionary()


def run_staged(
    wrapper: Callable[..., Any],
    core: BreakerCore,
    func: Callable[..., Any],
    policy: RetryPolicy | None,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run one call of *wrapper* (a breaker's own wrapper of a ``def``, without stages of its
    own) under the current deadline: the deadline stage around a wrapper of the same call."""
    staged = _staged.get(wrapper)
    if staged is None:
        staged = _staged[wrapper] = stage_wrapper(core, func, policy, fallback, Pipeline(core.name, None))
    return staged(*args, **kwargs)


async def arun_staged(
    wrapper: Callable[..., Any],
    core: BreakerCore,
    func: Callable[..., Awaitable[Any]],
    policy: RetryPolicy | None,
    fallback: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The async :func:`run_staged` (an attempt still running at the deadline is cancelled)."""
    staged = _staged.get(wrapper)
    if staged is None:
        staged = _staged[wrapper] = astage_wrapper(core, func, policy, fallback, Pipeline(core.name, None))
    return await staged(*args, **kwargs)


STAGED[:] = [run_staged, arun_staged]
