"""CircuitBreakerMiddleware: classification, domains, denial, load shedding (IN-1, IN-2, IN-3, CFG-2)."""

from __future__ import annotations

import asyncio
import logging
import random
import string
from http import HTTPStatus

import pytest
from asgiref.sync import iscoroutinefunction
from django.http import HttpResponse, StreamingHttpResponse
from django.test import AsyncClient, Client, RequestFactory

import baldur_django as baldur
from baldur_django.core import inbound as inbound_module
from baldur_django.core.errors import CircuitOpenError
from baldur_django.core.marks import is_marked
from baldur_django.core.registry import registry
from baldur_django.middleware import (
    SHED_HEADER,
    CircuitBreakerMiddleware,
    RateLimitMiddleware,
    domain_for,
    record_response,
)

from . import views
from .conftest import CB, MAPPING, RL

OPEN = baldur.CircuitState.OPEN
HALF_OPEN = baldur.CircuitState.HALF_OPEN
CLOSED = baldur.CircuitState.CLOSED


def client() -> Client:
    return Client(raise_request_exception=False)


def aget(path: str, **extra):
    """One GET through Django's ASGI handler (AsyncClient), run to completion."""

    async def go():
        return await AsyncClient(raise_request_exception=False).get(path, **extra)

    return asyncio.run(go())


def counts(name: str) -> tuple[int, int, int]:
    """(window_calls, window_failures, consecutive_failures) of an existing breaker."""
    breaker = registry.get(name, create=False)
    assert breaker is not None, f"no breaker named {name!r}; have {registry.names()}"
    snap = breaker.snapshot()
    return snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]


def sync_get(path: str, **extra):
    return client().get(path, **extra)


GETTERS = {"sync": (sync_get, "/status/{}/"), "async": (aget, "/astatus/{}/")}


# ---------------------------------------------------------------- classification
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("code", [200, 201, 302, 404])
def test_in1_other_statuses_record_a_success(site, mode, code):
    """IN-1: a status on neither list is a success of the path's domain."""
    get, path = GETTERS[mode]
    assert get(path.format(500)).status_code == 500
    assert counts("default") == (1, 1, 1)
    assert get(path.format(code)).status_code == code
    assert counts("default") == (2, 1, 0)  # the success reset the consecutive count


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("code", [500, 502, 503, 504])
def test_in1_failure_statuses_record_a_failure(site, mode, code):
    """IN-1: BALDUR_MIDDLEWARE_CB_STATUS_CODES statuses are failures of the domain."""
    get, path = GETTERS[mode]
    assert get(path.format(code)).status_code == code
    assert counts("default") == (1, 1, 1)


def test_in1_failure_list_comes_from_the_setting(site):
    """IN-1, CFG-2: the failure list is the setting's, changed without a restart."""
    site(BALDUR_MIDDLEWARE_CB_STATUS_CODES=[418])
    sync_get("/status/500/")
    sync_get("/status/418/")
    assert counts("default") == (2, 1, 1)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("reraise", [False, True])
def test_in1_view_exception_is_one_500_counted_once(site, mode, reraise):
    """IN-1: a raising view reaches the middleware as Django's 500 and counts once."""
    path = "/boom/" if mode == "sync" else "/aboom/"
    if mode == "sync":
        if reraise:
            with pytest.raises(RuntimeError, match="the view broke"):
                Client().get(path)
        else:
            assert sync_get(path).status_code == 500
    else:
        if reraise:

            async def go():
                return await AsyncClient().get(path)

            with pytest.raises(RuntimeError, match="async view broke"):
                asyncio.run(go())
        else:
            assert aget(path).status_code == 500
    assert [path] == views.CALLS
    assert counts("default") == (1, 1, 1)


def test_in1_record_response_ignores_the_package_s_own_503():
    """IN-1: the load-shedding 503 is the package's own answer and never counts."""
    breaker = baldur.get_breaker("default")
    own = HttpResponse(status=503)
    own.headers[SHED_HEADER] = "open"
    request = RequestFactory().get("/x/")
    assert record_response(breaker, breaker.acquire(), request, own) == "ignored"
    assert record_response(breaker, breaker.acquire(), request, HttpResponse(status=503)) == "failure"
    assert breaker.snapshot()["window_calls"] == 1


class _Answer:
    """A response-like object: any ``status_code`` value, optional headers."""

    def __init__(self, status_code, headers=None):
        self.status_code = status_code
        self.headers = headers or {}


@pytest.mark.parametrize(
    "status,headers,expected",
    [
        (200, {}, "success"),
        (200, {"X-RateLimit-Mode": "enforce"}, "success"),  # own-answer headers matter on a 429 only
        (404, {}, "success"),
        (418, {}, "failure"),  # on the configured failure list
        (420, {}, "rate_limited"),  # on the configured rate-limit list
        (429, {}, "success"),  # taken off the rate-limit list: a 429 is then an ordinary status
        (429, {"X-RateLimit-Limit": "5"}, "ignored"),  # ... unless it is the app's own answer
        (503, {}, "success"),
        (503, {SHED_HEADER: "open"}, "ignored"),
        (HTTPStatus.IM_A_TEAPOT, {}, "failure"),  # an int subclass goes the general way
        (True, {}, "success"),  # not a status
        ("418", {}, "success"),  # not a status
        (None, {}, "success"),
    ],
)
def test_in1_record_response_outcomes_follow_the_lists(configure, status, headers, expected):
    """IN-1..IN-3, CFG-2: record_response's outcome for each status follows the two lists as
    configured now (its fast lane for plain successes included): failure list [418], rate-limit
    list [420]; the package's and the app's own answers are ignored."""
    configure(BALDUR_MIDDLEWARE_CB_STATUS_CODES=[418], BALDUR_MIDDLEWARE_RATE_LIMIT_CODES=[420])
    breaker = baldur.get_breaker("default")
    request = RequestFactory().get("/x/")
    assert record_response(breaker, breaker.acquire(), request, _Answer(status, headers)) == expected
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["window_failures"]) == {
        "success": (1, 0),
        "failure": (1, 1),
        "rate_limited": (1, 1),
        "ignored": (0, 0),
    }[expected]


# ------------------------------------------------------------------------ domains
def test_in1_longest_mapped_substring_names_the_breaker(site):
    """IN-1: the longest matching BALDUR_DOMAIN_MAPPING key wins; unmapped -> default."""
    sync_get("/payments/refunds/status/500/")
    sync_get("/payments/status/200/")
    sync_get("/status/503/")
    assert counts("refunds") == (1, 1, 1)
    assert counts("payments") == (1, 0, 0)
    assert counts("default") == (1, 1, 1)
    assert registry.names() == ["default", "payments", "refunds"]


def test_in1_ties_go_to_the_mapping_order(configure):
    """IN-1: among matching keys of equal length, the first listed wins."""
    configure(BALDUR_DOMAIN_MAPPING={"/x/": "first", "/y/": "second", "/x": "shorter"})
    assert domain_for("/x/y/z") == "first"
    configure(BALDUR_DOMAIN_MAPPING={"/y/": "second", "/x/": "first", "/x": "shorter"})
    assert domain_for("/x/y/z") == "second"
    assert domain_for("/xa") == "shorter"
    assert domain_for("/nothing") == "default"
    configure(BALDUR_DOMAIN_DEFAULT="everything-else")
    assert domain_for("/nothing") == "everything-else"


def test_cfg2_changed_mapping_takes_effect_at_once(site):
    """CFG-2, IN-1: a new BALDUR_DOMAIN_MAPPING applies to the next request."""
    sync_get("/status/500/")
    assert registry.names() == ["default"]
    site(BALDUR_DOMAIN_MAPPING={"/status/": "statuses"})
    sync_get("/status/500/")
    assert counts("statuses") == (1, 1, 1)
    assert counts("default") == (1, 1, 1)


def _random_path(rng: random.Random) -> str:
    alphabet = string.ascii_letters + string.digits + "-_.~%/"
    parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(rng.randint(1, 4))]
    path = "/" + "/".join(parts)
    if rng.random() < 0.3:  # some land on a mapped domain
        path = rng.choice(list(MAPPING)) + path.lstrip("/")
    return path + rng.choice(["", "/", "/\u00e9t\u00e9", "/%00"])


def test_in1_ten_thousand_random_paths_create_no_breaker(configure):
    """IN-1: 10,000 distinct random paths leave only the mapped breakers and the default one."""
    configure(BALDUR_DOMAIN_MAPPING=MAPPING)
    rng = random.Random(1234)
    paths: set[str] = set()
    while len(paths) < 10_000:
        paths.add(_random_path(rng))
    codes = iter(rng.choice([200, 404, 500, 503, 429]) for _ in range(len(paths)))
    middleware = CircuitBreakerMiddleware(lambda request: HttpResponse(status=next(codes)))
    factory = RequestFactory()
    for path in paths:
        middleware(factory.get(path))
    assert registry.names() == sorted({*MAPPING.values(), "default"})
    memo = inbound_module._table[3]
    assert 0 < len(memo) <= inbound_module.MEMO_SIZE  # the path memo stays bounded
    # the memo never changes an answer: check every path against a plain scan
    ordered = sorted(enumerate(MAPPING.items()), key=lambda item: (-len(item[1][0]), item[0]))
    for path in [*list(paths)[:2000], "/api/" + "x" * 500]:
        expected = next((domain for _, (key, domain) in ordered if key in path), "default")
        assert domain_for(path) == expected
        assert inbound_module.breaker_for(path).name == expected
        if path in memo:
            assert memo[path].name == expected


def test_in1_path_memo_follows_a_registry_clear_and_a_settings_change(configure):
    """IN-1, CFG-2: the path -> breaker memo never hands out a forgotten breaker: after
    registry.clear() the path gets the registry's new breaker, after a mapping change the
    newly mapped one."""
    configure(BALDUR_DOMAIN_MAPPING=MAPPING)
    first = inbound_module.breaker_for("/api/orders")
    assert first is inbound_module.breaker_for("/api/orders") is registry.get("api")
    registry.clear()
    second = inbound_module.breaker_for("/api/orders")
    assert second is not first and second is registry.get("api")
    configure(BALDUR_DOMAIN_MAPPING={"/api/": "api-v2"})
    assert inbound_module.breaker_for("/api/orders") is registry.get("api-v2")


def test_in1_random_paths_through_the_client_stay_on_default(site):
    """IN-1: unknown URLs (404s) through the full stack all file against the default breaker."""
    rng = random.Random(99)
    c = client()
    for _ in range(200):
        path = "/" + "".join(rng.choice(string.ascii_lowercase) for _ in range(16)) + "/"
        assert c.get(path).status_code == 404
    assert registry.names() == ["default"]
    assert counts("default") == (100, 0, 0)  # the window holds the last 100 outcomes


# ---------------------------------------------------------------------- denial
def test_in1_forced_open_domain_passes_requests_unrecorded(site):
    """IN-1: while the breaker denies admission the request runs and nothing is recorded."""
    sync_get("/payments/status/500/")
    baldur.force_open_circuit("payments", ttl_minutes=5)
    before = counts("payments")
    for code in (500, 200, 429):
        assert sync_get(f"/payments/status/{code}/").status_code == code
    assert aget("/arelay/").status_code == 429  # other domain, still counted
    assert views.CALLS[-4:-1] == ["/payments/status/500/", "/payments/status/200/", "/payments/status/429/"]
    assert counts("payments") == before
    assert counts("default") == (1, 1, 1)


def test_in1_half_open_with_trials_taken_passes_unrecorded(site, clock):
    """IN-1: HALF_OPEN with every trial slot taken lets the request pass, unrecorded."""
    for _ in range(5):
        sync_get("/status/500/")
    breaker = registry.get("default")
    assert breaker.state is OPEN
    clock.advance(60)
    assert breaker.state is HALF_OPEN
    trials = [breaker.acquire() for _ in range(3)]
    assert sync_get("/status/500/").status_code == 500  # would re-open the breaker if recorded
    assert breaker.state is HALF_OPEN
    for permit in trials:
        breaker.record_success(permit)
    assert breaker.state is CLOSED


def test_in1_half_open_trial_through_the_middleware_is_recorded(site, clock):
    """IN-1: a request admitted as a HALF_OPEN trial records its outcome (a 500 re-opens)."""
    for _ in range(5):
        sync_get("/status/503/")
    clock.advance(60)
    assert sync_get("/status/503/").status_code == 503
    assert registry.get("default").state is OPEN


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_in1_shed_load_answers_503_with_retry_after_uncounted(site, clock, mode):
    """IN-1: with BALDUR_MIDDLEWARE_SHED_LOAD an OPEN domain answers 503 + Retry-After, never counted."""
    site(BALDUR_MIDDLEWARE_SHED_LOAD=True)
    get, path = GETTERS[mode]
    for _ in range(5):
        get(path.format(500))
    breaker = registry.get("default")
    assert breaker.state is OPEN
    calls = len(views.CALLS)
    before = breaker.snapshot()
    clock.advance(17.5)  # 42.5 s of the 60 s recovery timeout left
    response = get(path.format(200))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "43"
    assert response.headers[SHED_HEADER] == "open"
    assert len(views.CALLS) == calls  # the view never ran
    after = breaker.snapshot()
    assert (after["window_calls"], after["consecutive_failures"], after["state"]) == (
        before["window_calls"],
        before["consecutive_failures"],
        "open",
    )
    # other domains are untouched
    assert sync_get("/payments/status/200/").status_code == 200


def test_in1_shed_load_retry_after_is_at_least_one_second(site, clock):
    """IN-1: Retry-After is whole seconds, at least 1 (also when the wait is unknown)."""
    site(BALDUR_MIDDLEWARE_SHED_LOAD=True)
    for _ in range(5):
        sync_get("/status/500/")
    clock.advance(59.9)
    assert sync_get("/status/200/").headers["Retry-After"] == "1"
    clock.advance(0.1)
    breaker = registry.get("default")
    trials = [breaker.acquire() for _ in range(3)]
    response = sync_get("/status/200/")
    assert (response.status_code, response.headers["Retry-After"], response.headers[SHED_HEADER]) == (
        503,
        "1",
        "half_open_full",
    )
    for permit in trials:
        breaker.record_success(permit)
    assert sync_get("/status/200/").status_code == 200


def test_in1_shed_load_for_a_forced_open_domain_uses_the_force_lifetime(site, clock):
    """IN-1: a forced-open domain sheds with Retry-After = time until the force lapses."""
    site(BALDUR_MIDDLEWARE_SHED_LOAD=True)
    baldur.force_open_circuit("payments", ttl_minutes=2)
    response = sync_get("/payments/status/200/")
    assert (response.status_code, response.headers["Retry-After"]) == (503, "120")
    assert views.CALLS == []


def test_in1_dry_run_never_sheds(site, clock):
    """IN-1, OP-5: in dry-run the middleware lets everything through and sheds nothing."""
    site(BALDUR_MIDDLEWARE_SHED_LOAD=True, BALDUR_DRY_RUN=True)
    for _ in range(5):
        sync_get("/status/500/")
    assert sync_get("/status/200/").status_code == 200


# -------------------------------------------------------------------- streaming
def test_in1_streaming_response_is_classified_by_status_and_never_read(site):
    """IN-1: a streaming response is recorded by its status; its body is not read or wrapped."""
    response = sync_get("/stream/503/")
    assert response.status_code == 503 and response.streaming
    assert views.STREAM["started"] is False
    assert counts("default") == (1, 1, 1)
    assert b"".join(response.streaming_content) == b"chunk one\nchunk two\n"
    assert views.STREAM["started"] is True  # the check above could have failed


def test_in1_streaming_response_object_is_passed_through_untouched():
    """IN-1: the middleware returns the very streaming response the view made."""
    made = []

    def body():
        made.append("read")
        yield b"x"

    def view(request):
        response = StreamingHttpResponse(body(), status=200)
        made.append(response)
        return response

    out = CircuitBreakerMiddleware(view)(RequestFactory().get("/s/"))
    assert out is made[0]
    assert made == [out]
    assert registry.get("default").snapshot()["window_calls"] == 1


# ----------------------------------------------------------------- async contract
def test_in1_middlewares_are_sync_and_async_capable():
    """IN-1: both middlewares declare both modes and become coroutine functions over async chains."""
    for cls in (CircuitBreakerMiddleware, RateLimitMiddleware):
        assert cls.sync_capable is True and cls.async_capable is True

        async def async_view(request):
            return HttpResponse()

        assert iscoroutinefunction(cls(async_view))
        assert not iscoroutinefunction(cls(lambda request: HttpResponse()))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_in1_django_never_adapts_the_chain_around_them(site, caplog, mode):
    """IN-1: Django logs no sync/async adaptation for either Baldur middleware."""
    site(DEBUG=True, MIDDLEWARE=[CB, RL], BALDUR_RATE_LIMIT_RULES=[{"path": "/status/", "rate": "100/m", "key": "ip"}])
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        get, path = GETTERS[mode]
        assert get(path.format(200)).status_code == 200
    adapted = [r.getMessage() for r in caplog.records if "adapted" in r.getMessage() and "middleware" in r.getMessage()]
    assert adapted == []
    assert counts("default") == (1, 0, 0)


# ------------------------------------------------------------------------ IN-2
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_in2_five_relayed_429s_trip_the_domain_breaker(site, mode, events):
    """IN-2: five relayed 429s in a row open the domain's breaker with default settings."""
    get = sync_get if mode == "sync" else aget
    path = "/relay/" if mode == "sync" else "/arelay/"
    for _i in range(4):
        assert get(path).status_code == 429
    breaker = registry.get("default")
    assert breaker.state is CLOSED
    assert counts("default") == (4, 4, 4)
    get(path)
    assert breaker.state is OPEN
    assert events.transitions() == [("closed", "open", "consecutive_failures")]
    calls = len(views.CALLS)
    assert get(path).status_code == 429  # still passes (no shedding), unrecorded
    assert len(views.CALLS) == calls + 1


def test_in2_relayed_429_starts_the_cooldown_from_retry_after(site, clock):
    """IN-2, RL-2: a relayed 429 starts the domain's cooldown from its Retry-After."""
    sync_get("/relay/?retry_after=30")
    breaker = registry.get("default")
    assert breaker.snapshot()["cooldown_remaining"] == pytest.approx(30.0)
    assert counts("default") == (1, 1, 1)


def test_in2_relayed_429s_feed_the_cascade(site, events):
    """IN-2, RL-3: relayed 429s are cascade sightings (a low cascade threshold opens the breaker)."""
    site(
        BALDUR_CB_FAILURE_THRESHOLD=100,
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=3,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=3,
    )
    for _ in range(2):
        sync_get("/relay/")
    assert registry.get("default").state is CLOSED
    sync_get("/relay/")
    assert registry.get("default").state is OPEN
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]


def test_in2_a_429_on_both_lists_is_one_rate_limited_failure(site, events):
    """IN-2, RL-8: a status on both lists records one failure that also feeds the cascade."""
    site(
        BALDUR_MIDDLEWARE_CB_STATUS_CODES=[500, 429],
        BALDUR_CB_RATE_LIMIT_CASCADE_THRESHOLD=2,
        BALDUR_CB_RATE_LIMIT_CASCADE_MIN_CALLS=2,
    )
    sync_get("/relay/")
    assert counts("default") == (1, 1, 1)
    sync_get("/relay/")
    assert events.transitions() == [("closed", "open", "rate_limit_cascade")]


# ------------------------------------------------------------------------ IN-3
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("flag", ["mode", "limit", "mark"])
def test_in3_app_s_own_429s_never_count(site, mode, flag):
    """IN-3: a 429 with X-RateLimit-Mode / X-RateLimit-Limit, or from a marked request, is not counted."""
    get = sync_get if mode == "sync" else aget
    path = ("/relay/" if mode == "sync" else "/arelay/") + f"?{flag}=1"
    for _ in range(6):
        assert get(path).status_code == 429
    assert counts("default") == (0, 0, 0)
    assert registry.get("default").state is CLOSED
    get(path.split("?")[0])  # the same view without the mark counts
    assert counts("default") == (1, 1, 1)


def test_in3_mark_reaches_the_http_request_through_a_drf_request():
    """IN-3: mark_rate_limited on a DRF Request marks the HttpRequest middleware sees."""
    from rest_framework.request import Request

    http = RequestFactory().get("/x/")
    assert not is_marked(http)
    baldur.mark_rate_limited(Request(http))
    assert is_marked(http)


def test_in3_limiter_429s_are_not_counted_but_relayed_ones_are(site):
    """IN-3, IN-4: the own limiter's 429s do not count; an upstream 429 behind it does."""
    site(BALDUR_RATE_LIMIT_RULES=[{"path": "/limited/", "rate": "2/m", "key": "ip"}])
    c = client()
    assert c.get("/limited/relay/").status_code == 429  # admitted, relayed from upstream: counts
    assert c.get("/limited/status/200/").status_code == 200
    for _ in range(6):
        refused = c.get("/limited/status/500/")
        assert refused.status_code == 429
        assert refused.headers["X-RateLimit-Mode"] == "enforce"
    assert views.CALLS == ["/limited/relay/", "/limited/status/200/"]
    assert counts("default") == (2, 1, 0)
    assert registry.get("default").state is CLOSED


def test_in1_request_creates_breaker_only_from_settings(site):
    """IN-1: even the error path never registers a breaker named after the URL."""
    with pytest.raises(CircuitOpenError):
        baldur.force_open_circuit("payments")
        registry.get("payments").acquire()
    sync_get("/payments/zzz/")  # 404 under a mapped prefix
    assert registry.names() == ["payments"]
