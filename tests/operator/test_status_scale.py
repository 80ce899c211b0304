"""Issue 21: the admin breaker list and ``baldur_status`` over many shared breakers read the
store's records a page (or a batch) at a time and create no breaker in this process (OP-6, OP-7).

A fresh registry (as in a new worker) with records in the real Redis store (one bulk
``inspect_many`` per page), in the database store (no bulk read: one ``inspect`` per name of
the page, never per registered name) and in the memory store (a force that the read lapses
is announced once).
"""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

import baldur_django as baldur
from baldur_django import services
from baldur_django.core import registry as registry_module
from baldur_django.core.stores.memory import MemoryStore
from baldur_django.core.stores.redis import RedisStore
from baldur_django.core.testing import FakeClock
from tests.stores.conftest import redis_client  # noqa: F401  (the real-Redis fixture)

LIST_URL = "/admin/baldur_django/breaker/"
COUNT = 250  # two full pages of 100 and one of 50
NAMES = sorted(f"svc-{i:04d}" for i in range(COUNT))


class CountingStore:
    """A store that counts the calls made to the store it wraps. It has ``inspect_many``
    exactly when the wrapped store has it (``getattr`` falls through to it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.calls: Counter[str] = Counter()
        self.bulk_sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "inspect_many":
                self.bulk_sizes.append(len(args[0]))
            return target(*args, **kwargs)

        return counted


def _register(store: Any, names: list[str]) -> None:
    """Other processes' breakers: records in the store and names in its registry, registered
    in shuffled order (the Redis registry is ordered by last-seen time, not by name)."""
    shuffled = list(names)
    random.Random(21).shuffle(shuffled)
    for name in shuffled:
        store.load(name)


@pytest.fixture
def superuser(db):
    return User.objects.create_superuser("admin", "admin@example.test", "pw")


@pytest.fixture
def redis_fleet(redis_client):  # noqa: F811
    """COUNT records in the real Redis store (DB 13, this test's prefix): 'svc-0003' forced
    open by someone else and 'svc-0150' tripped; this process holds no breaker."""
    inner = RedisStore(redis_client, prefix=redis_client.test_prefix)
    _register(inner, NAMES)
    inner.force("svc-0003", mode="open", ttl_seconds=600.0, reason="planned", actor="bob")
    inner.trip("svc-0150", trigger="consecutive_failures", recovery_timeout=60.0)
    store = CountingStore(inner)
    registry_module.registry.set_store(store)
    return store


@pytest.fixture
def database_fleet(settings, db):
    """COUNT records in the database store (which has no bulk read); no breaker held."""
    settings.BALDUR_STATE_BACKEND = "database"
    inner = registry_module.registry.store
    _register(inner, NAMES)
    store = CountingStore(inner)
    registry_module.registry.set_store(store)
    return store


def _page_names(response) -> list[str]:
    return [row["service"] for row in response.context["rows"]]


def _reads(store: CountingStore) -> tuple[int, int, int]:
    return store.calls["inspect_many"], store.calls["inspect"], store.calls["load"]


# ------------------------------------------------------------------------------ Redis
def test_admin_pages_100_sorted_names_with_one_bulk_read_and_no_breaker(client, superuser, redis_fleet):
    """Issue 21, OP-6: page 1 shows the first 100 names by name, page 2 the next 100, page 3 the last
    50, each with the total; each page is one inspect_many of that page's names, and no breaker is
    created in this process."""
    client.force_login(superuser)
    registry = registry_module.registry
    seen = []
    for number, expected in ((1, NAMES[:100]), (2, NAMES[100:200]), (3, NAMES[200:])):
        before = _reads(redis_fleet)
        response = client.get(LIST_URL, {"p": number} if number > 1 else {})
        assert response.status_code == 200
        assert _page_names(response) == expected
        assert response.context["total"] == COUNT and response.context["page_number"] == number
        after = _reads(redis_fleet)
        assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (1, 0, 0)
        assert redis_fleet.bulk_sizes[-1] == len(expected)
        seen += expected
        html = response.content.decode()
        assert f"{COUNT} breakers" in html
        assert f'<span class="this-page">{number}</span>' in html
        assert "?p=3" in html or number == 3
    assert seen == NAMES
    assert registry.names() == []
    rows = {row["service"]: row for row in client.get(LIST_URL).context["rows"]}
    forced = rows["svc-0003"]
    assert (forced["state"], forced["forced"], forced["force_actor"], forced["force_reason"]) == (
        "open",
        "open",
        "bob",
        "planned",
    )
    assert forced["from_record"] is True and forced["backend"] == "redis"
    tripped = client.get(LIST_URL, {"p": 2}).context["rows"][50]
    assert tripped["service"] == "svc-0150" and tripped["state"] == "open"
    assert tripped["open_duration"] == pytest.approx(60.0) and tripped["last_trigger"] == "consecutive_failures"
    assert registry.names() == []


def test_a_breaker_this_process_holds_shows_its_own_snapshot_on_its_page(client, superuser, redis_fleet):
    """Issue 21: a breaker this process holds keeps its snapshot (its local counts) on the page; the
    other rows of the page still come from one bulk read."""
    breaker = baldur.get_breaker("svc-0001")
    breaker.record_success(breaker.acquire())
    client.force_login(superuser)
    before = redis_fleet.bulk_sizes[:]
    rows = client.get(LIST_URL).context["rows"]
    assert rows[1]["service"] == "svc-0001" and rows[1]["from_record"] is False
    assert rows[1]["window_calls"] == 1
    assert redis_fleet.bulk_sizes == [*before, 99]
    assert registry_module.registry.names() == ["svc-0001"]


def test_a_page_past_the_end_or_not_a_number_is_said_and_a_real_page_shown(client, superuser, redis_fleet):
    """Issue 21: ?p=9 (3 pages) shows the last page with a warning; ?p=abc shows page 1 with a warning."""
    client.force_login(superuser)
    response = client.get(LIST_URL, {"p": 9})
    assert _page_names(response) == NAMES[200:]
    assert any("Page 9 does not exist" in str(m) for m in response.context["messages"])
    response = client.get(LIST_URL, {"p": "abc"})
    assert _page_names(response) == NAMES[:100]
    assert any("'abc' is not a page number" in str(m) for m in response.context["messages"])


def test_an_action_reads_only_the_selected_records(client, superuser, redis_fleet):
    """Issue 21, OP-6: the confirmation page of an action reads the selected names' records only
    (one bulk read of 2 names) and creates no breaker; an unknown name is still refused."""
    client.force_login(superuser)
    before = redis_fleet.bulk_sizes[:]
    response = client.post(LIST_URL, {"action": "force_open", "_selected_action": ["svc-0200", "svc-0003"]})
    assert response.status_code == 200
    assert [row["service"] for row in response.context["rows"]] == ["svc-0200", "svc-0003"]
    assert response.context["rows"][1]["forced"] == "open"
    assert redis_fleet.bulk_sizes == [*before, 2]
    assert redis_fleet.calls["inspect"] == 0 and registry_module.registry.names() == []
    response = client.post(LIST_URL, {"action": "force_open", "_selected_action": ["svc-0200", "nope"]}, follow=True)
    assert any("Unknown breaker(s): nope" in str(m) for m in response.context["messages"])


def test_baldur_status_json_reads_every_record_in_batches_and_creates_no_breaker(redis_fleet, monkeypatch, db):
    """Issue 21, OP-7: ``baldur_status --json`` lists every name, sorted, from ceil(N / batch) bulk
    reads (batch of 100 here: 3), never one read per breaker, and this process holds no breaker after."""
    monkeypatch.setattr(services.status, "STATUS_BATCH", 100)  # read by the status module
    out = io.StringIO()
    call_command("baldur_status", "--json", stdout=out, stderr=io.StringIO())
    document = json.loads(out.getvalue())
    assert [row["service"] for row in document["breakers"]] == NAMES
    assert redis_fleet.bulk_sizes == [100, 100, 50]
    assert redis_fleet.calls["inspect"] == 0 and redis_fleet.calls["load"] == 0
    assert registry_module.registry.names() == []
    by_name = {row["service"]: row for row in document["breakers"]}
    assert by_name["svc-0003"]["forced"] == "open" and by_name["svc-0150"]["state"] == "open"
    table = io.StringIO()
    call_command("baldur_status", stdout=table, stderr=io.StringIO())
    lines = table.getvalue().splitlines()
    assert len(lines) == 2 + COUNT  # the backend line, the header, one line per breaker
    assert "forced" not in lines[2] and "open by bob" in lines[2 + 3]
    assert registry_module.registry.names() == []


def test_status_rows_of_one_name_keeps_its_semantics(redis_fleet):
    """OP-7: status_rows(name) still loads that breaker (and only it) and an unknown name is an
    UnknownServiceError with suggestions."""
    assert services.status_rows("svc-0003")[0]["forced"] == "open"
    assert registry_module.registry.names() == ["svc-0003"]
    with pytest.raises(services.UnknownServiceError) as info:
        services.status_rows("svc-00O3")
    assert info.value.suggestions and all(name in NAMES for name in info.value.suggestions)
    assert registry_module.registry.names() == ["svc-0003"]


def test_status_page_refuses_a_bad_offset_or_limit():
    """Bad input: the offset and limit are named."""
    with pytest.raises(baldur.ConfigError, match="offset -1"):
        services.status_page(-1, 10)
    with pytest.raises(baldur.ConfigError, match="limit 0"):
        services.status_page(0, 0)


# --------------------------------------------------------------------------- database
def test_database_store_pages_through_one_inspect_per_name_of_the_page(client, superuser, database_fleet):
    """Issue 21: a store without inspect_many is read one inspect per name of the page (100), not per
    registered name (250), and no breaker is created; page 3 holds the last 50 names."""
    client.force_login(superuser)
    response = client.get(LIST_URL)
    assert _page_names(response) == NAMES[:100] and response.context["total"] == COUNT
    assert _reads(database_fleet) == (0, 100, 0)
    response = client.get(LIST_URL, {"p": 3})
    assert _page_names(response) == NAMES[200:]
    assert _reads(database_fleet) == (0, 150, 0)
    assert registry_module.registry.names() == []
    out = io.StringIO()
    call_command("baldur_status", "--json", stdout=out, stderr=io.StringIO())
    assert [row["service"] for row in json.loads(out.getvalue())["breakers"]] == NAMES
    assert _reads(database_fleet) == (0, 150 + COUNT, 0)
    assert registry_module.registry.names() == []


# ----------------------------------------------------------------------------- memory
def test_a_force_the_page_read_lapses_is_announced_once(events):
    """CB-14, issue 21: a force past its lifetime is lapsed by the store when the page reads it; the
    read announces force_lapsed exactly once and the row shows the record after the lapse."""
    clock = FakeClock()
    inner = MemoryStore(now=clock.wall)
    inner.force("remote", mode="open", ttl_seconds=60.0, reason="", actor="bob")
    registry_module.registry.set_store(inner)
    clock.advance(61)
    rows, total = services.status_page(0, 10)
    assert total == 1 and rows[0]["service"] == "remote"
    assert rows[0]["forced"] is None and rows[0]["state"] == "half_open"
    assert [event.kind for event in events.events if event.kind == "force_lapsed"] == ["force_lapsed"]
    services.status_page(0, 10)
    assert [event.kind for event in events.events if event.kind == "force_lapsed"] == ["force_lapsed"]
    assert registry_module.registry.names() == []


def test_a_store_that_fails_the_read_shows_fresh_rows_marked_unavailable(caplog):
    """ST-4: when the records cannot be read, the names still show, as a fresh breaker would judge
    them locally (CLOSED), with store_available False, and a warning says so."""

    class Failing(MemoryStore):
        def inspect(self, name: str, *, frozen: bool = False):
            raise ConnectionError("down")

    store = Failing()
    store.load("remote")
    registry_module.registry.set_store(store)
    rows, total = services.status_page()
    assert total == 1 and rows[0]["state"] == "closed" and rows[0]["store_available"] is False
    assert "could not be read" in caplog.text
