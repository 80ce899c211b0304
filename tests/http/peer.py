"""A worker process for the shared-store test (HC-1, ST-2): plain Python, no Django.

``python -m tests.http.peer REDIS_URL PREFIX`` shares its breakers through a real Redis
store; for each URL read from stdin (one a line) it sends one GET through a per-host
``BreakerAdapter`` (one failure opens the breaker) and prints one JSON line:
``{"status": int}`` or ``{"refused": reason, "service": name}``. It prints ``ready`` first.
"""

from __future__ import annotations

import json
import sys

import requests

from baldur_django.contrib.requests import BreakerAdapter, CircuitOpenRequestError
from baldur_django.core.registry import registry
from baldur_django.core.stores.redis import RedisStore, connect


def main(store_url: str, prefix: str) -> None:
    registry.set_store(RedisStore(connect(store_url, socket_timeout=2.0), prefix=prefix))
    session = requests.Session()
    session.mount("http://", BreakerAdapter(failure_threshold=1, recovery_timeout=60))
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            response = session.get(line.strip(), timeout=2)
        except CircuitOpenRequestError as refusal:
            print(json.dumps({"refused": refusal.reason, "service": refusal.service}), flush=True)
        else:
            print(json.dumps({"status": response.status_code}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
