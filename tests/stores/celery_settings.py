"""Django settings of the Celery worker the ST-5 tests start (tests/stores/test_celery_worker.py).

The test suite's settings plus the Redis store on DB 11 of the local server; the worker
process points ``DJANGO_SETTINGS_MODULE`` here.
"""

import os

from tests.settings import *  # noqa: F403

BALDUR_STATE_BACKEND = "redis"
BALDUR_REDIS_URL = os.environ.get("BALDUR_TEST_STORE_URL", "redis://127.0.0.1:6379/11")
BALDUR_REDIS_SOCKET_TIMEOUT = 2.0
