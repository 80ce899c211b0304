"""The limiter's counting is atomic across real processes on the real Redis (IN-4)."""

from __future__ import annotations

import multiprocessing
import uuid

import pytest

from tests.conftest import need_server

from . import mp_worker

LOCATION = "redis://127.0.0.1:6379/15"

pytestmark = [pytest.mark.redis, pytest.mark.multiprocess]


@pytest.fixture
def redis15():
    """The real Redis, DB 15, and a key prefix of this test's own (``client.test_prefix``):
    other suites may use the server at the same time, so its keys, not the database, are
    deleted afterwards."""
    import redis

    client = redis.Redis.from_url(LOCATION, socket_timeout=2)
    try:
        client.ping()
        reachable, detail = True, ""
    except Exception as exc:  # connection refused, timeout
        reachable, detail = False, repr(exc)
    need_server("Redis at 127.0.0.1:6379", reachable, detail)
    client.test_prefix = f"rlmp-{uuid.uuid4().hex[:12]}"
    yield client
    for key in client.scan_iter(f"{client.test_prefix}:*"):
        client.delete(key)
    client.close()


def run_processes(rules, path, processes, attempts, prefix=""):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=mp_worker.hammer, args=(LOCATION, rules, path, attempts, barrier, results, prefix))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        outcomes = [results.get(timeout=120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
    errors = [o for o in outcomes if o[0] != "ok"]
    assert not errors, errors
    return sum(o[1] for o in outcomes), sum(o[2] for o in outcomes)


def test_in4_processes_sharing_redis_admit_exactly_the_rate(redis15):
    """IN-4: 4 processes x 75 attempts against a 100/h rule admit exactly 100; refusals leave no hits."""
    rules = [{"path": "/api/", "rate": "100/h", "key": "ip"}]
    admitted, refused = run_processes(rules, "/api/orders/", processes=4, attempts=75, prefix=redis15.test_prefix)
    assert (admitted, refused) == (100, 200)
    keys = [k for k in redis15.scan_iter(f"{redis15.test_prefix}:*") if b"baldur:rl:" in k]
    assert len(keys) == 1, keys
    assert int(redis15.get(keys[0])) == 100  # every refused hit was given back
    assert redis15.ttl(keys[0]) > 0  # counters expire
