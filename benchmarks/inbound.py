"""Inbound-side benchmark: what the two Django middlewares cost per request.

``python -m benchmarks --inbound [--quick]`` (or ``python -m benchmarks.inbound``) measures,
in one process:

1. ``CircuitBreakerMiddleware`` per request, sync and async, next to a pass-through
   middleware (the least any middleware costs) and Django's own ``SecurityMiddleware``,
   each wrapping a view that returns a ready-made 200. Figures: median ns per request over
   calling the view directly, interleaved rounds paired with that bare call
   (``benchmarks.harness``). Under ASGI Django runs ``SecurityMiddleware`` (a
   ``MiddlewareMixin``) through ``sync_to_async`` twice per request; the pass-through and
   the Baldur middleware are natively async.
2. ``RateLimitMiddleware`` on a real Redis through django-redis next to django-ratelimit's
   ``@ratelimit`` decorator and DRF's ``UserRateThrottle``, all three counting in the same
   django-redis cache (``redis://127.0.0.1:6379/12`` unless ``--redis-url`` says otherwise),
   keyed by the same authenticated user, every request admitted:

   * RateLimitMiddleware: rule ``{"path": "/api/", "rate": "<huge>/h", "key": "user"}``;
   * django-ratelimit: ``@ratelimit(key="user", rate="<huge>/h", block=True)``;
   * DRF: ``UserRateThrottle`` with ``rate = "60/min"`` and a clock that advances one second
     per request: DRF keeps a log of every request in the window and re-writes it on each
     request, so its cost grows with the requests in the window; this is a client using its
     full allowance of 60 a minute (59 timestamps in the log, every request admitted). The
     other two keep one counter, whatever the count.

   Figures: requests/s (one thread, sequential requests) and ns over the bare view; round
   trips and commands per request counted on the client's own connections (a counting
   connection class in django-redis's pool) and ``INFO commandstats`` (server-wide, the
   commands run inside Lua scripts included).

Goals (printed PASS/MISS): sync ``CircuitBreakerMiddleware`` at most 0.5x
``SecurityMiddleware`` and async ``CircuitBreakerMiddleware`` at most 0.5x
``SecurityMiddleware``'s own work, timed in the same async rounds; async ``CircuitBreakerMiddleware`` within the sync ratio
to ``SecurityMiddleware``; one round trip per admitted request for ``RateLimitMiddleware``.
Results and method: ``docs/performance.md``, section "Inbound side".
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

from .cli import run_redis_bench
from .harness import Sample, ainterleave, aloop_calls, interleave, loop_calls
from .stores import CommandCounter, commandstats, counting_client

__all__ = [
    "InboundSettings",
    "INBOUND_DEFAULT",
    "INBOUND_QUICK",
    "InboundResult",
    "LimiterCount",
    "bench_inbound",
    "evaluate_inbound",
    "format_inbound",
    "to_json",
    "main",
]

BARE = "bare view"
PASS_THROUGH = "pass-through middleware"
SECURITY = "SecurityMiddleware"
CIRCUIT = "CircuitBreakerMiddleware"
MIDDLEWARES = (PASS_THROUGH, SECURITY, CIRCUIT)
#: Async rounds only: the sync SecurityMiddleware called inside an ``async def`` view-like
#: coroutine, so its own work (no thread hop) is timed in the same rounds as the async chain.
SECURITY_WORK = "SecurityMiddleware's work, awaited inline"

BALDUR_LIMITER = "baldur RateLimitMiddleware"
DJANGO_RATELIMIT = "django-ratelimit @ratelimit"
DRF_THROTTLE = "DRF UserRateThrottle"
LIMITERS = (BALDUR_LIMITER, DJANGO_RATELIMIT, DRF_THROTTLE)

DEFAULT_URL = "redis://127.0.0.1:6379/12"
ALIAS = "baldur-bench-limits"
HUGE_RATE = "1000000000/h"  # never reached: every request is admitted
DRF_RATE = "60/min"


@dataclass(frozen=True)
class InboundSettings:
    """How much to measure.

    Attributes:
        rounds: interleaved rounds of the sync middleware timing.
        requests: requests per contender per round, sync middlewares.
        async_rounds: rounds of the async middleware timing.
        async_requests: requests per contender per round, async (``SecurityMiddleware``
            hops threads twice per request: keep this modest).
        limiter_rounds: rounds of the rate-limiter timing.
        limiter_requests: requests per limiter per round (each makes Redis round trips).
        count_requests: requests per limiter for the command count.
        warmup: requests through every contender before measuring.
        redis_url: the server and database every limiter counts in.
        seed: seeds the per-round shuffle.
    """

    rounds: int = 41
    requests: int = 20_000
    async_rounds: int = 21
    async_requests: int = 2_000
    limiter_rounds: int = 21
    limiter_requests: int = 1_000
    count_requests: int = 2_000
    warmup: int = 500
    redis_url: str = DEFAULT_URL
    seed: int = 1


INBOUND_DEFAULT = InboundSettings()
INBOUND_QUICK = InboundSettings(
    rounds=9,
    requests=5_000,
    async_rounds=7,
    async_requests=500,
    limiter_rounds=7,
    limiter_requests=300,
    count_requests=500,
    warmup=200,
)


@dataclass
class LimiterCount:
    """What *requests* admitted requests of one limiter cost on Redis."""

    requests: int
    client_commands: int
    client_round_trips: int
    client_names: dict[str, int]
    server: dict[str, int]

    @property
    def round_trips_per_request(self) -> float:
        return self.client_round_trips / self.requests

    @property
    def commands_per_request(self) -> float:
        return self.client_commands / self.requests

    @property
    def server_per_request(self) -> float:
        return sum(self.server.values()) / self.requests


@dataclass
class InboundResult:
    """Everything :func:`bench_inbound` measured."""

    settings: InboundSettings
    bare_sync: float
    bare_async: float
    bare_limiter: float
    sync: dict[str, Sample]
    async_: dict[str, Sample]
    limiters: dict[str, Sample]
    counts: dict[str, LimiterCount]
    redis_version: str
    versions: dict[str, str]
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)
    prefix: str = ""

    def requests_per_second(self, name: str) -> float:
        return 1e9 / self.limiters[name].median


# ---------------------------------------------------------------------- Django
@contextlib.contextmanager
def _django(cache_location: str, prefix: str, connection_class: Any) -> Iterator[None]:
    """Django configured for the benchmark: settings.configure() in a plain process, or an
    override of the settings already in place (the smoke test runs under pytest-django)."""
    import django
    from django.conf import settings
    from django.test.utils import override_settings

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="benchmark-only",
            ALLOWED_HOSTS=["*"],
            USE_TZ=True,
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
            DATABASES={},
            LOGGING_CONFIG=None,
        )
        django.setup()
    caches = {
        **getattr(settings, "CACHES", {}),
        ALIAS: {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": cache_location,
            "KEY_PREFIX": prefix,
            "OPTIONS": {
                "SOCKET_TIMEOUT": 5,
                "SOCKET_CONNECT_TIMEOUT": 5,
                "CONNECTION_POOL_KWARGS": {"connection_class": connection_class},
            },
        },
    }
    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE=ALIAS, RATELIMIT_ENABLE=True, SECURE_SSL_REDIRECT=False):
        yield


# ------------------------------------------------------------- middlewares (1)
class PassThrough:
    """The least a middleware can do: hand the request on (sync- and async-capable)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction

        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)


class AsyncPassThrough(PassThrough):
    async def __call__(self, request: Any) -> Any:  # type: ignore[override]
        return await self.get_response(request)


def _middleware_chains(settings: InboundSettings) -> tuple[dict[str, Sample], float, dict[str, Sample], float]:
    from django.http import HttpResponse
    from django.middleware.security import SecurityMiddleware
    from django.test import RequestFactory

    from baldur_django.middleware import CircuitBreakerMiddleware

    request = RequestFactory().get("/shop/orders/")
    response = HttpResponse("ok")

    def view(request: Any) -> Any:
        return response

    async def aview(request: Any) -> Any:
        return response

    sync = {
        PASS_THROUGH: PassThrough(view),
        SECURITY: SecurityMiddleware(view),
        CIRCUIT: CircuitBreakerMiddleware(view),
    }
    for func in sync.values():
        for _ in range(settings.warmup):
            assert func(request).status_code == 200
    runners: dict[str, Callable[[int], int]] = {BARE: lambda n: loop_calls(lambda: view(request), n)}
    for name, func in sync.items():
        runners[name] = lambda n, f=func: loop_calls(lambda: f(request), n)
    sync_samples = interleave(runners, baseline=BARE, rounds=settings.rounds, n=settings.requests, seed=settings.seed)
    bare_sync = sync_samples.pop(BARE).median

    asynchronous = {
        PASS_THROUGH: AsyncPassThrough(aview),
        SECURITY: SecurityMiddleware(aview),
        CIRCUIT: CircuitBreakerMiddleware(aview),
    }

    security_sync = sync[SECURITY]

    async def security_work(request: Any) -> Any:
        return security_sync(request)

    asynchronous[SECURITY_WORK] = security_work

    async def run() -> dict[str, Sample]:
        for func in asynchronous.values():
            for _ in range(settings.warmup):
                assert (await func(request)).status_code == 200
        aruns: dict[str, Any] = {BARE: lambda n: aloop_calls(lambda: aview(request), n)}
        for name, func in asynchronous.items():
            aruns[name] = lambda n, f=func: aloop_calls(lambda: f(request), n)
        return await ainterleave(
            aruns, baseline=BARE, rounds=settings.async_rounds, n=settings.async_requests, seed=settings.seed
        )

    async_samples = asyncio.run(run())
    bare_async = async_samples.pop(BARE).median
    return sync_samples, bare_sync, async_samples, bare_async


# --------------------------------------------------------------- limiters (2)
class _Clock:
    """DRF's throttle clock: one second further on each reading (one request a second)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _limiters(path: str) -> tuple[dict[str, Callable[[Any], Any]], Callable[[Any], Any]]:
    from django.core.cache import caches
    from django.http import HttpResponse
    from django_ratelimit.decorators import ratelimit
    from rest_framework.exceptions import Throttled
    from rest_framework.throttling import UserRateThrottle

    from baldur_django.limiter import RateLimiter
    from baldur_django.middleware import RateLimitMiddleware

    response = HttpResponse("ok")

    def view(request: Any) -> Any:
        return response

    limiter = RateLimiter(cache_alias=ALIAS, rules=[{"path": path, "rate": HUGE_RATE, "key": "user"}])
    baldur_mw = RateLimitMiddleware(view, limiter=limiter)
    limited_view = ratelimit(key="user", rate=HUGE_RATE, block=True)(view)

    class BenchThrottle(UserRateThrottle):
        rate = DRF_RATE
        cache = caches[ALIAS]
        timer = staticmethod(_Clock())

    def drf(request: Any) -> Any:
        # what APIView.check_throttles does for each request: a new throttle instance, then allow_request
        throttle = BenchThrottle()
        if not throttle.allow_request(request, None):
            raise Throttled(throttle.wait())
        return view(request)

    return {BALDUR_LIMITER: baldur_mw, DJANGO_RATELIMIT: limited_view, DRF_THROTTLE: drf}, view


def _count(
    admin: Any, counter: CommandCounter, func: Callable[[Any], Any], request: Any, requests: int
) -> LimiterCount:
    counter.names.clear()
    commands0, trips0 = counter.snapshot()
    before = commandstats(admin)
    for _ in range(requests):
        if func(request).status_code != 200:
            raise RuntimeError(f"{func!r} refused a request during the count")
    after = commandstats(admin)
    commands, trips = counter.snapshot()
    server = {}
    for name, calls in after.items():
        grown = calls - before.get(name, 0) - (1 if name == "info" else 0)
        if grown > 0:
            server[name] = grown
    return LimiterCount(requests, commands - commands0, trips - trips0, dict(counter.names), server)


def bench_inbound(
    settings: InboundSettings = INBOUND_DEFAULT, progress: Callable[[str], None] | None = None
) -> InboundResult:
    """Run every measurement of this module; see the module docstring.

    Args:
        settings: how much to measure, and which Redis.
        progress: called with a short text before each phase.

    Returns:
        InboundResult: every figure.

    Raises:
        redis.ConnectionError: the server at ``settings.redis_url`` does not answer.
        RuntimeError: a contender refused a request it should have admitted.
    """
    from importlib import metadata

    import redis

    started = time.monotonic()
    say = progress or (lambda text: None)
    run = uuid.uuid4().hex[:8]
    prefix = f"bench-inbound-{run}"
    admin = redis.Redis.from_url(settings.redis_url, socket_timeout=5.0)
    admin.ping()
    counter = CommandCounter()
    # a counting connection class for django-redis's pool; the client name makes the URL (the
    # key of django-redis's process-wide pools) this run's own, so the pool is built with it
    connection_class = counting_client(settings.redis_url, counter).connection_pool.connection_class
    separator = "&" if "?" in settings.redis_url else "?"
    location = f"{settings.redis_url}{separator}client_name={prefix}"
    try:
        with _django(location, prefix, connection_class):
            say("middlewares, sync and async")
            sync, bare_sync, async_, bare_async = _middleware_chains(settings)

            from django.test import RequestFactory
            from django_redis import get_redis_connection

            path = "/api/orders/"
            request = RequestFactory().get(path, REMOTE_ADDR="203.0.113.9")
            request.user = SimpleNamespace(is_authenticated=True, pk=42)
            funcs, view = _limiters(path)
            get_redis_connection(ALIAS).ping()  # connect first: the handshake is not limiter traffic
            say("rate limiters on Redis")
            for name, func in funcs.items():
                for _ in range(settings.warmup):
                    if func(request).status_code != 200:
                        raise RuntimeError(f"{name} refused a request during the warm-up")
            runners: dict[str, Callable[[int], int]] = {BARE: lambda n: loop_calls(lambda: view(request), n)}
            for name, func in funcs.items():
                runners[name] = lambda n, f=func: loop_calls(lambda: f(request), n)
            limiters = interleave(
                runners, baseline=BARE, rounds=settings.limiter_rounds, n=settings.limiter_requests, seed=settings.seed
            )
            bare_limiter = limiters.pop(BARE).median
            say(f"round trips over {settings.count_requests:,} requests each")
            counts = {
                name: _count(admin, counter, func, request, settings.count_requests) for name, func in funcs.items()
            }
            version = str(admin.info("server").get("redis_version", "?"))
    finally:
        for key in admin.scan_iter(f"{prefix}:*"):
            admin.delete(key)
        admin.close()

    def dist(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "?"

    result = InboundResult(
        settings=settings,
        bare_sync=bare_sync,
        bare_async=bare_async,
        bare_limiter=bare_limiter,
        sync=sync,
        async_=async_,
        limiters=limiters,
        counts=counts,
        redis_version=version,
        versions={
            name: dist(name) for name in ("Django", "django-redis", "redis", "django-ratelimit", "djangorestframework")
        },
        prefix=prefix,
    )
    # commandstats is server-wide: flag command kinds no limiter here sends or runs
    expected = {
        BALDUR_LIMITER: {"evalsha", "incr", "expire", "script|load"},
        DJANGO_RATELIMIT: {"set", "eval", "exists", "incrby"},
        DRF_THROTTLE: {"get", "set"},
    }
    for name, count in counts.items():
        foreign = {k: v for k, v in count.server.items() if k not in expected[name]}
        if foreign:
            result.notes.append(
                f"{name}: commandstats also counted {foreign}, which this limiter never causes: another client used "
                "the server meanwhile, so its server-side figure is an upper bound"
            )
    result.elapsed = time.monotonic() - started
    return result


# ---------------------------------------------------------------------- goals
@dataclass(frozen=True)
class InboundVerdict:
    text: str
    value: str
    status: str


def _ratio(samples: dict[str, Sample]) -> float | None:
    security = samples[SECURITY].overhead
    return samples[CIRCUIT].overhead / security if security > 0 else None


#: CircuitBreakerMiddleware costs at most this fraction of SecurityMiddleware.
MIDDLEWARE_GOAL = 0.5


def _async_to_sync_security(result: InboundResult) -> float | None:
    # SecurityMiddleware's async figure is its two thread hops; its own work is timed in the
    # async rounds too (SECURITY_WORK), so both figures share their rounds and their load
    work = result.async_.get(SECURITY_WORK)
    security = work.overhead if work is not None else result.sync[SECURITY].overhead
    return result.async_[CIRCUIT].overhead / security if security > 0 else None


def evaluate_inbound(result: InboundResult) -> list[InboundVerdict]:
    """PASS/MISS of the inbound goals.

    1. sync ``CircuitBreakerMiddleware`` ≤ 0.5x ``SecurityMiddleware``;
    2. async ``CircuitBreakerMiddleware`` ≤ 0.5x ``SecurityMiddleware``'s own work (Django's async ``SecurityMiddleware`` figure is mostly its two ``sync_to_async``
       thread hops, so the async middleware is held to the sync one's work, timed inside
       the same async rounds);
    3. async ``CircuitBreakerMiddleware`` within the sync ratio to ``SecurityMiddleware``;
    4. ``RateLimitMiddleware``: one round trip per admitted request.
    """
    sync_ratio = _ratio(result.sync)
    async_ratio = _ratio(result.async_)
    async_work = _async_to_sync_security(result)
    trips = result.counts[BALDUR_LIMITER].round_trips_per_request
    verdicts = []
    text = f"sync CircuitBreakerMiddleware/SecurityMiddleware <= {MIDDLEWARE_GOAL}"
    if sync_ratio is None:
        verdicts.append(InboundVerdict(text, "n/a", "N/A"))
    else:
        verdicts.append(InboundVerdict(text, f"{sync_ratio:.2f}x", "PASS" if sync_ratio <= MIDDLEWARE_GOAL else "MISS"))
    text = f"async CircuitBreakerMiddleware/SecurityMiddleware's work <= {MIDDLEWARE_GOAL}"
    if async_work is None:
        verdicts.append(InboundVerdict(text, "n/a", "N/A"))
    else:
        verdicts.append(InboundVerdict(text, f"{async_work:.2f}x", "PASS" if async_work <= MIDDLEWARE_GOAL else "MISS"))
    text = "async CircuitBreakerMiddleware/SecurityMiddleware ratio <= the sync ratio"
    if sync_ratio is None or async_ratio is None:
        verdicts.append(InboundVerdict(text, "n/a", "N/A"))
    else:
        verdicts.append(
            InboundVerdict(
                text,
                f"async {async_ratio:.2f}x, sync {sync_ratio:.2f}x",
                "PASS" if async_ratio <= sync_ratio else "MISS",
            )
        )
    verdicts.append(
        InboundVerdict(
            "RateLimitMiddleware: one round trip per admitted request", f"{trips:.3f}", "PASS" if trips == 1 else "MISS"
        )
    )
    return verdicts


def _ns(value: float) -> str:
    return f"+{value:,.0f} ns" if value >= 0 else f"{value:,.0f} ns"


def format_inbound(result: InboundResult) -> str:
    """The report as text: middleware overheads, limiter throughput and round trips, verdicts."""
    s = result.settings
    out = [
        f"Inbound side: sync {s.rounds} rounds x {s.requests:,} requests, async {s.async_rounds} x {s.async_requests:,}; "
        f"limiters {s.limiter_rounds} x {s.limiter_requests:,} on Redis {result.redis_version} at {s.redis_url}",
        "",
        f"{'middleware (view returns a ready 200)':<40}{'sync':>14}{'async':>14}",
    ]
    for name in MIDDLEWARES:
        out.append(f"{name:<40}{_ns(result.sync[name].overhead):>14}{_ns(result.async_[name].overhead):>14}")
    out.append(f"{'bare view':<40}{result.bare_sync:>11,.0f} ns{result.bare_async:>11,.0f} ns")
    sync_ratio, async_ratio = _ratio(result.sync), _ratio(result.async_)
    if sync_ratio is not None and async_ratio is not None:
        out.append(f"CircuitBreakerMiddleware / SecurityMiddleware: sync {sync_ratio:.2f}x, async {async_ratio:.2f}x")
    work = result.async_.get(SECURITY_WORK)
    if work is not None:
        out.append(f"{SECURITY_WORK} (async rounds): {_ns(work.overhead)}")
    async_work = _async_to_sync_security(result)
    if async_work is not None:
        out.append(f"async CircuitBreakerMiddleware / SecurityMiddleware's work, same rounds: {async_work:.2f}x")
    own = {
        mode: samples[CIRCUIT].overhead - samples[PASS_THROUGH].overhead
        for mode, samples in (("sync", result.sync), ("async", result.async_))
    }
    out.append(
        f"CircuitBreakerMiddleware over the pass-through: sync {_ns(own['sync'])}, async {_ns(own['async'])}"
        " (SecurityMiddleware's async figure is mostly its two sync_to_async thread hops)"
    )
    out += [
        "",
        f"{'rate limiter (every request admitted)':<32}{'requests/s':>12}{'over bare':>14}{'round trips':>13}"
        f"{'cmds sent':>11}{'server cmds':>13}",
    ]
    for name in LIMITERS:
        count = result.counts[name]
        out.append(
            f"{name:<32}{result.requests_per_second(name):>12,.0f}{_ns(result.limiters[name].overhead):>14}"
            f"{count.round_trips_per_request:>13.3f}{count.commands_per_request:>11.3f}{count.server_per_request:>13.3f}"
        )
    out += [
        "",
        "(per request; round trips and commands sent: counted on the client's connections; server cmds: INFO",
        " commandstats growth, commands run inside Lua scripts included)",
    ]
    for name in LIMITERS:
        out.append(f"  {name}: sent {result.counts[name].client_names}, server ran {result.counts[name].server}")
    for note in result.notes:
        out.append(f"NOTE: {note}")
    out += ["", "Goals:"]
    for verdict in evaluate_inbound(result):
        out.append(f"  {verdict.status:<5} {verdict.text}: {verdict.value}")
    out.append(f"\n(versions {result.versions}; measured in {result.elapsed:.1f} s)")
    return "\n".join(out)


def to_json(result: InboundResult) -> dict[str, Any]:
    """Every figure as plain data."""
    return {
        "settings": asdict(result.settings),
        "redis_version": result.redis_version,
        "versions": result.versions,
        "bare_ns": {"sync": result.bare_sync, "async": result.bare_async, "limiter": result.bare_limiter},
        "middleware_overhead_ns": {
            "sync": {name: result.sync[name].overhead for name in MIDDLEWARES},
            "async": {name: sample.overhead for name, sample in result.async_.items()},
        },
        "limiters": {
            name: {
                "requests_per_second": result.requests_per_second(name),
                "overhead_ns": result.limiters[name].overhead,
                "round_trips_per_request": result.counts[name].round_trips_per_request,
                "commands_sent_per_request": result.counts[name].commands_per_request,
                "server_commands_per_request": result.counts[name].server_per_request,
                "server_commands": result.counts[name].server,
            }
            for name in LIMITERS
        },
        "goals": [asdict(v) for v in evaluate_inbound(result)],
        "notes": result.notes,
    }


def main(
    argv: list[str] | None = None,
    *,
    quick: bool | None = None,
    json_file: str | None = None,
    redis_url: str | None = None,
) -> int:
    """``python -m benchmarks.inbound [--quick] [--redis-url URL] [--json FILE]``; returns the exit code."""
    return run_redis_bench(
        argv,
        prog="python -m benchmarks.inbound",
        description="inbound-side benchmark",
        default_url=DEFAULT_URL,
        settings=(INBOUND_DEFAULT, INBOUND_QUICK),
        bench=bench_inbound,
        render=format_inbound,
        as_json=to_json,
        quick=quick,
        json_file=json_file,
        redis_url=redis_url,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
