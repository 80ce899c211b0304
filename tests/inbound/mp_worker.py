"""Child-process body for the cross-process limiter test (IN-4). Imports Django only when run."""

from __future__ import annotations

FIXED_NOW = 7_200_000.0  # a whole hour: every process counts in the same window


def fixed_now() -> float:
    return FIXED_NOW


def hammer(location: str, rules: list, path: str, attempts: int, barrier, results, prefix: str = "") -> None:
    """Configure Django with a django-redis cache (keys under *prefix*), wait at the barrier,
    send *attempts* requests."""
    try:
        import django
        from django.conf import settings

        settings.configure(
            CACHES={
                "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location, "KEY_PREFIX": prefix}
            },
            INSTALLED_APPS=[],
            USE_TZ=True,
            BALDUR_RATE_LIMIT_RULES=rules,
        )
        django.setup()
        from django.http import HttpResponse
        from django.test import RequestFactory

        from baldur_django import conf
        from baldur_django.limiter import RateLimiter
        from baldur_django.middleware import RateLimitMiddleware

        conf.install()  # read BALDUR_* from these settings, as the app config does
        middleware = RateLimitMiddleware(lambda request: HttpResponse("ok"), limiter=RateLimiter(time_func=fixed_now))
        factory = RequestFactory()
        requests = [factory.get(path, REMOTE_ADDR="2001:db8::7") for _ in range(attempts)]
        middleware.limiter.cache().get("warm-up")  # connect before the race starts
        barrier.wait(timeout=60)
        codes = [middleware(request).status_code for request in requests]
        results.put(("ok", codes.count(200), codes.count(429)))
    except BaseException as exc:  # report, never hang the parent
        results.put(("error", repr(exc), 0))
