"""RS-2, RS-8: RequestDeadlineMiddleware and the validation of the outbound stages' knobs."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.core.checks import ERROR, WARNING
from django.test import RequestFactory, override_settings

import baldur_django as baldur
from baldur_django.contrib.httpx import BreakerTransport
from baldur_django.contrib.requests import BreakerAdapter
from baldur_django.core.errors import ConfigError
from baldur_django.core.stages.deadline import time_left
from baldur_django.core.testing import FakeClock
from baldur_django.middleware import RequestDeadlineMiddleware
from baldur_django.stage_checks import StageCodes, check_stages


@pytest.fixture
def fake():
    return FakeClock()


def seen_left(settings, fake, **headers):
    """The time left a view sees behind the middleware."""
    seen: list[float | None] = []

    def view(request):
        seen.append(time_left())
        return "response"

    assert RequestDeadlineMiddleware(view, clock=fake)(RequestFactory().get("/", headers=headers)) == "response"
    return seen[0]


# ------------------------------------------------------------------ the middleware
def test_rs2_request_deadline_from_the_setting(settings, fake):
    """RS-2: BALDUR_REQUEST_DEADLINE_SECONDS gives each request that deadline; unset: none."""
    assert seen_left(settings, fake) is None
    settings.BALDUR_REQUEST_DEADLINE_SECONDS = 5
    assert seen_left(settings, fake) == pytest.approx(5)
    assert time_left() is None  # it ends with the request


def test_rs2_request_deadline_from_the_header_capped_by_the_setting(settings, fake):
    """RS-2: the header named by BALDUR_REQUEST_DEADLINE_HEADER gives the seconds; the seconds
    setting caps it when both are set."""
    settings.BALDUR_REQUEST_DEADLINE_HEADER = "X-Request-Deadline"
    assert seen_left(settings, fake, **{"X-Request-Deadline": "2.5"}) == pytest.approx(2.5)
    assert seen_left(settings, fake) is None
    settings.BALDUR_REQUEST_DEADLINE_SECONDS = 4
    assert seen_left(settings, fake, **{"X-Request-Deadline": "9"}) == pytest.approx(4)
    assert seen_left(settings, fake, **{"X-Request-Deadline": "1"}) == pytest.approx(1)


def test_rs2_bad_header_value_is_ignored_and_logged_once(settings, fake, caplog):
    """RS-2: a header value that is not a positive number is ignored (the setting applies) and
    logged once."""
    settings.BALDUR_REQUEST_DEADLINE_HEADER = "X-Request-Deadline"
    settings.BALDUR_REQUEST_DEADLINE_SECONDS = 3
    RequestDeadlineMiddleware._warned.clear()
    with caplog.at_level(logging.WARNING, logger="baldur.circuit_breaker"):
        for bad in ("soon", "-1", "0", "nan", "inf"):
            assert seen_left(settings, fake, **{"X-Request-Deadline": bad}) == pytest.approx(3)
    lines = [r for r in caplog.records if getattr(r, "event", "") == "circuit_breaker.deadline_header_ignored"]
    assert len(lines) == 1 and "soon" in lines[0].getMessage()


def test_rs2_request_deadline_middleware_is_async_capable(settings, fake):
    """RS-2: in an async chain the middleware awaits the next handler under the deadline."""
    settings.BALDUR_REQUEST_DEADLINE_SECONDS = 6
    seen: list[float | None] = []

    async def view(request):
        seen.append(time_left())
        return "async response"

    middleware = RequestDeadlineMiddleware(view, clock=fake)
    assert asyncio.iscoroutinefunction(middleware.__acall__)
    assert asyncio.run(middleware(RequestFactory().get("/"))) == "async response"
    assert seen == [pytest.approx(6)]


def test_rs2_protected_call_in_a_request_is_refused_after_the_request_deadline(settings, clock):
    """RS-1, RS-2: a protected call made after the request's deadline passed is refused and
    answered by its fallback; the dependency is not called."""
    settings.BALDUR_REQUEST_DEADLINE_SECONDS = 2
    ran: list[int] = []

    @baldur.protected("pay", fallback=lambda: "later")
    def pay() -> str:
        ran.append(1)
        return "paid"

    def view(request):
        first = pay()
        clock.advance(3)
        return first, pay()

    assert RequestDeadlineMiddleware(view, clock=clock)(RequestFactory().get("/")) == ("paid", "later")
    assert ran == [1]


# ------------------------------------------------------------------ knob validation (RS-8)
STAGE_BAD = [
    ("deadline", 0),
    ("deadline", "5"),
    ("honor_retry_after", "yes"),
    ("max_concurrent_calls", 0),
    ("max_concurrent_calls", 2.5),
    ("max_wait", -1),
    ("bulkhead_scope", "cluster"),
    ("retry_budget_ratio", -0.5),
    ("retry_budget_min_per_second", True),
    ("retry_budget_scope", "everywhere"),
    ("adaptive_throttling_k", 0.5),
    ("adaptive_throttling_window", 0),
]


@pytest.mark.parametrize("key, value", STAGE_BAD, ids=[f"{k}={v!r}" for k, v in STAGE_BAD])
def test_rs8_every_stage_knob_is_validated_where_it_is_given(key, value):
    """RS-8: a bad stage knob is a ConfigError naming it and the value, at the decorator,
    protect(), the adapters and a BALDUR_SERVICES entry."""
    shown = repr(value)
    with pytest.raises(ConfigError, match=key) as raised:
        baldur.protected("svc", **{key: value})
    assert shown in str(raised.value)
    with pytest.raises(ConfigError, match=key):
        baldur.protect("svc", lambda: 1, **{key: value})
    with pytest.raises(ConfigError, match=key):
        baldur.circuit_breaker("svc", **{key: value})
    with pytest.raises(ConfigError, match=key):
        BreakerAdapter(**{key: value})
    with pytest.raises(ConfigError, match=key):
        BreakerTransport(**{key: value})
    with override_settings(BALDUR_SERVICES={"svc": {key: value}}):
        messages = [m for m in baldur_checks() if m.level == ERROR]
    assert [m.id for m in messages] == ["baldur.E022"] and key in messages[0].msg


def baldur_checks():
    from baldur_django.checks import check_settings

    return [m for m in check_settings() + check_stages() if m.id.startswith("baldur.")]


def test_rs8_good_stage_knobs_are_accepted_everywhere():
    """RS-8: good values pass at every place a knob is given."""
    good = {
        "deadline": 2.5,
        "honor_retry_after": True,
        "max_concurrent_calls": 8,
        "max_wait": 0.5,
        "bulkhead_scope": "worker",
        "retry_budget_ratio": 0.2,
        "retry_budget_min_per_second": 5,
        "retry_budget_scope": "worker",
        "adaptive_throttling_k": 2.0,
        "adaptive_throttling_window": 60,
    }
    baldur.protected("svc", **good)(lambda: 1)
    assert baldur.protect("svc", lambda: 1, **good) == 1
    BreakerAdapter(**good)
    config = baldur.get_breaker("svc").config
    assert (config.deadline, config.max_concurrent_calls, config.retry_budget_ratio) == (2.5, 8, 0.2)


@pytest.mark.parametrize(
    "setting, key, code",
    [
        ("BALDUR_BULKHEAD_SCOPE", "bulkhead_scope", StageCodes.BULKHEAD_FLEET_WITHOUT_REDIS),
        ("BALDUR_RETRY_BUDGET_SCOPE", "retry_budget_scope", StageCodes.RETRY_BUDGET_FLEET_WITHOUT_REDIS),
    ],
)
def test_rs8_fleet_scope_without_redis_is_a_check_error(setting, key, code):
    """RS-8: a fleet scope (global or per service) without the Redis state backend is an error
    with its own id; with Redis it is not."""
    with override_settings(**{setting: "fleet"}):
        assert [(m.level, m.id) for m in check_stages() if m.level == ERROR] == [(ERROR, code)]
    with override_settings(BALDUR_SERVICES={"pay": {key: "fleet"}}):
        errors = [m for m in check_stages() if m.level == ERROR]
    assert [m.id for m in errors] == [code] and "'pay'" in errors[0].msg
    with override_settings(
        **{setting: "fleet"}, BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_URL="redis://127.0.0.1:6379/15"
    ):
        assert [m for m in check_stages() if m.level == ERROR] == []
    assert code in {"baldur.E112", "baldur.E113"}


def test_rs8_reserved_stage_key_in_baldur_services_warns():
    """RS-8: a BALDUR_SERVICES key of a stage not built yet is validated and warns that it has
    no effect (W006)."""
    from baldur_django.core.knobs import RESERVED

    reserved_keys = {"max_concurrent_calls"} if "BALDUR_BULKHEAD_MAX_CONCURRENT_CALLS" in RESERVED else set()
    with override_settings(BALDUR_SERVICES={"pay": {"max_concurrent_calls": 4, "deadline": 3}}):
        warnings = [m for m in check_stages() if m.level == WARNING]
    assert {m.msg.split("]")[1].strip("[]'") for m in warnings} == reserved_keys
