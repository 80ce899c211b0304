"""Shared fixtures: a fresh registry per test, a fake clock, real-server guards."""

from __future__ import annotations

import os

import pytest

from baldur_django.core import emergency as emergency_module
from baldur_django.core import registry as registry_module
from baldur_django.core.clock import SYSTEM_CLOCK
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.events import bus
from baldur_django.core.testing import FakeClock, RecordingListener

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

pytest_plugins = ["tests.budgets", "tests.hung_store"]


def pytest_report_header(config):
    """Name the Django under test at the top of every run (tox envs pin one each)."""
    import django

    expected = os.environ.get("BALDUR_EXPECT_DJANGO")
    return f"django: {django.get_version()}" + (f" (the env names {expected})" if expected else "")


def need_server(what: str, reachable: bool, detail: str = "") -> None:
    """Skip locally, fail in CI (CI=true), when a real server is unreachable."""
    if reachable:
        return
    message = f"{what} is unreachable{': ' + detail if detail else ''}"
    if IN_CI:
        pytest.fail(message + " (CI=true: tests that need a server fail rather than skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_cluster():
    """A private three-master Redis Cluster for the whole session (tests/redis_cluster.py),
    started on first use and stopped at the end. It cannot start: skipped locally, and under
    CI=true every test that needs it fails (need_server)."""
    from tests.redis_cluster import start_or_none

    cluster, why = start_or_none()
    need_server("a local Redis Cluster (3 masters)", cluster is not None, why)
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def fresh_registry():
    """Every test starts with no breakers, fresh settings and the base listeners only."""
    registry = registry_module.registry
    listeners = bus.listeners
    registry.clear()
    registry.clock = SYSTEM_CLOCK
    baldur_settings.reset()
    yield registry
    registry.clear()
    registry.clock = SYSTEM_CLOCK
    if registry.guard is not None:  # a test that shared its breakers through a store
        registry.set_store(None)
    for listener in bus.listeners:
        if listener not in listeners:
            bus.unsubscribe(listener)
    baldur_settings.reset()


@pytest.fixture
def clock(fresh_registry):
    """A FakeClock installed in the process-wide registry (breakers made after this use it)."""
    fake = FakeClock()
    fresh_registry.clock = fake
    return fake


@pytest.fixture
def events():
    """Records every event published on the process-wide bus during the test."""
    listener = RecordingListener(bus)
    yield listener
    bus.unsubscribe(listener)


@pytest.fixture(autouse=True)
def no_harness_variables_in_a_test(monkeypatch):
    """The test harness's own BALDUR_TEST_* variables (read by ./dev and by the budget
    verdict at the end of a run, never by a test) are out of the environment while a test
    runs: the package's checks would take BALDUR_TEST_BUDGETS for a misspelt
    BALDUR_RETRY_BUDGET_* setting (warning W002) and change what a check test sees."""
    for name in ("BALDUR_TEST_BUDGETS", "BALDUR_TEST_WORKERS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def baldur_loggers_as_configured_by_default():
    """Every test starts with the package's loggers as a fresh process has them: no level
    of their own, propagating to the root logger (where caplog listens), not disabled. A
    Django ``LOGGING`` dictConfig in an earlier test (a command test, say) can leave them
    otherwise, which made log assertions depend on test order."""
    import logging

    def reset() -> None:
        for name in [n for n in logging.root.manager.loggerDict if n == "baldur" or n.startswith("baldur.")]:
            logger = logging.getLogger(name)
            logger.setLevel(logging.NOTSET)
            logger.propagate, logger.disabled = True, False

    reset()
    yield


@pytest.fixture(autouse=True)
def emergency_state_file(tmp_path_factory, monkeypatch):
    """Every test gets its own Emergency Mode state file (EM-1), also inherited by the
    processes it starts, and a process cache that has read nothing yet."""
    path = tmp_path_factory.mktemp("emergency") / "level.json"
    monkeypatch.setenv("BALDUR_EMERGENCY_STATE_FILE", str(path))
    baldur_settings.reset()
    emergency_module.reset()
    yield path
    emergency_module.reset()
