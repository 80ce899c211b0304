"""CB-12 (amended): names that forge or mislead.

A breaker name is at most 1,000 characters, has no control characters (newline, carriage
return, tab, NUL, other Cc/Cf characters, line and paragraph separators) and no whitespace
at either end, so ``"upstream "`` or ``"upstream\\r"`` cannot pass for ``"upstream"``. Every
way of creating a breaker refuses such a name with a ConfigError saying what is wrong. And
no name, not even one a shared store held from before, can forge a log line.
"""

from __future__ import annotations

import logging

import pytest

import baldur_django as baldur
from baldur_django.core.breaker import CircuitBreaker
from baldur_django.core.config import BreakerConfig
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.errors import ConfigError
from baldur_django.core.events import ForceLapsed, StateChanged, bus
from baldur_django.core.names import MAX_NAME_LENGTH, check_name, name_problem, show_name
from baldur_django.core.registry import registry
from baldur_django.core.stores.memory import MemoryStore

BAD_NAMES = {
    "upstream\n": "control character (U+000A at position 8)",
    "upstream\r": "control character (U+000D at position 8)",
    "up\tstream": "control character (U+0009 at position 2)",
    "up\x00stream": "control character (U+0000 at position 2)",
    "up\x1bstream": "control character (U+001B at position 2)",
    "up\u200bstream": "control character (U+200B at position 2)",  # zero-width space (Cf)
    "up\u202estream": "control character (U+202E at position 2)",  # right-to-left override (Cf)
    "up\u2028stream": "control character (U+2028 at position 2)",  # line separator (Zl)
    "upstream ": "whitespace",
    " upstream": "whitespace",
    "\u00a0upstream": "whitespace",  # a no-break space
    "x" * (MAX_NAME_LENGTH + 1): f"is {MAX_NAME_LENGTH + 1} characters long, at most 1000",
    "x" * 10_240: "is 10240 characters long",
}


@pytest.mark.parametrize("name", list(BAD_NAMES), ids=lambda n: show_name(n, limit=12))
def test_cb12_a_misleading_name_is_refused_by_every_way_in(name):
    """CB-12 amended: get_breaker, the decorators, protect(), the class, force_open_circuit
    and get_breaker again all refuse the name with a ConfigError naming the problem (and
    quoting at most 60 characters of it); no breaker is created."""
    ways = [
        lambda: baldur.get_breaker(name),
        lambda: baldur.circuit_breaker(name),
        lambda: baldur.protected(name),
        lambda: baldur.protect(name, lambda: 1),
        lambda: CircuitBreaker(name, BreakerConfig()),
        lambda: baldur.force_open_circuit(name, ttl_minutes=1),
    ]
    for way in ways:
        with pytest.raises(ConfigError) as info:
            way()
        message = str(info.value)
        assert BAD_NAMES[name] in message
        assert len(message) < 300
        assert "\n" not in message and "\r" not in message
    assert len(registry) == 0


@pytest.mark.parametrize("name", ["upstream\n", "upstream ", "", 42])
def test_cb12_a_bad_name_is_refused_at_decoration_even_while_a_setting_is_bad(monkeypatch, name):
    """CB-12, CFG-3: a decorator defers a bad *setting* to the first call, but never a bad
    name: with the threshold setting unparsable, ``circuit_breaker(bad name)`` and
    ``protected(bad name)`` still raise the name's ConfigError at decoration, while a good
    name is deferred as before."""
    monkeypatch.setenv("BALDUR_CB_FAILURE_THRESHOLD", "many")
    baldur_settings.reset()
    problem = name_problem(name)
    assert problem is not None
    for way in (baldur.circuit_breaker, baldur.protected):
        with pytest.raises(ConfigError) as info:
            way(name)
        assert problem in str(info.value)
    deferred = baldur.circuit_breaker("upstream")(lambda: 1)
    with pytest.raises(ConfigError, match="BALDUR_CB_FAILURE_THRESHOLD"):
        deferred()
    assert len(registry) == 0


def test_cb12_the_name_is_reported_before_a_bad_override():
    """CB-12: a new breaker asked for with a bad name and a bad override gets the name's
    ConfigError, as when the name was checked first; nothing is registered."""
    with pytest.raises(ConfigError, match="control character"):
        registry.get("upstream\n", {"failure_threshold": -1})
    with pytest.raises(ConfigError, match="failure_threshold"):
        registry.get("upstream", {"failure_threshold": -1})
    assert len(registry) == 0


def test_cb12_the_longest_name_and_inner_spaces_are_valid():
    """CB-12: 1,000 characters, an inner space, unicode letters and symbols are names."""
    for name in ("x" * MAX_NAME_LENGTH, "up stream", "zahlungs-dienst-äöü-支払い", "a:{b}*[c]?"):
        assert check_name(name) == name
        assert baldur.get_breaker(name).name == name


def test_cb12_name_problem_says_what_is_wrong():
    """CB-12: the problem of an empty or non-string name, and None for a good one."""
    assert name_problem("") == "must not be empty"
    assert name_problem(42) == "must be a string, not int"
    assert name_problem("payments") is None


def test_cb12_show_name_keeps_a_plain_name_and_escapes_any_other():
    """CB-12: a plain name is shown as it is; an odd one quoted with its characters escaped;
    a long one cut, with its length."""
    assert show_name("payments") == "payments"
    assert show_name("upstream\ncircuit_breaker.closed") == "'upstream\\ncircuit_breaker.closed'"
    assert show_name("upstream ") == "'upstream '"
    assert show_name(None) == "None"
    assert show_name("x" * 500, limit=10) == "'xxxxxxxxxx'... (500 characters)"


FORGED = "upstream\ncircuit_breaker.closed service=upstream from=open trigger=half_open_success"


def lines_logged(caplog) -> list[str]:
    return [line for record in caplog.records for line in record.getMessage().splitlines()]


def test_cb12_a_name_read_back_from_a_store_cannot_forge_a_log_line(clock, caplog):
    """CB-12 amended: a shared record named with a newline (written before names were
    checked) whose force lapses when read: the force_lapsed line shows the name escaped, on
    one line, and no line of the log starts like a forged event."""
    store = MemoryStore(now=clock.wall)
    registry.set_store(store)
    store.force(FORGED, mode="open", ttl_seconds=60)  # a store does not check names
    clock.advance(61)
    caplog.set_level(logging.INFO, logger="baldur")
    answer = store.inspect(FORGED)
    assert answer.lapsed == "open"
    bus.publish(ForceLapsed(FORGED, answer.now, previous="open", from_state="open", to_state="half_open"))
    lines = lines_logged(caplog)
    assert any(
        line.startswith("circuit_breaker.force_lapsed service='upstream\\ncircuit_breaker.closed") for line in lines
    )
    assert not any(line.startswith("circuit_breaker.closed") for line in lines)
    assert [r.service for r in caplog.records if getattr(r, "event", None) == "circuit_breaker.force_lapsed"] == [
        FORGED
    ]  # structured handlers still get the name as it is


@pytest.mark.parametrize("service", [FORGED, "upstream\r", "upstream "])
def test_cb12_transition_lines_show_odd_names_escaped(caplog, service):
    """CB-12 amended: a state change of a breaker with an odd name (published by a peer, or
    from before the rules) logs one line with the name quoted and escaped."""
    caplog.set_level(logging.WARNING, logger="baldur")
    bus.publish(StateChanged(service, 0.0, from_state="closed", to_state="open", trigger="consecutive_failures"))
    lines = lines_logged(caplog)
    assert lines == [f"circuit_breaker.opened service={service!r} from=closed trigger=consecutive_failures"]
