"""Smoke test of the inbound-side benchmark (``./dev bench --inbound``): a tiny run, structure only.

No timing is asserted (figures depend on the machine; speed goals live in ``benchmarks/``).
What is checked: every contender runs and is reported, the limiters admit every request,
the round trips per request are what each library's design makes them, and the run leaves
no key behind.
"""

from __future__ import annotations

import json
import math

import pytest
import redis

from tests.conftest import need_server
from tests.stores.conftest import reachable

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

URL = "redis://127.0.0.1:6379/14"


def test_inbound_benchmark_smoke():
    """IN-1, IN-4 (benchmark plumbing): the middlewares (sync and async) and the three rate
    limiters are measured; RateLimitMiddleware makes one round trip per admitted request (one
    EVALSHA), django-ratelimit two (SET NX, EVAL), DRF's throttle two (GET, SET); the report
    prints its four goal lines (two of them issue 21's middleware cost, sync and async); the
    JSON is plain data; no key of the run is left on the server."""
    need_server("Redis at 127.0.0.1:6379", reachable("127.0.0.1", 6379))
    pytest.importorskip("django_ratelimit")
    from benchmarks.inbound import (
        BALDUR_LIMITER,
        DJANGO_RATELIMIT,
        DRF_THROTTLE,
        LIMITERS,
        MIDDLEWARES,
        InboundSettings,
        bench_inbound,
        evaluate_inbound,
        format_inbound,
        to_json,
    )

    tiny = InboundSettings(
        rounds=2,
        requests=50,
        async_rounds=2,
        async_requests=20,
        limiter_rounds=2,
        limiter_requests=20,
        count_requests=30,
        warmup=20,
        redis_url=URL,
    )
    result = bench_inbound(tiny)
    for name in MIDDLEWARES:
        assert len(result.sync[name].per_call) == 2 and len(result.async_[name].per_call) == 2
        assert math.isfinite(result.sync[name].overhead) and math.isfinite(result.async_[name].overhead)
    for name in LIMITERS:
        assert len(result.limiters[name].per_call) == 2
        assert result.requests_per_second(name) > 0
    assert result.counts[BALDUR_LIMITER].client_names == {"evalsha": 30}
    assert result.counts[BALDUR_LIMITER].round_trips_per_request == 1.0
    assert result.counts[DJANGO_RATELIMIT].client_names == {"set": 30, "eval": 30}
    assert result.counts[DJANGO_RATELIMIT].round_trips_per_request == 2.0
    assert result.counts[DRF_THROTTLE].client_names == {"get": 30, "set": 30}
    assert result.counts[BALDUR_LIMITER].server.get("evalsha", 0) >= 30  # server-wide: at least ours
    verdicts = evaluate_inbound(result)
    assert len(verdicts) == 4 and verdicts[3].status == "PASS"
    assert "sync CircuitBreakerMiddleware/SecurityMiddleware <= 0.5" in verdicts[0].text
    assert "async CircuitBreakerMiddleware/SecurityMiddleware's work <= 0.5" in verdicts[1].text
    text = format_inbound(result)
    assert text.count("PASS") + text.count("MISS") + text.count("N/A") >= 4
    data = json.loads(json.dumps(to_json(result)))
    assert data["limiters"][BALDUR_LIMITER]["round_trips_per_request"] == 1.0
    admin = redis.Redis.from_url(URL)
    try:
        assert list(admin.scan_iter(f"{result.prefix}:*")) == []
    finally:
        admin.close()
