"""ST-6: ``BALDUR_STATE_BACKEND`` takes the dotted path of a store class, imported like a
cache backend; a path that cannot be imported or names no store is a clear ConfigError
and a system-check error naming the setting."""

from __future__ import annotations

import pytest
from django.core.checks import ERROR
from django.test import override_settings

from baldur_django import services
from baldur_django.backends import build_store, store_class
from baldur_django.checks import KNOB_IDS, check_settings
from baldur_django.core.errors import CircuitOpenError, ConfigError
from baldur_django.core.registry import get_breaker
from baldur_django.core.stores.base import make_store
from tests.stores.dict_store import DictStore

DICT_STORE = "tests.stores.dict_store.DictStore"


class NoBackendLabel(DictStore):
    backend = ""


class NotAStore:
    """Has some of the protocol's methods, not all."""

    def load(self, name):
        return None


def _store_errors(**settings):
    with override_settings(**settings):
        return [m for m in check_settings() if m.level >= ERROR and "BALDUR_STATE_BACKEND" in m.msg]


def test_st6_a_dotted_path_installs_the_store_and_breakers_use_it(fresh_registry):
    """ST-6: with BALDUR_STATE_BACKEND set to a store class's dotted path, the registry holds an
    instance of that class, a breaker's trip is written to it, and the operator surfaces
    treat it as shared."""
    with override_settings(BALDUR_STATE_BACKEND=DICT_STORE, BALDUR_SERVICES={"dotted": {"failure_threshold": 2}}):
        store = fresh_registry.store
        assert isinstance(store, DictStore)
        breaker = get_breaker("dotted")
        assert breaker.backend == "dict"
        for _ in range(2):
            breaker.record_failure(breaker.acquire())
        assert store.load("dotted").record.state == "open"
        assert store.load("dotted").record.trigger == "consecutive_failures"
        with pytest.raises(CircuitOpenError):
            breaker.acquire()
        assert services.is_shared_backend()
        assert _store_errors(BALDUR_STATE_BACKEND=DICT_STORE) == []


def test_st6_a_peer_force_written_to_the_store_reaches_the_breaker(fresh_registry):
    """ST-6, OP-4: a force another process wrote into the dotted-path store is adopted on consult."""
    with override_settings(BALDUR_STATE_BACKEND=DICT_STORE, BALDUR_CB_SYNC_INTERVAL_SECONDS=0):
        breaker = get_breaker("peer-forced")
        breaker.record_success(breaker.acquire())
        fresh_registry.store.force("peer-forced", mode="open", ttl_seconds=600.0, reason="peer", actor="ops")
        fresh_registry.clear()
        with pytest.raises(CircuitOpenError):
            get_breaker("peer-forced").acquire()


@pytest.mark.parametrize(
    "path, says",
    [
        ("tests.stores.no_such_module.Store", "cannot import it"),
        ("tests.stores.dict_store.NoSuchClass", "cannot import it"),
        ("tests.stores.test_dotted_backend.NotAStore", "is not a store class: NotAStore lacks inspect, trip"),
        ("math.pi", "is not a store class: float is not callable"),
    ],
)
def test_st6_a_bad_dotted_path_is_a_config_error_and_a_check_error(path, says):
    """ST-6, CFG-3: a path that cannot be imported, or names something that is not a store
    class, raises ConfigError naming the setting; the system check reports it under the
    setting's own id (baldur.E040) with a hint."""
    with pytest.raises(ConfigError, match="BALDUR_STATE_BACKEND=") as caught:
        store_class(path)
    assert says in str(caught.value)
    errors = _store_errors(BALDUR_STATE_BACKEND=path)
    assert len(errors) == 1
    assert errors[0].id == KNOB_IDS["BALDUR_STATE_BACKEND"] == "baldur.E040"
    assert errors[0].msg.startswith(f"BALDUR_STATE_BACKEND={path!r}") and says in errors[0].msg
    assert "dotted path of a store class" in errors[0].hint


def test_st6_a_value_that_is_neither_a_name_nor_a_path_is_rejected_by_the_knob():
    """CFG-3, ST-6: 'mongodb' or 'my store' is neither a bundled backend nor a dotted path."""
    for value in ("mongodb", "my.store class", ".relative.Path"):
        errors = _store_errors(BALDUR_STATE_BACKEND=value)
        assert len(errors) == 1 and errors[0].id == "baldur.E040", value
        assert "or the dotted path of a store class" in errors[0].msg


def test_st6_a_store_class_that_fails_or_has_no_label_is_a_config_error():
    """ST-6: calling the class must work and its instances must name themselves (``backend``)."""
    unlabelled = override_settings(BALDUR_STATE_BACKEND="tests.stores.test_dotted_backend.NoBackendLabel")
    with unlabelled, pytest.raises(ConfigError, match="'backend' attribute must be a non-empty string"):
        build_store()
    with pytest.raises(ConfigError, match="calling the store class with no arguments failed"):
        make_store("tests.stores.test_dotted_backend.NeedsArguments")


def test_st6_plain_python_imports_the_path_without_django():
    """ST-6: outside Django (importlib instead of import_string) the same path builds the store."""
    store = make_store(DICT_STORE)
    assert isinstance(store, DictStore) and store.backend == "dict"
    with pytest.raises(ConfigError, match="cannot import it"):
        make_store("tests.stores.nowhere.Store")


class NeedsArguments(DictStore):
    def __init__(self, url):
        super().__init__()
