"""CB-18: failure predicates, in every call style (sync and async).

``ignore_exceptions`` takes exception types and callables mixed, ``failure_predicate``
decides which other exceptions are failures, ``result_predicate`` marks returned values as
failures. A 429 is a rate limit before any predicate runs; a predicate that raises makes
the call a failure, is logged (throttled per breaker) and never changes what the caller
gets. The functions at module level are also imported by dotted path (BALDUR_SERVICES).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest

import baldur_django as baldur
from baldur_django import ConfigError, RetryPolicy
from baldur_django.core.config import settings as baldur_settings

LOGGER = "baldur.circuit_breaker"
EVENT = "circuit_breaker.predicate_failed"


# ------------------------------------------------------------ predicates by dotted path
class Skip(Exception):
    """Ignored by type through BALDUR_SERVICES."""


def is_skip_text(exc: BaseException) -> bool:
    return "skip" in str(exc)


def only_connection_errors(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError)


def is_bad_value(value: Any) -> bool:
    return value == "bad"


NOT_CALLABLE = 42


class Response:
    def __init__(self, status_code: int, body: str = "") -> None:
        self.status_code = status_code
        self.body = body


# ------------------------------------------------------------------ the call styles
STYLES = [
    "protected",
    "protected-async",
    "aprotected",
    "circuit_breaker",
    "circuit_breaker-async",
    "protect",
    "aprotect",
]


def caller(style: str, service: str, **options: Any) -> Callable[[Callable[[], Any]], Any]:
    """``call(outcome)``: one call through *style* whose body returns ``outcome()`` (or raises)."""
    if style == "protected":

        @baldur.protected(service, **options)
        def sync(outcome):
            return outcome()

        return sync
    if style in ("protected-async", "aprotected", "circuit_breaker-async"):
        decorator = {
            "protected-async": baldur.protected,
            "aprotected": baldur.aprotected,
            "circuit_breaker-async": baldur.circuit_breaker,
        }[style]

        @decorator(service, **options)
        async def coro(outcome):
            await asyncio.sleep(0)
            return outcome()

        return lambda outcome: asyncio.run(coro(outcome))
    if style == "circuit_breaker":

        @baldur.circuit_breaker(service, **options)
        def plain(outcome):
            return outcome()

        return plain
    if style == "protect":
        return lambda outcome: baldur.protect(service, lambda: outcome(), **options)

    async def through_aprotect(outcome):
        async def attempt():
            await asyncio.sleep(0)
            return outcome()

        return await baldur.aprotect(service, attempt, **options)

    return lambda outcome: asyncio.run(through_aprotect(outcome))


def raising(exc: BaseException) -> Callable[[], Any]:
    def outcome():
        raise exc

    return outcome


def returning(value: Any) -> Callable[[], Any]:
    return lambda: value


def calls(service: str) -> dict[str, int]:
    return baldur.get_breaker(service).metrics()["calls"]


def outcome_of(call: Callable[[Callable[[], Any]], Any], outcome: Callable[[], Any]) -> Any:
    """What the caller got: the value, or the exception object itself."""
    try:
        return call(outcome)
    except BaseException as exc:  # noqa: BLE001 - the test compares what came out
        return exc


@pytest.fixture(params=STYLES)
def style(request, clock):
    return request.param


# ---------------------------------------------------------------- ignore_exceptions
def test_cb18_ignore_exceptions_mixes_types_and_callables(style):
    """CB-18: ignore_exceptions=(type, callable): an instance of the type, or an exception the
    callable answers True for, is ignored (neither outcome) and re-raised unchanged; others fail."""
    call = caller(style, "mix", ignore_exceptions=(KeyError, is_skip_text), failure_threshold=50)
    key_error, skipped, boom = KeyError("k"), ValueError("please skip"), ValueError("boom")
    assert outcome_of(call, raising(key_error)) is key_error
    assert outcome_of(call, raising(skipped)) is skipped
    assert outcome_of(call, raising(boom)) is boom
    assert calls("mix") == {"success": 0, "failure": 1, "ignored": 2, "rate_limited": 0}
    assert baldur.get_breaker("mix").snapshot()["consecutive_failures"] == 1


def test_cb18_a_single_callable_is_accepted_for_ignore_exceptions(clock):
    """CB-18: one callable (not in a tuple) works like a one-item tuple, as one type does."""
    call = caller("protected", "single", ignore_exceptions=is_skip_text)
    outcome_of(call, raising(ValueError("skip")))
    assert calls("single")["ignored"] == 1


# --------------------------------------------------------------- failure_predicate
def test_cb18_failure_predicate_decides_which_exceptions_are_failures(style):
    """CB-18: failure_predicate(exc) True is a failure, False ignored (neither outcome); both
    reach the caller unchanged."""
    call = caller(style, "fp", failure_predicate=only_connection_errors, failure_threshold=50)
    down, typo = ConnectionError("down"), ValueError("a bug, not an outage")
    assert outcome_of(call, raising(down)) is down
    assert outcome_of(call, raising(typo)) is typo
    assert outcome_of(call, returning(7)) == 7
    assert calls("fp") == {"success": 1, "failure": 1, "ignored": 1, "rate_limited": 0}


def test_cb18_failures_by_predicate_open_the_breaker_ignored_ones_never(clock):
    """CB-18, CB-2: only the exceptions the predicate calls failures count toward the threshold."""
    call = caller("protected", "trip", failure_predicate=only_connection_errors, failure_threshold=2)
    for _ in range(5):
        outcome_of(call, raising(ValueError("ignored")))
    assert baldur.get_breaker("trip").state is baldur.CircuitState.CLOSED
    outcome_of(call, raising(ConnectionError()))
    outcome_of(call, raising(ConnectionError()))
    assert baldur.get_breaker("trip").state is baldur.CircuitState.OPEN


def test_cb18_ignore_is_asked_before_failure_predicate(style):
    """CB-18: the order is ignore_exceptions, then failure_predicate: an ignored exception never
    reaches failure_predicate."""
    asked: list[BaseException] = []

    def everything_fails(exc):
        asked.append(exc)
        return True

    call = caller(style, "order", ignore_exceptions=(is_skip_text,), failure_predicate=everything_fails)
    outcome_of(call, raising(ValueError("skip")))
    assert asked == [] and calls("order")["ignored"] == 1
    outcome_of(call, raising(ValueError("count")))
    assert len(asked) == 1 and calls("order")["failure"] == 1


def test_cb18_ignored_by_predicate_gets_no_fallback_and_no_retry(clock):
    """CB-18, CB-10, FAC-3, FAC-4: an exception a predicate ignores is re-raised, never retried,
    never replaced by the fallback; one it calls a failure is retried, then falls back."""
    attempts: list[str] = []

    @baldur.protected(
        "fallback-fp",
        failure_predicate=only_connection_errors,
        retry=RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0),
        fallback=lambda kind: "fallback",
    )
    def call(kind):
        attempts.append(kind)
        raise (ConnectionError if kind == "down" else ValueError)(kind)

    with pytest.raises(ValueError):
        call("bug")
    assert attempts == ["bug"]
    assert call("down") == "fallback"
    assert attempts == ["bug", "down", "down", "down"]


def test_cb18_async_retry_follows_the_predicates(clock):
    """CB-18, FAC-3 (async): the same in aprotect: an ignored exception is not retried; a value
    the result_predicate marks is retried and the last one returned unchanged."""
    attempts: list[int] = []

    async def flaky():
        attempts.append(1)
        raise ValueError("ignored")

    with pytest.raises(ValueError):
        asyncio.run(baldur.aprotect("async-retry", flaky, retry=True, failure_predicate=only_connection_errors))
    assert len(attempts) == 1

    async def bad():
        attempts.append(2)
        return "bad"

    policy = RetryPolicy(max_attempts=3, backoff_initial=0, jitter=0)
    assert asyncio.run(baldur.aprotect("async-retry-2", bad, retry=policy, result_predicate=is_bad_value)) == "bad"
    assert attempts == [1, 2, 2, 2]
    assert calls("async-retry-2")["failure"] == 1  # a retry sequence is one call (FAC-2)


# ---------------------------------------------------------------------- 429 first
def test_cb18_a_429_is_a_rate_limit_before_any_predicate(style):
    """CB-18, RL-1: a 429 exception is a rate-limited failure although an ignore callable and
    failure_predicate would ignore it; neither is even asked."""
    asked: list[BaseException] = []

    def ignore_all(exc):
        asked.append(exc)
        return True

    call = caller(style, "rl", ignore_exceptions=(ignore_all,), failure_predicate=ignore_all)
    limited = RuntimeError("429 Too Many Requests")
    assert outcome_of(call, raising(limited)) is limited
    assert asked == []
    assert calls("rl")["rate_limited"] == 1


def test_cb18_a_returned_429_is_a_rate_limit_before_result_predicate(style):
    """CB-18, RL-1: a returned 429 is a rate limit; result_predicate is not asked about it."""
    asked: list[Any] = []

    def never_fails(value):
        asked.append(value)
        return False

    call = caller(style, "rl-value", result_predicate=never_fails)
    response = Response(429)
    assert outcome_of(call, returning(response)) is response
    assert asked == [] and calls("rl-value")["rate_limited"] == 1


def test_rl7_an_ignored_type_still_beats_the_429_test(clock):
    """RL-7 with CB-18: an exception *type* in ignore_exceptions is ignored even when it is a
    429 sighting (types are not predicates)."""

    class TooManyRequests(Exception):
        pass

    call = caller("protected", "rl7", ignore_exceptions=(TooManyRequests, is_skip_text))
    outcome_of(call, raising(TooManyRequests()))
    assert calls("rl7") == {"success": 0, "failure": 0, "ignored": 1, "rate_limited": 0}


# ---------------------------------------------------------------- result_predicate
def test_cb18_result_predicate_marks_values_as_failures(style):
    """CB-18, CB-11: a value result_predicate answers True for is a failure, returned unchanged
    (no exception, no fallback); a failure status stays a failure without asking it."""
    asked: list[Any] = []

    def bad_body(value):
        asked.append(value)
        return value == "bad" or getattr(value, "body", "") == "error"

    call = caller(style, "rp", result_predicate=bad_body, failure_threshold=50)
    ok, bad, healthy_but_error, server_error = "ok", "bad", Response(200, "error"), Response(503)
    assert outcome_of(call, returning(ok)) == "ok"
    assert outcome_of(call, returning(bad)) == "bad"
    assert outcome_of(call, returning(healthy_but_error)) is healthy_but_error
    assert outcome_of(call, returning(server_error)) is server_error
    assert asked == ["ok", "bad", healthy_but_error]
    assert calls("rp") == {"success": 1, "failure": 3, "ignored": 0, "rate_limited": 0}


def test_cb18_result_predicate_never_triggers_the_fallback(clock):
    """CB-18, FAC-4: a value marked as a failure is returned, never replaced by the fallback."""

    @baldur.protected("rp-fallback", result_predicate=is_bad_value, fallback=lambda: "fallback")
    def call():
        return "bad"

    assert call() == "bad"
    assert calls("rp-fallback")["failure"] == 1


def test_cb18_result_predicate_on_a_healthy_full_window(clock):
    """CB-18, CB-9: after the window fills with successes (the lock-free healthy lane), a value
    the predicate marks is still a failure: the lane never skips the predicate."""
    call = caller("circuit_breaker", "lane", result_predicate=is_bad_value, sliding_window_size=5, minimum_calls=5)
    for _ in range(12):
        call(returning(1))
    call(returning("bad"))
    assert baldur.get_breaker("lane").snapshot()["consecutive_failures"] == 1


# ---------------------------------------------------------------- raising predicates
def _boom(value: Any) -> bool:
    raise RuntimeError("predicate bug")


@pytest.mark.parametrize("key", ["ignore_exceptions", "failure_predicate"])
def test_cb18_a_raising_exception_predicate_counts_a_failure_and_keeps_the_exception(style, key, caplog):
    """CB-18: an exception predicate that raises: the call counts as a failure, the caller gets
    the call's own exception (not the predicate's), and the predicate's error is logged."""
    option = (_boom,) if key == "ignore_exceptions" else _boom
    call = caller(style, "raising", **{key: option})
    own = ValueError("the call's own error")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = outcome_of(call, raising(own))
    assert got is own and got.__context__ is None
    assert calls("raising")["failure"] == 1
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == EVENT]
    assert record.service == "raising" and record.role == key
    assert record.getMessage().startswith(EVENT) and "predicate bug" in record.getMessage()
    assert record.exc_info[1].args == ("predicate bug",)


def test_cb18_a_raising_result_predicate_keeps_the_value(style, caplog):
    """CB-18: a result_predicate that raises: the value reaches the caller unchanged and the
    call counts as a failure; the error is logged."""
    call = caller(style, "raising-value", result_predicate=_boom)
    value = {"answer": 42}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert outcome_of(call, returning(value)) is value
    assert calls("raising-value")["failure"] == 1
    assert [r.role for r in caplog.records if getattr(r, "event", None) == EVENT] == ["result_predicate"]


def test_cb18_predicate_errors_are_logged_once_per_interval_per_breaker(clock, caplog, monkeypatch):
    """CB-18: at most one predicate_failed line per breaker per BALDUR_STORE_WARNING_INTERVAL_SECONDS
    (on the breaker's clock); the next one says how many were left out; breakers are apart."""
    monkeypatch.setenv("BALDUR_STORE_WARNING_INTERVAL_SECONDS", "30")
    baldur_settings.reset()
    first = caller("protected", "throttle-a", failure_predicate=_boom)
    second = caller("protected", "throttle-b", failure_predicate=_boom, failure_threshold=50)
    first_calls = caller("protected", "throttle-a", failure_predicate=_boom)

    def lines():
        return [r for r in caplog.records if getattr(r, "event", None) == EVENT]

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            outcome_of(first, raising(ValueError()))
        outcome_of(second, raising(ValueError()))
        assert [r.service for r in lines()] == ["throttle-a", "throttle-b"]
        clock.advance(29.9)
        outcome_of(first_calls, raising(ValueError()))
        assert len(lines()) == 2
        clock.advance(0.2)
        outcome_of(first, raising(ValueError()))
        assert [r.service for r in lines()] == ["throttle-a", "throttle-b", "throttle-a"]
        assert lines()[-1].suppressed == 3
    assert calls("throttle-a")["failure"] == 5  # every call counted, logged or not


def test_cb18_a_base_exception_from_a_predicate_is_not_swallowed(clock):
    """CB-18, CB-10: a predicate raising KeyboardInterrupt is not turned into a failure: it
    propagates (the package never swallows a BaseException)."""

    def interrupt(exc):
        raise KeyboardInterrupt

    call = caller("protected", "interrupt", failure_predicate=interrupt)
    with pytest.raises(KeyboardInterrupt):
        call(raising(ValueError()))


# ------------------------------------------------------------ BALDUR_SERVICES paths
HERE = __name__


def services_env(monkeypatch, entry: dict[str, Any]) -> None:
    import json

    monkeypatch.setenv("BALDUR_SERVICES", json.dumps({"svc": entry}))
    baldur_settings.reset()


def test_cb18_services_entry_sets_predicates_by_dotted_path(style, monkeypatch):
    """CB-18, CFG-1: BALDUR_SERVICES keys ignore_exceptions, failure_predicate and result_predicate
    take dotted import paths (an exception class and functions)."""
    services_env(
        monkeypatch,
        {
            "ignore_exceptions": [f"{HERE}.Skip", f"{HERE}.is_skip_text"],
            "failure_predicate": f"{HERE}.only_connection_errors",
            "result_predicate": f"{HERE}.is_bad_value",
            "failure_threshold": 50,
        },
    )
    call = caller(style, "svc")
    for outcome in (
        raising(Skip()),
        raising(ValueError("skip")),
        raising(ValueError("no outage")),
        raising(ConnectionError()),
        returning("bad"),
        returning("good"),
    ):
        outcome_of(call, outcome)
    assert calls("svc") == {"success": 1, "failure": 2, "ignored": 3, "rate_limited": 0}


def test_cb18_per_call_predicates_win_over_the_services_entry(clock, monkeypatch):
    """CB-18, CFG-1: a per-call predicate overrides the BALDUR_SERVICES one, key by key."""
    services_env(
        monkeypatch,
        {"failure_predicate": f"{HERE}.only_connection_errors", "result_predicate": f"{HERE}.is_bad_value"},
    )
    call = caller("protected", "svc", failure_predicate=lambda exc: True)
    outcome_of(call, raising(ValueError()))  # a failure per call (the entry would ignore it)
    outcome_of(call, returning("bad"))  # still the entry's result_predicate
    assert calls("svc") == {"success": 0, "failure": 2, "ignored": 0, "rate_limited": 0}


def test_cb18_services_paths_are_imported_lazily(clock, monkeypatch, tmp_path):
    """CB-18: reading BALDUR_SERVICES imports nothing; the path is imported when the first
    breaker of that service is built."""
    (tmp_path / "lazy_predicates_cb18.py").write_text("def judge(exc):\n    return False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    services_env(monkeypatch, {"failure_predicate": "lazy_predicates_cb18.judge"})
    assert baldur_settings.get("BALDUR_SERVICES")["svc"]["failure_predicate"] == "lazy_predicates_cb18.judge"
    assert "lazy_predicates_cb18" not in sys.modules
    baldur.get_breaker("other")
    assert "lazy_predicates_cb18" not in sys.modules
    call = caller("protected", "svc")
    assert "lazy_predicates_cb18" in sys.modules
    outcome_of(call, raising(ValueError()))
    assert calls("svc")["ignored"] == 1
    monkeypatch.delitem(sys.modules, "lazy_predicates_cb18")


def test_cb18_services_predicates_follow_a_settings_change(clock, monkeypatch):
    """CB-18, CFG-2: a result_predicate added to (then removed from) the BALDUR_SERVICES entry
    applies to a function decorated before, on its plain-value fast path too."""
    from baldur_django.core.registry import registry

    call = caller("circuit_breaker", "svc", failure_threshold=50)
    for _ in range(120):  # a full, healthy window: the lock-free lane
        call(returning("bad"))
    assert calls("svc")["failure"] == 0
    services_env(monkeypatch, {"result_predicate": f"{HERE}.is_bad_value"})
    registry.reconfigure_all()
    call(returning("bad"))
    assert calls("svc")["failure"] == 1
    services_env(monkeypatch, {})
    registry.reconfigure_all()
    call(returning("bad"))
    assert calls("svc")["failure"] == 1


# -------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"failure_predicate": 5}, "failure_predicate"),
        ({"failure_predicate": KeyError}, "failure_predicate"),  # a class: KeyError(exc) judges nothing
        ({"result_predicate": "myapp.is_bad"}, "result_predicate"),  # dotted paths are for BALDUR_SERVICES
        ({"ignore_exceptions": ("KeyError",)}, "ignore_exceptions"),
        ({"ignore_exceptions": (KeyError, 3)}, "ignore_exceptions"),
        ({"ignore_exceptions": int}, "ignore_exceptions"),
    ],
)
@pytest.mark.parametrize("where", ["protected", "aprotected", "circuit_breaker", "protect", "aprotect"])
def test_cb18_bad_predicates_are_config_errors_naming_the_key(clock, options, named, where):
    """CB-18, CFG-3: a non-callable, a class or a string given per call is a ConfigError naming
    the key; no breaker is created for it."""
    with pytest.raises(ConfigError, match=named):
        if where == "protect":
            baldur.protect("bad-input", lambda: 1, **options)
        elif where == "aprotect":
            asyncio.run(baldur.aprotect("bad-input", asyncio.sleep, **options))
        else:
            getattr(baldur, where)("bad-input", **options)
    from baldur_django.core.registry import registry

    assert registry.get("bad-input", create=False) is None


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"failure_predicate": "tests.core.no_such_module.judge"}, "['failure_predicate']"),
        ({"result_predicate": f"{HERE}.no_such_function"}, "['result_predicate']"),
        ({"failure_predicate": f"{HERE}.NOT_CALLABLE"}, "['failure_predicate']"),
        ({"ignore_exceptions": [f"{HERE}.Response"]}, "['ignore_exceptions']"),  # a class, not an exception
        ({"ignore_exceptions": ["nowhere_at_all.Error"]}, "['ignore_exceptions']"),
    ],
)
def test_cb18_bad_services_paths_are_config_errors_naming_the_key(clock, monkeypatch, entry, named):
    """CB-18, CFG-3: a BALDUR_SERVICES path that cannot be imported, or names no callable, is a
    ConfigError naming the service and the key, raised when the breaker is first built: by the
    call of a decorated function, never by decorating it."""
    services_env(monkeypatch, entry)
    call = caller("protected", "svc")  # decorating does not raise (CFG-3)
    with pytest.raises(ConfigError) as info:
        call(returning(1))
    assert f"BALDUR_SERVICES['svc']{named}" in str(info.value)
    with pytest.raises(ConfigError, match="svc"):
        baldur.get_breaker("svc")
    from baldur_django.core.registry import registry

    assert registry.get("svc", create=False) is None  # no breaker was created for it


def test_cb18_services_predicate_must_look_like_a_dotted_path():
    """CB-18, CFG-3: a BALDUR_SERVICES predicate that is not even a dotted path is refused when
    the setting is read, naming the key."""
    from baldur_django.core.config import SettingsSource

    source = SettingsSource(environ={"BALDUR_SERVICES": '{"svc": {"failure_predicate": "not a path"}}'})
    with pytest.raises(ConfigError, match=r"BALDUR_SERVICES\['svc'\]\['failure_predicate'\]"):
        source.get("BALDUR_SERVICES")
