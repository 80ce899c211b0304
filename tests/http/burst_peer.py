"""A fresh worker process for the first-use burst test (ST-2, ST-3): plain Python, no Django.

``python -m tests.http.burst_peer REDIS_URL PREFIX URL THREADS`` shares its breakers through a
real Redis store and mounts a per-host ``BreakerAdapter`` (``half_open_max_calls=2``). It
prints ``ready``, waits for a line on stdin, then sends one GET of URL from each of THREADS
threads at once (a start barrier) and prints one JSON line per request as it ends:
``{"status": int}``, ``{"refused": reason}`` or ``{"error": type name}``.
"""

from __future__ import annotations

import json
import sys
import threading

import requests

from baldur_django.contrib.requests import BreakerAdapter, CircuitOpenRequestError
from baldur_django.core.registry import registry
from baldur_django.core.stores.redis import RedisStore, connect


def main(store_url: str, prefix: str, url: str, threads: str) -> None:
    sys.setswitchinterval(1e-6)
    registry.set_store(RedisStore(connect(store_url, socket_timeout=2.0), prefix=prefix))
    session = requests.Session()
    session.mount("http://", BreakerAdapter(failure_threshold=1, recovery_timeout=30, half_open_max_calls=2))
    count = int(threads)
    barrier = threading.Barrier(count)
    out = threading.Lock()

    def request() -> None:
        barrier.wait()
        try:
            response = session.get(url, timeout=20)
        except CircuitOpenRequestError as refusal:
            line = {"refused": refusal.reason}
        except requests.RequestException as exc:
            line = {"error": type(exc).__name__}
        else:
            line = {"status": response.status_code}
        with out:
            print(json.dumps(line), flush=True)

    print("ready", flush=True)
    sys.stdin.readline()
    workers = [threading.Thread(target=request) for _ in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main(*sys.argv[1:5])
