"""CB-19 with FAC-2: a call through a breaker is one outcome, whatever runs inside it.

A function protected by breaker X runs inside a call through X (the outer call): the outer
call's outcome is the one the breaker counts, and the nested calls count nothing of their
own. With a retry stage on the outer call that outcome is the retry sequence's final one
(FAC-2). Each scenario runs with four outer forms: ``protect``, a decorated ``def``,
``aprotect`` and a decorated ``async def``; the nested function is a decorated ``def`` or
``async def`` to match.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import baldur_django as baldur

OPTS = {
    "failure_threshold": 3,
    "failure_rate_threshold": 0,
    "recovery_timeout": 5,
    "half_open_max_calls": 1,
    "sliding_window_size": 10,
    "minimum_calls": 1,
}
FAST_RETRY = baldur.RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)
OUTERS = ["protect", "decorated-def", "aprotect", "decorated-async"]
# "warm": the window is full of successes first, so the outer call starts on the breaker's
# lock-free healthy lane (which marks nothing); "cold": an empty window
WARMTH = ["cold", "warm"]


class Down(Exception):
    """The dependency's own failure (counted)."""


class NotFound(Exception):
    """An exception the breaker is told to ignore."""


class Dependency:
    """Answers or raises by a script of outcomes (True: answer); the last entry repeats."""

    def __init__(self, *script):
        self.script = list(script) or [True]
        self.calls = 0

    def __call__(self):
        ok = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if ok is True:
            return "answer"
        raise ok if isinstance(ok, BaseException) else Down("down")


def build(outer_form, name, body, *, retry=False, options=None, defaults=False):
    """The outer call of *outer_form* through breaker *name* around ``body(inner)``, where
    *inner* calls the dependency through the same breaker. Returns a zero-argument callable
    that runs one outer call and returns its value or the exception it raised."""
    options = {**({} if defaults else OPTS), **(options or {})}
    dep = body.dep
    if outer_form in ("protect", "decorated-def"):

        @baldur.protected(name, **options)
        def inner():
            return dep()

        if outer_form == "protect":

            def outer():
                return baldur.protect(name, lambda: body(inner), retry=retry, **options)

        else:

            @baldur.protected(name, retry=retry, **options)
            def outer():
                return body(inner)

        def run():
            try:
                return outer()
            except Exception as exc:  # the test looks at it
                return exc

        return run

    @baldur.protected(name, **options)
    async def ainner():
        await asyncio.sleep(0)
        return dep()

    if outer_form == "aprotect":

        async def aouter():
            return await baldur.aprotect(name, lambda: body.arun(ainner), retry=retry, **options)

    else:

        @baldur.protected(name, retry=retry, **options)
        async def aouter():
            return await body.arun(ainner)

    def arun():
        try:
            return asyncio.run(aouter())
        except Exception as exc:  # the test looks at it
            return exc

    return arun


class Once:
    """Outer body: one nested call."""

    def __init__(self, dep):
        self.dep = dep

    def __call__(self, inner):
        return inner()

    async def arun(self, inner):
        return await inner()


class IgnoredThenDown(Once):
    """Outer body: the nested call ends in an ignored exception, then the outer code raises
    a counted error of its own."""

    def __call__(self, inner):
        try:
            inner()
        except NotFound:
            raise Down("outer failed") from None

    async def arun(self, inner):
        try:
            await inner()
        except NotFound:
            raise Down("outer failed") from None


class Twice(Once):
    """Outer body: two nested calls (the dependency's script decides each)."""

    def __call__(self, inner):
        inner()
        return inner()

    async def arun(self, inner):
        await inner()
        return await inner()


def open_then_wait(breaker, clock):
    for _ in range(3):
        breaker.record_failure(breaker.acquire())
    assert breaker.state is baldur.CircuitState.OPEN
    clock.advance(5)


def counts(breaker):
    snap = breaker.snapshot()
    calls = breaker.metrics()["calls"]
    return snap["consecutive_failures"], snap["window_failures"], snap["window_calls"], calls["failure"]


def warm_up(breaker, warmth, size=10):
    """Fill the window with *size* successes for "warm"; returns the window calls one more
    outcome leaves (the window is full when warm)."""
    if warmth == "cold":
        return 1
    for _ in range(size):
        breaker.record_success(breaker.acquire())
    assert breaker.snapshot()["window_calls"] == size
    return size


# ------------------------------------------------------------------ retry around nesting
@pytest.mark.parametrize("warmth", WARMTH)
@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_fac2_nested_retry_sequence_is_one_failure(outer_form, warmth, clock):
    """CB-19, FAC-2: an outer call with a retry stage around a nested call through the same
    breaker: three failed attempts are one failure (consecutive count, window, metrics)."""
    name = f"nest-retry-{outer_form}-{warmth}"
    body = Once(Dependency(False))
    run = build(outer_form, name, body, retry=FAST_RETRY)
    breaker = baldur.get_breaker(name)
    calls = warm_up(breaker, warmth)
    assert isinstance(run(), Down)
    assert body.dep.calls == 3
    assert counts(breaker) == (1, 1, calls, 1)


@pytest.mark.parametrize("warmth", WARMTH)
@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_fac2_nested_retry_that_recovers_is_one_success(outer_form, warmth, clock):
    """CB-19, FAC-2: with the package's defaults, a dependency that fails twice and then
    answers, called through a retrying outer call around a nested one, is a success each
    time: the breaker stays CLOSED and its window holds only successes."""
    name = f"nest-recover-{outer_form}-{warmth}"
    outcomes = []
    body = Once(Dependency(False, False, True))
    run = build(outer_form, name, body, retry=FAST_RETRY, defaults=True)
    breaker = baldur.get_breaker(name)
    warm_up(breaker, warmth, size=100)
    for _ in range(12):
        body.dep.calls = 0
        outcomes.append(run())
    assert outcomes == ["answer"] * 12
    snap = breaker.snapshot()
    assert (snap["state"], snap["window_failures"]) == ("closed", 0)
    assert snap["window_calls"] == (12 if warmth == "cold" else 100)
    assert breaker.metrics()["calls"]["failure"] == 0


# ------------------------------------------------------- an ignored nested exception
@pytest.mark.parametrize("warmth", WARMTH)
@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_closed_outer_failure_after_nested_ignored_counts(outer_form, warmth, clock):
    """CB-19, CB-10: in CLOSED, a nested call ending in an ignored exception and then a counted
    error of the outer call is one failure: three such calls open the breaker."""
    name = f"nest-ign-{outer_form}-{warmth}"
    body = IgnoredThenDown(Dependency(NotFound("gone")))
    run = build(outer_form, name, body, options={"ignore_exceptions": (NotFound,)})
    breaker = baldur.get_breaker(name)
    calls = warm_up(breaker, warmth)
    for expected in (1, 2):
        assert isinstance(run(), Down)
        assert counts(breaker) == (expected, expected, max(calls, expected), expected)
    assert isinstance(run(), Down)
    assert breaker.state is baldur.CircuitState.OPEN


@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_half_open_outer_failure_after_nested_ignored_fails_the_trial(outer_form, clock, events):
    """CB-19, CB-6: in HALF_OPEN the same call is a failed trial: the breaker reopens
    (trigger half_open_failure) instead of handing the slot back as ignored."""
    name = f"nest-ign-ho-{outer_form}"
    body = IgnoredThenDown(Dependency(NotFound("gone")))
    run = build(outer_form, name, body, options={"ignore_exceptions": (NotFound,)})
    breaker = baldur.get_breaker(name)
    open_then_wait(breaker, clock)
    assert isinstance(run(), Down)
    assert breaker.state is baldur.CircuitState.OPEN
    assert events.transitions()[-1] == ("half_open", "open", "half_open_failure")


# ------------------------------------------------------- two nested calls in one call
@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_half_open_two_nested_calls_failed_trial_reopens(outer_form, clock, events):
    """CB-19, CB-6: a trial whose outer call makes two nested calls, the first answered and
    the second failing, is one failed trial: the breaker reopens and never closes."""
    name = f"nest-two-ho-{outer_form}"
    body = Twice(Dependency(True, False))
    run = build(outer_form, name, body)
    breaker = baldur.get_breaker(name)
    open_then_wait(breaker, clock)
    assert isinstance(run(), Down)
    assert body.dep.calls == 2
    assert breaker.state is baldur.CircuitState.OPEN
    assert [t for t in events.transitions() if t[1] == "closed"] == []
    assert events.transitions()[-1] == ("half_open", "open", "half_open_failure")


@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_half_open_two_nested_successes_are_one_trial(outer_form, clock):
    """CB-19, CB-6: with two trial slots, one outer call making two answered nested calls is
    one trial success: the breaker stays HALF_OPEN until a second, separate call."""
    name = f"nest-two-ok-{outer_form}"
    body = Twice(Dependency(True))
    run = build(outer_form, name, body, options={"half_open_max_calls": 2})
    breaker = baldur.get_breaker(name)
    open_then_wait(breaker, clock)
    assert run() == "answer"
    snap = breaker.snapshot()
    assert (snap["state"], snap["half_open_successes"]) == ("half_open", 1)
    assert run() == "answer"
    assert breaker.state is baldur.CircuitState.CLOSED


@pytest.mark.parametrize("warmth", WARMTH)
@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_closed_two_nested_calls_are_one_outcome(outer_form, warmth, clock):
    """CB-19: in CLOSED an outer call making two nested calls, the first answered and the
    second failing, is one failure and nothing else in the window. (Warm, the first nested
    call's success is taken by the lock-free healthy lane, which only counts a call for the
    429 cascade: the success counter is compared in the cold case.)"""
    name = f"nest-two-{outer_form}-{warmth}"
    body = Twice(Dependency(True, False))
    run = build(outer_form, name, body)
    breaker = baldur.get_breaker(name)
    calls = warm_up(breaker, warmth)
    successes = breaker.metrics()["calls"]["success"]
    assert isinstance(run(), Down)
    assert counts(breaker) == (1, 1, calls, 1)
    if warmth == "cold":
        assert breaker.metrics()["calls"]["success"] == successes


# ------------------------------------------- a nested fallback inside a retry sequence
class FailsThenFallsBack(Once):
    """Outer body: the first attempt fails on its own (no nested call); the second makes a
    nested call whose dependency fails and whose fallback answers."""

    def __init__(self, dep):
        super().__init__(dep)
        self.attempts = 0

    def __call__(self, inner):
        self.attempts += 1
        if self.attempts == 1:
            raise Down("outer attempt failed")
        return inner()

    async def arun(self, inner):
        self.attempts += 1
        if self.attempts == 1:
            raise Down("outer attempt failed")
        return await inner()


@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_fac2_nested_fallback_in_a_later_attempt_is_the_one_failure(outer_form, clock):
    """CB-19, FAC-2, FAC-4: a retrying outer call whose second attempt gets a nested call's
    fallback value: the dependency failed, so the call is one failure (recorded once), and
    the fallback's value is what the caller gets; no success is counted for it."""
    name = f"nest-retry-fb-{outer_form}"
    body = FailsThenFallsBack(Dependency(False))
    options = {**OPTS}
    if outer_form in ("protect", "decorated-def"):

        @baldur.protected(name, fallback=lambda: "fallback", **options)
        def inner():
            return body.dep()

        if outer_form == "protect":
            value = baldur.protect(name, lambda: body(inner), retry=FAST_RETRY, **options)
        else:
            value = baldur.protected(name, retry=FAST_RETRY, **options)(lambda: body(inner))()
    else:

        @baldur.protected(name, fallback=lambda: "fallback", **options)
        async def ainner():
            return body.dep()

        if outer_form == "aprotect":
            value = asyncio.run(baldur.aprotect(name, lambda: body.arun(ainner), retry=FAST_RETRY, **options))
        else:

            async def aouter():
                return await body.arun(ainner)

            value = asyncio.run(baldur.protected(name, retry=FAST_RETRY, **options)(aouter)())
    assert value == "fallback"
    assert body.attempts == 2
    breaker = baldur.get_breaker(name)
    assert counts(breaker) == (1, 1, 1, 1)
    assert breaker.metrics()["calls"]["success"] == 0


# ------------------------------------------------ other threads and tasks are other calls
def test_cb19_a_call_in_another_thread_is_its_own_call(clock):
    """CB-19, CB-9: while an outer call runs in one thread, a failing call through the same
    breaker in another thread counts its own failure (it is not nested in the first)."""
    name = "nest-threads"
    inside, done = threading.Event(), threading.Event()
    dep = Dependency(False)

    @baldur.protected(name, **OPTS)
    def failing():
        return dep()

    @baldur.protected(name, **OPTS)
    def slow():
        inside.set()
        assert done.wait(5)
        return "answer"

    outer = threading.Thread(target=slow)
    outer.start()
    assert inside.wait(5)
    with pytest.raises(Down):
        failing()
    done.set()
    outer.join()
    assert counts(baldur.get_breaker(name)) == (0, 1, 2, 1)


def test_cb19_a_call_in_another_task_is_its_own_call(clock):
    """CB-19, CB-9: the same with two asyncio tasks of one event loop."""
    name = "nest-tasks"
    dep = Dependency(False)

    @baldur.protected(name, **OPTS)
    async def failing():
        return dep()

    async def main():
        inside, done = asyncio.Event(), asyncio.Event()

        @baldur.protected(name, **OPTS)
        async def slow():
            inside.set()
            await done.wait()
            return "answer"

        outer = asyncio.create_task(slow())
        await inside.wait()
        with pytest.raises(Down):
            await asyncio.create_task(failing())
        done.set()
        assert await outer == "answer"

    asyncio.run(main())
    assert counts(baldur.get_breaker(name)) == (0, 1, 2, 1)


@pytest.mark.parametrize("outer_form", OUTERS)
def test_cb19_warm_nested_fallback_is_one_failure(outer_form, clock):
    """CB-19, FAC-4: on a window full of successes (the outer call admitted on the lock-free
    healthy lane, unmarked), a nested failure answered by the nested call's fallback is one
    failure of the breaker, and the fallback's value reaches the caller."""
    name = f"nest-warm-fb-{outer_form}"
    dep = Dependency(False)
    sync = outer_form in ("protect", "decorated-def")

    if sync:

        @baldur.protected(name, fallback=lambda: "fallback", **OPTS)
        def inner():
            return dep()

        outer = (
            (lambda: baldur.protect(name, lambda: inner(), **OPTS))
            if outer_form == "protect"
            else baldur.protected(name, **OPTS)(lambda: inner())
        )
    else:

        @baldur.protected(name, fallback=lambda: "fallback", **OPTS)
        async def ainner():
            return dep()

        async def body():
            return await ainner()

        aouter = (
            (lambda: baldur.aprotect(name, lambda: ainner(), **OPTS))
            if outer_form == "aprotect"
            else baldur.protected(name, **OPTS)(body)
        )

        def outer():
            return asyncio.run(aouter())

    breaker = baldur.get_breaker(name)
    warm_up(breaker, "warm")
    assert outer() == "fallback"
    assert dep.calls == 1
    assert counts(breaker) == (1, 1, 10, 1)
