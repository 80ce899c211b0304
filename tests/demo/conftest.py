"""Fixtures for the test project's shop: a real upstream server in a thread, and the shop
app installed on top of the test settings (tests/settings.py does not list it).

``shop_app`` (module scope) adds ``testproject.shop`` to INSTALLED_APPS, points
ROOT_URLCONF at ``testproject.urls`` and PAYMENTS_URL at the threaded upstream, and
creates the ``Order`` table in the test database. ``shop`` (per test) re-imports
``testproject.shop.payments``: its ``@baldur.protected`` decorator binds a breaker when
the module runs, and every test starts from an empty registry (``fresh_registry``), so
re-running it registers a fresh ``payments`` breaker on this test's FakeClock.
"""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.test.utils import modify_settings, override_settings

from testproject import upstream as upstream_module
from testproject.settings import BALDUR_SERVICES as SHOP_BALDUR_SERVICES


@pytest.fixture(scope="module")
def upstream():
    """The payments stand-in on a free loopback port, in a daemon thread."""
    server = upstream_module.start_in_thread()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shop_app(upstream, django_db_setup, django_db_blocker):
    installed = modify_settings(INSTALLED_APPS={"append": "testproject.shop"})
    overrides = override_settings(
        ROOT_URLCONF="testproject.urls",
        PAYMENTS_URL=upstream.url,
        PAYMENTS_TIMEOUT=5.0,
        BALDUR_SERVICES=SHOP_BALDUR_SERVICES,
    )
    from django.contrib import admin

    installed.enable()
    overrides.enable()
    created = False
    Order = None
    try:
        from testproject.shop import breaker_log
        from testproject.shop.models import Order

        with django_db_blocker.unblock():
            if Order._meta.db_table not in connection.introspection.table_names():
                with connection.schema_editor() as editor:
                    editor.create_model(Order)
                created = True
        yield Order
    finally:
        # leave nothing behind for other modules: the admin entry (its app label would be
        # unknown once the app is gone), the signal receivers and the table
        if Order is not None:
            if admin.site.is_registered(Order):
                admin.site.unregister(Order)
            breaker_log.disconnect()
        if created:
            with django_db_blocker.unblock(), connection.schema_editor() as editor:
                editor.delete_model(Order)
        overrides.disable()
        installed.disable()


@pytest.fixture
def shop(shop_app, clock, upstream, db):
    """Fresh per test: upstream counters and mode, transition log, ``payments`` breaker."""
    from testproject.shop import breaker_log, payments

    upstream.state.reset()
    upstream.state.set_mode("ok", hang_seconds=upstream_module.DEFAULT_HANG_SECONDS)
    importlib.reload(payments)
    breaker_log.reset()
    return payments
