"""The Celery app a real worker runs in the ST-5 tests (``celery -A tests.stores.celery_app worker``).

Django is set up from ``tests.stores.celery_settings`` (``BALDUR_STATE_BACKEND="redis"``),
so ``BaldurDjangoConfig.ready()`` installs the Redis store built from settings, exactly as
in a deployment. The tests then re-key that store under a prefix of their own
(``BALDUR_TEST_STORE_PREFIX``) so concurrent test runs never share records or locks, and
wrap it in :class:`GatedStore`, whose ``names()`` can be held at a gate the test opens:
that is how two runs are made to overlap inside the task body. The tasks themselves are
``baldur_django.tasks`` unchanged.

Broker and result backend: ``BALDUR_TEST_BROKER_URL`` (Redis DB 10 by default).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.stores.celery_settings")

import django

django.setup()

from celery import Celery  # noqa: E402

import baldur_django.tasks  # noqa: E402,F401 - registers the shared tasks
from baldur_django.core.registry import registry  # noqa: E402
from baldur_django.core.stores.redis import RedisStore  # noqa: E402

BROKER_URL = os.environ.get("BALDUR_TEST_BROKER_URL", "redis://127.0.0.1:6379/10")

app = Celery("baldur_tests")
app.conf.update(
    broker_url=BROKER_URL,
    result_backend=BROKER_URL,
    result_expires=600,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


class GatedStore:
    """A store whose ``names()`` waits at a gate while the key ``<gate>:hold`` exists.

    Waiting, it pushes its PID to ``<gate>:inside`` and blocks on ``<gate>:release``
    (at most 20 s). Every other operation goes straight to the wrapped store.
    """

    def __init__(self, inner: RedisStore, gate: str) -> None:
        self.inner = inner
        self.gate = gate

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def names(self):
        client = self.inner.client
        if client.exists(f"{self.gate}:hold"):
            client.rpush(f"{self.gate}:inside", os.getpid())
            if client.blpop([f"{self.gate}:release"], timeout=20) is None:
                raise RuntimeError("the test never opened the gate")
        return self.inner.names()


_built = registry.store
if not isinstance(_built, RedisStore):  # the settings module did not take effect: fail loudly
    raise RuntimeError(f"expected ready() to install a RedisStore from settings, got {_built!r}")
_prefix = os.environ.get("BALDUR_TEST_STORE_PREFIX")
if _prefix:
    registry.set_store(GatedStore(RedisStore(_built.client, prefix=_prefix), gate=f"{_prefix}:gate"))
