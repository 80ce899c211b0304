"""A second process for the EM-1 tests: reads or sets the emergency level with the core only.

Run as ``python -m tests.emergency.peer BACKEND`` where BACKEND is ``file`` (the file the
environment's ``BALDUR_EMERGENCY_STATE_FILE`` names) or ``redis:<url>|<prefix>``. The cache
length comes from ``BALDUR_EMERGENCY_CACHE_SECONDS`` in the environment. It prints one JSON
line when ready, then answers one JSON line per command read from stdin:

* ``{"op": "read"}`` -> ``{"level": n}`` (through the cache)
* ``{"op": "wait", "level": n, "timeout": s}`` -> ``{"first": <level read at once>, "level":
  <last level>, "reads": <backend reads it took>}``: polls until the level is *n* or the
  deadline passes (waiting on another process, never ordering threads)
* ``{"op": "set", "level": n, "minutes": m}`` -> ``{"level": n}``
* ``{"op": "quit"}``
"""

from __future__ import annotations

import json
import sys
import time

from baldur_django.core import emergency


class Counting:
    """Counts the backend reads (I/O) the cache lets through."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.reads = 0

    def read(self):
        self.reads += 1
        return self.inner.read()

    def update(self, change):
        return self.inner.update(change)


def main() -> None:
    spec = sys.argv[1]
    if spec == "file":
        inner = emergency.FileLevelBackend(emergency.mode.source.get("BALDUR_EMERGENCY_STATE_FILE"))
    else:
        from baldur_django.core.stores.redis import connect

        url, prefix = spec[len("redis:") :].split("|")
        inner = emergency.RedisLevelBackend(connect(url, socket_timeout=2.0), prefix=prefix)
    backend = Counting(inner)
    emergency.use_backend(backend)
    print(
        json.dumps({"ready": True, "level": emergency.current_level(), "django": "django" in sys.modules}), flush=True
    )
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "quit":
            break
        if op == "read":
            answer = {"level": emergency.current_level()}
        elif op == "wait":
            before = backend.reads
            first = emergency.current_level()
            deadline = time.monotonic() + command.get("timeout", 10.0)
            level = first
            while level != command["level"] and time.monotonic() < deadline:
                time.sleep(0.01)  # polling another process's write, with a deadline
                level = emergency.current_level()
            answer = {"first": first, "level": level, "reads": backend.reads - before}
        elif op == "set":
            emergency.set_level(command["level"], minutes=command.get("minutes"), actor="peer")
            answer = {"level": emergency.current_level()}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
