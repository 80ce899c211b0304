"""CB-12 (amended) in the Django layer: commands, settings, the inbound middleware, the
outbound adapters and Slack with names that forge or mislead.

* ``baldur_force open <10 KB name> --new`` (or a name with a newline, or a trailing space)
  is refused with a CommandError saying what is wrong, and nothing is forced;
* ``baldur_status`` shows names a shared store held from before the rules on one line each,
  escaped, and never pads every row to a 10 KB name;
* a setting naming a misleading breaker is a system-check error; a bad domain at request
  time serves the request without a breaker instead of failing it;
* the adapters refuse such a ``service=``, and name an odd host by a valid, distinct name;
* a Slack message shows the name escaped on its one line.
"""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpResponse
from django.test import RequestFactory

from baldur_django.contrib.outbound import host_breaker_name
from baldur_django.contrib.requests import BreakerAdapter
from baldur_django.contrib.slack import SlackNotifier
from baldur_django.core.errors import ConfigError
from baldur_django.core.events import StateChanged
from baldur_django.core.names import name_problem
from baldur_django.core.registry import registry
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.middleware import CircuitBreakerMiddleware

pytestmark = pytest.mark.django_db

FORGED = "upstream\ncircuit_breaker.closed service=upstream"
LONG = "x" * 10_240


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def shared_store(settings, clock):
    """A shared backend configured, its store a MemoryStore the test can fill directly."""
    settings.BALDUR_STATE_BACKEND = "database"
    store = MemoryStore(now=clock.wall)
    registry.set_store(store)
    return store


@pytest.mark.parametrize(
    "name, problem",
    [(LONG, "is 10240 characters long"), ("upstream\n", "control character"), ("upstream ", "whitespace")],
    ids=["10KB", "newline", "trailing-space"],
)
def test_cb12_baldur_force_new_refuses_a_misleading_name(shared_store, name, problem):
    """CB-12 amended: ``baldur_force open NAME --new`` with a 10 KB name, a newline or a
    trailing space: a short CommandError saying what is wrong; nothing forced or registered."""
    with pytest.raises(CommandError) as info:
        run("baldur_force", "open", name, "--ttl", "5", "--new")
    message = str(info.value)
    assert "not a valid breaker name" in message and problem in message
    assert len(message) < 400 and "\n" not in message
    assert shared_store.names() == {} and len(registry) == 0


def test_cb12_baldur_status_shows_old_odd_names_on_one_line_each(shared_store):
    """CB-12 amended: names a store held from before the rules (a forged line, a trailing
    space, 10 KB) are listed one row each, escaped, and no row is padded to 10 KB."""
    for name in (FORGED, "upstream ", "upstream", LONG):
        shared_store.load(name)  # a store does not check names
    out, _ = run("baldur_status")
    lines = out.splitlines()
    assert len(lines) == 2 + 4  # backend, header, four rows
    assert all(len(line) < 400 for line in lines)
    rows = lines[2:]
    assert not any(line.startswith("circuit_breaker") for line in lines)
    assert any(row.startswith("'upstream\\ncircuit_breaker.closed service=upstream'") for row in rows)
    assert any(row.startswith("'upstream '") for row in rows)
    assert any(row.split("  ")[0] == "upstream" for row in rows)
    assert any(row.startswith("'" + "x" * 100 + "'... (10240 characters)") for row in rows)


@pytest.mark.parametrize(
    "setting, value, check_id",
    [
        ("BALDUR_SERVICES", {"payments ": {}}, "baldur.E022"),
        ("BALDUR_HEALTH_CRITICAL_SERVICES", ["payments\n"], "baldur.E072"),
        ("BALDUR_DOMAIN_MAPPING", {"/api/": "api\r"}, "baldur.E033"),
        ("BALDUR_DOMAIN_DEFAULT", "default\t", "baldur.E034"),
        ("BALDUR_DOMAIN_DEFAULT", "d" * 1001, "baldur.E034"),
    ],
)
def test_cb12_a_setting_naming_a_misleading_breaker_is_a_check_error(settings, setting, value, check_id):
    """CB-12 amended, CFG-3: a setting whose breaker name is misleading is a system-check
    error with the setting's own id."""
    setattr(settings, setting, value)
    assert check_id in [m.id for m in run_checks() if m.id]


def test_cb12_a_bad_domain_serves_the_request_without_a_breaker(settings, caplog):
    """CB-12 amended: a domain mapping naming an invalid breaker does not lose requests: they
    are served (sync and async), no breaker of that name appears, and one warning says why."""
    settings.BALDUR_DOMAIN_MAPPING = {"/api/": "api\n"}
    caplog.set_level(logging.WARNING, logger="baldur")
    request = RequestFactory().get("/api/items")
    middleware = CircuitBreakerMiddleware(lambda r: HttpResponse("served"))
    assert [middleware(request).content for _ in range(3)] == [b"served"] * 3

    async def handler(r):
        return HttpResponse("served async")

    amiddleware = CircuitBreakerMiddleware(handler)
    assert asyncio.run(amiddleware(request)).content == b"served async"
    assert all(name_problem(name) is None for name in registry.names())
    warnings = [r for r in caplog.records if "baldur.inbound_unprotected" in r.getMessage()]
    assert len(warnings) == 1 and "BALDUR_DOMAIN_MAPPING" in warnings[0].getMessage()


def test_cb12_adapter_refuses_a_misleading_service_name():
    """CB-12 amended: ``BreakerAdapter(service=...)`` with a newline or a trailing space is a
    ConfigError at construction, saying what is wrong."""
    for name, problem in (("upstream\n", "control character"), ("upstream ", "whitespace")):
        with pytest.raises(ConfigError, match=problem):
            BreakerAdapter(service=name)


def test_cb12_an_odd_host_gets_a_valid_distinct_breaker_name():
    """CB-12 amended: a host that cannot be a breaker name as it is (too long, an invisible
    character) is named by a valid name that shows it escaped and never collides."""
    hosts = ["a" * 2000, "a" * 2001, "exa\u2028mple.com", "example.com"]
    names = [host_breaker_name("BreakerAdapter", "http://x/", "http", host, None) for host in hosts]
    assert all(name_problem(name) is None for name in names), names
    assert len(set(names)) == len(names)
    assert names[3] == "example.com"
    assert names[2].startswith("exa\\u2028mple.com~")
    # an invisible character that IDNA maps away reaches the very host without it, as the
    # clients send it: one host on the wire, one breaker
    assert host_breaker_name("BreakerAdapter", "http://x/", "http", "exa\u200bmple.com", None) == "example.com"


def test_cb12_slack_message_shows_an_odd_name_on_its_one_line():
    """CB-12 amended: the Slack text of an open shows a forged-looking name escaped, on one line."""
    text = SlackNotifier.message_for(StateChanged(FORGED, 0.0, from_state="closed", to_state="open", trigger="x"))
    assert text is not None and "\n" not in text
    assert "'upstream\\ncircuit_breaker.closed service=upstream'" in text


def test_cb12_baldur_forget_removes_an_old_misleading_name(shared_store):
    """CB-12 amended: a misleading name a store held from before the rules can be removed
    with baldur_forget (forgetting checks only that the registry holds the name)."""
    shared_store.load("upstream\r")
    shared_store.load("upstream")
    out, _ = run("baldur_forget", "upstream\r", "--yes", "--reason", "misleading name")
    assert "Forgot 'upstream\\r'" in out
    assert set(shared_store.names()) == {"upstream"}
