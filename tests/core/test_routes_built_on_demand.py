"""A ``protect``/``aprotect`` route builds its full wrappers only when a call needs them, and
only the plain path of its own call style: most of a healthy service's route is never built
(``./dev bench --scale``'s memory per breaker). The wrappers it builds are the same for every
route of the breaker and policy, and a later route reuses them."""

from __future__ import annotations

import asyncio

import pytest

import baldur_django as baldur
from baldur_django.core import routes


def ok() -> str:
    return "ok"


async def aok() -> str:
    return "ok"


def test_a_protect_route_builds_no_fallback_wrapper_and_no_async_path_until_needed():
    assert baldur.protect("lazy.sync", ok) == "ok"
    route = routes.routes["lazy.sync"]
    assert route.built_fallback is None  # no call gave a fallback
    assert route.afast is routes._AFULL_WAY  # a protect() route never serves aprotect()
    assert route.fast is not routes._full_way

    assert baldur.protect("lazy.sync", ok, fallback=lambda: "fb") == "ok"
    built = routes.routes["lazy.sync"].built_fallback
    assert built is not None
    assert routes.routes["lazy.sync"].run_fallback is built  # the method stand-in was replaced


def test_the_first_call_builds_the_wrapper_it_runs_and_a_later_route_reuses_it():
    baldur.protect("lazy.reuse", ok)
    first = routes.routes["lazy.reuse"]
    assert first.built_run is not None  # a new breaker's window is not full: the full way ran
    baldur.protect("lazy.reuse", ok, fallback=lambda: "fb")
    fallback_wrapper = routes.routes["lazy.reuse"].built_fallback

    policy = baldur.RetryPolicy(max_attempts=2, backoff_initial=0.0)
    baldur.protect("lazy.reuse", ok, retry=policy)  # another policy: a route of its own
    assert routes.routes["lazy.reuse"].built_run is not first.built_run

    baldur.protect("lazy.reuse", ok)  # back to no policy: a new route, the old one's wrappers built anew
    again = routes.routes["lazy.reuse"]
    assert again.built_run is not None and again.built_fallback is None
    assert fallback_wrapper is not None


def test_routes_of_the_same_breaker_and_policy_share_their_wrappers():
    retry = baldur.RetryPolicy(max_attempts=2, backoff_initial=0.0)
    baldur.protect("lazy.share", ok, retry=retry)
    built = routes.routes["lazy.share"].built_run
    other = baldur.RetryPolicy(max_attempts=2, backoff_initial=0.0)  # equal, not the same object
    baldur.protect("lazy.share", ok, retry=other)
    assert routes.routes["lazy.share"].retry is other
    assert routes.routes["lazy.share"].built_run is built


def test_an_aprotect_route_builds_only_its_async_path():
    assert asyncio.run(baldur.aprotect("lazy.async", aok)) == "ok"
    route = routes.aroutes["lazy.async"]
    assert route.fast is routes._full_way  # an aprotect() route never serves protect()
    assert route.afast is not routes._AFULL_WAY
    assert route.built_fallback is None


@pytest.mark.parametrize("with_fallback", [False, True])
def test_two_threads_that_both_build_first_both_run_the_call(with_fallback):
    """Two first calls may both build a wrapper; each call still runs once and is recorded once."""
    route = routes.protect_route("lazy.twice", ok, False, None, {})
    calls = []

    def call() -> str:
        calls.append(1)
        return "ok"

    run = route._first_run_fallback if with_fallback else route._first_run
    args = (call, lambda: "fb") if with_fallback else (call,)
    assert run(*args) == "ok"
    route.built_run = route.built_fallback = None  # as a second thread that came first too sees it
    assert run(*args) == "ok"
    assert len(calls) == 2
    assert baldur.get_breaker("lazy.twice").metrics()["calls"]["success"] == 2


def test_inline_is_what_a_quiet_route_runs_first():
    """A route made for a breaker whose window is full of successes runs its first call on the
    plain path: no full wrapper is built."""
    for _ in range(120):
        baldur.protect("lazy.quiet", ok)
    routes.routes.pop("lazy.quiet")
    assert baldur.protect("lazy.quiet", ok) == "ok"
    route = routes.routes["lazy.quiet"]
    assert route.built_run is None and route.built_fallback is None
