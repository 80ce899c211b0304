"""ST-2 / ST-6 / OP-4 / CB-12: one contract that every store backend passes.

The contract itself is the importable suite :class:`baldur_django.core.stores.contract.StoreContract`
(what a third-party store runs, ST-6). Here it runs on memory, fakeredis (Lua through lupa),
the real Redis server, a Redis Cluster, SQLite and the real PostgreSQL server (the
``backend`` fixture of ``conftest.py``), and on :class:`tests.stores.dict_store.DictStore`,
a small store class defined only in the tests.
"""

from __future__ import annotations

import pytest

from baldur_django.core.stores.base import decode, safe_key
from baldur_django.core.stores.contract import StoreContract, StoreUnderTest
from baldur_django.core.testing import FakeClock
from tests.stores.dict_store import DictStore


class TestBundledStores(StoreContract):
    """ST-2: the bundled stores pass the contract suite."""

    @pytest.fixture
    def store_under_test(self, backend):
        return StoreUnderTest(backend.store, age=backend.age)


class TestDictStore(StoreContract):
    """ST-6: a store class written from the protocol alone passes the same suite."""

    @pytest.fixture
    def store_under_test(self):
        clock = FakeClock()
        return StoreUnderTest(DictStore(now=clock.wall), age=lambda name, seconds: clock.advance(seconds))


def test_cb12_safe_key_is_injective_and_tame():
    """CB-12: keys have no braces, spaces or colons, and near-identical names differ."""
    a, b = safe_key("n" * 300), safe_key("n" * 299 + "m")
    assert a != b
    for key in (a, safe_key("{x} y:z")):
        assert not set(key) & set("{} :")


def test_st2_corrupt_record_reads_as_fresh_closed():
    """ST-2: garbage in the store reads as a fresh CLOSED record."""
    for raw in (b"\x00garbage", "[]", '{"state": "exploded", "version": 1}', '{"state": "open"}', None):
        assert decode(raw).state == "closed"
