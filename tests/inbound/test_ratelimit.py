"""RateLimitMiddleware and the fixed-window limiter (IN-4; IN-3 for its marks)."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.cache import caches
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory

from baldur_django.core.errors import ConfigError
from baldur_django.core.marks import is_marked
from baldur_django.limiter import RateLimiter, client_ip, compile_rules, normalise_ip
from baldur_django.middleware import RateLimitMiddleware

from . import views

RULE = {"path": "/limited/", "rate": "3/m", "key": "ip"}


class Now:
    """A settable time function (Unix seconds) for the limiter's windows."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def by_tenant(request):
    """Key function for the dotted-path tests: the X-Tenant header; None exempts."""
    return request.headers.get("X-Tenant")


@pytest.fixture
def limited(configure):
    """``limited(rules, now=None)`` -> callable(path, **meta) -> response, via RateLimitMiddleware."""
    caches["default"].clear()
    factory = RequestFactory()

    def build(rules, now=None, view=None):
        configure(BALDUR_RATE_LIMIT_RULES=rules)
        limiter = RateLimiter(time_func=now) if now is not None else RateLimiter()
        middleware = RateLimitMiddleware(view or (lambda request: HttpResponse("ok")), limiter=limiter)

        def get(path="/limited/x/", user=None, **meta):
            request = factory.get(path, **meta)
            if user is not None:
                request.user = user
            response = middleware(request)
            response.request_marked = is_marked(request)
            return response

        get.limiter = limiter
        return get

    yield build
    caches["default"].clear()


def statuses(get, n, **kw):
    return [get(**kw).status_code for _ in range(n)]


# -------------------------------------------------------------------- responses
def test_in4_refusal_carries_the_four_headers_and_marks_the_request(site):
    """IN-4, IN-3: a refusal is a 429 with Retry-After, X-RateLimit-Limit/-Remaining/-Mode; admitted ones have none."""
    site(BALDUR_RATE_LIMIT_RULES=[{"path": "/limited/", "rate": "2/m", "key": "ip"}])
    c = Client()
    for _ in range(2):
        ok = c.get("/limited/status/200/")
        assert ok.status_code == 200
        assert not any(h.lower().startswith("x-ratelimit") for h in ok.headers)
    refused = c.get("/limited/status/200/")
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["X-RateLimit-Limit"] == "2"
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    assert refused.headers["X-RateLimit-Mode"] == "enforce"
    assert refused.wsgi_request.baldur_rate_limited is True
    assert views.CALLS == ["/limited/status/200/"] * 2
    assert c.get("/open/status/200/").status_code == 200  # no rule for this path


def test_in4_async_chain_refuses_too(site):
    """IN-4: under ASGI the limiter counts and refuses the same way."""
    site(BALDUR_RATE_LIMIT_RULES=[{"path": "/limited/", "rate": "2/m", "key": "ip"}])

    async def go():
        c = AsyncClient()
        return [(await c.get("/limited/astatus/200/")).status_code for _ in range(4)]

    assert asyncio.run(go()) == [200, 200, 429, 429]
    assert views.CALLS == ["/limited/astatus/200/"] * 2


# ---------------------------------------------------------------- fixed windows
def test_in4_fixed_window_refuses_until_the_window_ends(limited):
    """IN-4: N per window; Retry-After is the time to the window's end (>= 1 s); a new window starts fresh."""
    now = Now(1_200_000.0)  # a multiple of 60: a minute window starts here
    get = limited([RULE], now)
    assert statuses(get, 3) == [200, 200, 200]
    now.t += 40
    refused = get()
    assert (refused.status_code, refused.headers["Retry-After"]) == (429, "20")
    assert refused.request_marked is True
    now.t += 19.9999
    assert get().headers["Retry-After"] == "1"
    now.t += 0.0001
    assert statuses(get, 4) == [200, 200, 200, 429]


@pytest.mark.parametrize("rate,period", [("2/s", 1), ("2/m", 60), ("2/h", 3600)])
def test_in4_rate_units(limited, rate, period):
    """IN-4: s, m and h windows."""
    now = Now(3600.0 * 1000)
    get = limited([{"path": "/limited/", "rate": rate, "key": "ip"}], now)
    assert statuses(get, 3) == [200, 200, 429]
    assert get().headers["Retry-After"] == str(period)
    now.t += period
    assert statuses(get, 3) == [200, 200, 429]


def test_in4_refused_requests_are_not_hits(limited):
    """IN-4: refusals never use budget: the counter stays at the limit however many are refused."""
    now = Now()
    get = limited([RULE], now)
    assert statuses(get, 20) == [200] * 3 + [429] * 17
    rule = get.limiter.rules()[0]
    key = get.limiter.key(rule, int(now.t // 60), "ip:127.0.0.1")
    assert caches["default"].get(key) == 3


def test_in4_every_matching_rule_counts_on_its_own_and_refusals_give_hits_back(limited):
    """IN-4: each matching rule has its own counter; a request refused by one rule costs no other rule."""
    now = Now()
    get = limited(
        [
            {"path": "/limited/", "rate": "5/m", "key": "ip"},
            {"path": "/limited/search/", "rate": "1/m", "key": "ip"},
        ],
        now,
    )
    assert statuses(get, 4, path="/limited/search/") == [200, 429, 429, 429]
    refused = get(path="/limited/search/")
    assert refused.headers["X-RateLimit-Limit"] == "1"
    # only one of the five /search/ requests used the /limited/ budget
    assert statuses(get, 5, path="/limited/other/") == [200, 200, 200, 200, 429]
    assert get(path="/limited/other/").headers["X-RateLimit-Limit"] == "5"
    keys = [get.limiter.key(rule, int(now.t // 60), "ip:127.0.0.1") for rule in get.limiter.rules()]
    assert keys[0] != keys[1]
    assert [caches["default"].get(k) for k in keys] == [5, 1]


def test_in4_paths_outside_every_rule_are_never_counted(limited):
    """IN-4: rules apply by path substring only."""
    get = limited([RULE], Now())
    assert statuses(get, 10, path="/elsewhere/") == [200] * 10
    assert statuses(get, 4, path="/x/limited/") == [200, 200, 200, 429]


def test_cfg2_changed_rules_take_effect(limited, configure):
    """CFG-2, IN-4: a new BALDUR_RATE_LIMIT_RULES applies to the next request."""
    get = limited([RULE], Now())
    assert statuses(get, 4) == [200, 200, 200, 429]
    configure(BALDUR_RATE_LIMIT_RULES=[{"path": "/limited/", "rate": "10/m", "key": "ip"}])
    assert get().status_code == 200


# -------------------------------------------------------------------- client keys
def test_in4_forwarded_for_is_ignored_unless_trusted(limited):
    """IN-4: without BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR a spoofed header does not escape the limit."""
    get = limited([RULE], Now())
    codes = [get(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(5)]
    assert codes == [200, 200, 200, 429, 429]


def test_in4_trusted_forwarded_for_uses_the_entry_from_the_right(limited, configure):
    """IN-4: when trusted, the entry BALDUR_RATE_LIMIT_TRUSTED_PROXIES from the right is the client."""
    configure(BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR=True)
    get = limited([RULE], Now())
    # the client controls everything left of what our proxy appended
    same = [get(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=f"spoof-{i}, 203.0.113.7").status_code for i in range(4)]
    assert same == [200, 200, 200, 429]
    assert get(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.8").status_code == 200
    configure(BALDUR_RATE_LIMIT_TRUSTED_PROXIES=2)
    two = [
        get(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=f"1.1.1.{i}, 198.51.100.9, 10.0.0.2").status_code
        for i in range(4)
    ]
    assert two == [200, 200, 200, 429]


def test_in4_client_ip_edge_cases(configure):
    """IN-4: short or malformed X-Forwarded-For, ports and brackets."""
    rf = RequestFactory()
    req = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert client_ip(req) == "10.0.0.1"  # untrusted by default
    assert client_ip(req, trust_forwarded_for=True, trusted_proxies=1) == "203.0.113.7"
    assert client_ip(req, trust_forwarded_for=True, trusted_proxies=3) == "203.0.113.7"  # shorter: leftmost
    bad = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="unknown")
    assert client_ip(bad, trust_forwarded_for=True, trusted_proxies=1) == "10.0.0.1"
    empty = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=" , ")
    assert client_ip(empty, trust_forwarded_for=True, trusted_proxies=1) == "10.0.0.1"
    ported = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7:5555, [2001:DB8::1]:443")
    assert client_ip(ported, trust_forwarded_for=True, trusted_proxies=1) == "2001:db8::1"
    assert client_ip(ported, trust_forwarded_for=True, trusted_proxies=2) == "203.0.113.7"
    configure(BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR=True, BALDUR_RATE_LIMIT_TRUSTED_PROXIES=2)
    assert client_ip(ported) == "203.0.113.7"


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        (" 192.0.2.1 ", "192.0.2.1"),
        ("192.0.2.1:8080", "192.0.2.1"),
        ("not-an-ip", None),
        ("", None),
        (None, None),
    ],
)
def test_in4_ipv6_and_ipv4_spellings_are_normalised(raw, expected):
    """IN-4: every spelling of one address gives one text."""
    assert normalise_ip(raw) == expected


def test_in4_ipv6_spellings_share_one_counter(limited):
    """IN-4: differently written IPv6 addresses of one client share its counter."""
    get = limited([RULE], Now())
    spellings = ["2001:db8::1", "2001:DB8:0:0:0:0:0:1", "2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"]
    assert [get(REMOTE_ADDR=s).status_code for s in spellings] == [200, 200, 200, 429]
    assert get(REMOTE_ADDR="2001:db8::2").status_code == 200
    assert [
        get(REMOTE_ADDR=s).status_code for s in ("192.0.2.1", "::ffff:192.0.2.1", "192.0.2.1", "::ffff:c000:201")
    ] == [
        200,
        200,
        200,
        429,
    ]


def test_in4_user_key_counts_per_user_and_falls_back_to_ip(limited):
    """IN-4: key 'user' counts per authenticated user; anonymous requests count by IP."""
    get = limited([{"path": "/limited/", "rate": "2/m", "key": "user"}], Now())
    alice = SimpleNamespace(is_authenticated=True, pk=1)
    bob = SimpleNamespace(is_authenticated=True, pk=2)
    assert [get(user=alice, REMOTE_ADDR="10.0.0.1").status_code for _ in range(3)] == [200, 200, 429]
    assert [get(user=bob, REMOTE_ADDR="10.0.0.1").status_code for _ in range(3)] == [200, 200, 429]
    anon = AnonymousUser()
    assert [get(user=anon, REMOTE_ADDR="10.0.0.9").status_code for _ in range(3)] == [200, 200, 429]
    assert get(user=anon, REMOTE_ADDR="10.0.0.8").status_code == 200
    assert [get(REMOTE_ADDR="10.0.0.7").status_code for _ in range(3)] == [200, 200, 429]  # no request.user


def test_in4_dotted_path_key_function(limited):
    """IN-4: a dotted-path key function picks the counter; None exempts the request."""
    get = limited([{"path": "/limited/", "rate": "1/m", "key": "tests.inbound.test_ratelimit.by_tenant"}], Now())
    assert [get(HTTP_X_TENANT="acme").status_code for _ in range(2)] == [200, 429]
    assert get(HTTP_X_TENANT="globex").status_code == 200
    assert [get().status_code for _ in range(3)] == [200, 200, 200]  # no tenant: exempt
    assert get(HTTP_X_TENANT="a key with spaces and \u00fcnicode " * 10).status_code == 200


@pytest.mark.parametrize(
    "key,needle",
    [
        ("tests.inbound.no_such_module.fn", "cannot import module 'tests.inbound.no_such_module'"),
        ("tests.inbound.test_ratelimit.no_such_fn", "has no attribute 'no_such_fn'"),
        ("tests.inbound.test_ratelimit.RULE", "is not callable"),
        ("nodots", "expected 'ip', 'user' or a dotted path"),
    ],
)
def test_in4_bad_key_path_is_a_config_error_naming_the_setting(limited, key, needle):
    """IN-4, CFG-3: an unimportable key function fails with the setting's name."""
    get = limited([RULE, {"path": "/x/", "rate": "1/m", "key": key}], Now())
    with pytest.raises(ConfigError) as info:
        get()
    assert "BALDUR_RATE_LIMIT_RULES[1]['key']" in str(info.value)
    assert needle in str(info.value)


def test_in4_bad_rules_are_config_errors():
    """IN-4, CFG-3: malformed rules name the setting."""
    with pytest.raises(ConfigError, match="BALDUR_RATE_LIMIT_RULES"):
        RateLimiter(rules=[{"path": "/x/", "rate": "ten per minute"}])
    with pytest.raises(ConfigError, match=r"BALDUR_RATE_LIMIT_RULES\[0\]\['rate'\]"):
        compile_rules([{"path": "/x/", "rate": "5/d", "key": "ip"}])


# -------------------------------------------------------------------------- cache
def test_in4_counts_in_the_configured_cache_alias(limited, configure):
    """IN-4: counters live in BALDUR_RATE_LIMIT_CACHE_ALIAS."""
    configure(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "d"},
            "limits": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "l"},
        },
        BALDUR_RATE_LIMIT_CACHE_ALIAS="limits",
    )
    now = Now()
    get = limited([RULE], now)
    assert statuses(get, 4) == [200, 200, 200, 429]
    key = get.limiter.key(get.limiter.rules()[0], int(now.t // 60), "ip:127.0.0.1")
    assert caches["limits"].get(key) == 3
    assert caches["default"].get(key) is None
    caches["limits"].clear()


class BrokenCache:
    def add(self, *a, **k):
        raise ConnectionError("cache server down")

    incr = decr = add


def test_in4_cache_outage_admits_and_warns_once(limited, caplog):
    """IN-4: when the cache is down the limiter admits requests and logs one warning."""
    get = limited([RULE], Now())
    get.limiter.cache = lambda: BrokenCache()
    with caplog.at_level(logging.WARNING, logger="baldur.inbound"):
        assert statuses(get, 6) == [200] * 6
    warnings = [r for r in caplog.records if r.name == "baldur.inbound"]
    assert len(warnings) == 1
    assert "cache server down" in warnings[0].getMessage()


def test_in4_threads_sharing_the_cache_admit_exactly_the_rate(limited):
    """IN-4: 8 threads x 40 attempts at a 100/h rule, started together, admit exactly 100."""
    get = limited([{"path": "/limited/", "rate": "100/h", "key": "ip"}], Now(3600.0 * 500))
    barrier = threading.Barrier(8)
    admitted = []
    lock = threading.Lock()

    def worker():
        barrier.wait()
        mine = sum(get().status_code == 200 for _ in range(40))
        with lock:
            admitted.append(mine)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert sum(admitted) == 100
    rule = get.limiter.rules()[0]
    assert caches["default"].get(get.limiter.key(rule, 500, "ip:127.0.0.1")) == 100


# ----------------------------------------------------------- rates changed at run time
LOWERED = [{"path": "/limited/", "rate": "5/m", "key": "ip"}]


def test_in4_lowered_rate_applies_at_once_to_the_hits_already_counted(limited, configure):
    """IN-4, CFG-2: a client at 8 hits of 10/m, the rate lowered to 5/m with override_settings:
    the next request is refused with X-RateLimit-Remaining 0 (the counter carries on, it does not
    start afresh), refusals keep no hit, and raising the rate again gives back exactly the room left."""
    now = Now(1_200_000.0 + 10)  # 10 s into a minute window
    get = limited([{"path": "/limited/", "rate": "10/m", "key": "ip"}], now)
    assert statuses(get, 8) == [200] * 8
    before = get.limiter.key(get.limiter.rules()[0], int(now.t // 60), "ip:127.0.0.1")
    configure(BALDUR_RATE_LIMIT_RULES=LOWERED)
    after = get.limiter.key(get.limiter.rules()[0], int(now.t // 60), "ip:127.0.0.1")
    assert after == before  # the key names path, key and period, not the count
    refused = get()
    assert refused.status_code == 429
    assert refused.headers["X-RateLimit-Limit"] == "5"
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    assert refused.headers["Retry-After"] == "50"
    assert statuses(get, 3) == [429] * 3
    assert caches["default"].get(after) == 8  # refusals took nothing
    configure(BALDUR_RATE_LIMIT_RULES=[{"path": "/limited/", "rate": "10/m", "key": "ip"}])
    assert statuses(get, 3) == [200, 200, 429]  # 8 + 2 = 10: the old budget, not a new one
    now.t += 50  # the next window
    configure(BALDUR_RATE_LIMIT_RULES=LOWERED)
    assert statuses(get, 6) == [200] * 5 + [429]


def test_in4_counter_key_ignores_the_count_and_the_rule_position(limited):
    """IN-4: the counter of a rule is named by its path, key and period: a changed count or a
    rule inserted before it keeps the counter; another period or key or path is another counter."""
    rules = compile_rules([{"path": "/a/", "rate": "10/m", "key": "ip"}])
    same = compile_rules([{"path": "/b/", "rate": "1/s"}, {"path": "/a/", "rate": "3/m", "key": "ip"}])
    assert rules[0].ident == same[1].ident
    others = compile_rules(
        [
            {"path": "/a/", "rate": "10/h", "key": "ip"},
            {"path": "/a/", "rate": "10/m", "key": "user"},
            {"path": "/a/x", "rate": "10/m", "key": "ip"},
        ]
    )
    assert len({rules[0].ident, *(rule.ident for rule in others)}) == 4


def test_in4_rules_sharing_path_key_and_period_share_one_counter_the_stricter_limit_applies(limited):
    """IN-4: two rules with one path, key and period count each request once; the smaller count rules."""
    now = Now()
    get = limited(
        [{"path": "/limited/", "rate": "5/m", "key": "ip"}, {"path": "/limited/", "rate": "3/m", "key": "ip"}], now
    )
    assert statuses(get, 4) == [200, 200, 200, 429]
    assert get().headers["X-RateLimit-Limit"] == "3"
    key = get.limiter.key(get.limiter.rules()[0], int(now.t // 60), "ip:127.0.0.1")
    assert caches["default"].get(key) == 3


# ------------------------------------------------------------------ honest Retry-After
@pytest.mark.parametrize("offset", [0.0, 0.3, 17.5, 59.0, 59.999])
def test_in4_a_request_made_retry_after_seconds_later_is_admitted(limited, offset):
    """IN-4: Retry-After is honest: the window that refused has ended that many seconds later,
    wherever in the window the refusal happened (fractional clock included), and not a second
    sooner is promised than needed (one second earlier the client would still be refused)."""
    now = Now(1_200_000.0 + offset)
    get = limited([RULE], now)
    assert statuses(get, 3) == [200] * 3
    refused = get()
    wait = int(refused.headers["Retry-After"])
    assert 1 <= wait <= 60
    if wait > 1:
        now.t += wait - 1
        assert get().status_code == 429
        now.t -= wait - 1
    now.t += wait
    assert get().status_code == 200


def test_in4_retry_after_waits_for_every_rule_that_refused(limited):
    """IN-4: when a minute rule and an hour rule both refuse a request, Retry-After is the hour's
    end (the minute's end would promise a request the hour rule still refuses); a request made then
    is admitted. A rule that admitted the request (its hit given back) does not lengthen the wait."""
    now = Now(3600.0 * 500 + 30)  # 30 s into an hour, and into a minute
    get = limited(
        [{"path": "/limited/", "rate": "2/m", "key": "ip"}, {"path": "/limited/", "rate": "4/h", "key": "ip"}],
        now,
    )
    assert statuses(get, 2) == [200, 200]
    refused = get()  # minute rule over, hour rule at 3 of 4: only the minute refuses
    assert (refused.status_code, refused.headers["Retry-After"], refused.headers["X-RateLimit-Limit"]) == (
        429,
        "30",
        "2",
    )
    now.t += 30
    assert statuses(get, 2) == [200, 200]  # minute 2 of 2; hour 4 of 4
    refused = get()  # both rules over now
    assert (refused.status_code, refused.headers["X-RateLimit-Limit"]) == (429, "4")
    wait = int(refused.headers["Retry-After"])
    assert wait == 3600 - 60
    now.t += 60  # the minute rule's next window: the hour rule still refuses
    assert get().status_code == 429
    now.t += wait - 60
    assert get().status_code == 200
