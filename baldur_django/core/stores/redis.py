"""Redis implementation of the store protocol: one Lua script per transition (ST-2).

Each transition is a script in ``core/stores/lua/`` (with a shared prelude that
normalises the record using Redis ``TIME``), registered once with ``register_script``
and called by SHA; redis-py reloads a script after a ``NOSCRIPT`` (a restarted server)
and retries once. Values are JSON. One breaker's keys share a hash tag
(``baldur:{<safe name>}:state``) so a Redis Cluster keeps them in one slot; the registry
is a sorted set of names scored by last-seen Redis time.

Every Redis error becomes :class:`StoreUnavailable` (the breaker falls back to local
judgement, ST-4). ``redis`` is imported lazily, only here.
"""

from __future__ import annotations

import json
import math
import uuid
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..emergency import frozen
from .base import Answer, StoreUnavailable, decode, safe_key

if TYPE_CHECKING:  # redis is imported lazily at run time
    import redis
    from redis.commands.core import Script

__all__ = ["RedisStore", "connect"]

_SCRIPTS = ("load", "trip", "acquire_probe", "finish_probe", "force", "release", "sweep")


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


def connect(url: str, socket_timeout: float = 0.25, max_connections: int = 50) -> redis.Redis:
    """A redis-py client for *url* with short timeouts and no client-side retries (ST-4).

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL.
        socket_timeout: connect and read timeout, seconds.
        max_connections: pool size; an exhausted pool is an error, not a wait.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        max_connections=max_connections,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


class RedisStore:
    """The store protocol on Redis.

    Args:
        client: a redis-py client (``connect(url)`` or ``django_redis.get_redis_connection``);
            typed ``Any``: redis-py's command annotations change between its versions and
            return unions of the sync and async shapes.
        prefix: key prefix (``"baldur"``).
    """

    backend = "redis"

    def __init__(self, client: Any, prefix: str = "baldur") -> None:
        self.client = client
        self.prefix = prefix
        prelude = _read("_prelude")
        self._scripts = {name: client.register_script(prelude + "\n" + _read(name)) for name in _SCRIPTS}
        self._touch = client.register_script(_read("registry_touch"))
        self._unlock = client.register_script(_read("unlock"))
        self._extend = client.register_script(_read("extend"))
        self._prune = client.register_script(_read("prune"))
        self.registry_key = f"{prefix}:registry"

    def key(self, name: str) -> str:
        """The record key of breaker *name*; its ``{...}`` hash tag is the breaker's own (CB-12)."""
        return f"{self.prefix}:{{{safe_key(name)}}}:state"

    def _run(self, op: str, name: str, *args: Any, touch: bool = False) -> Answer:
        import redis

        argv = ["" if a is None else a for a in args]
        argv.append("1" if frozen() else "0")  # the last ARGV of every transition: Level 3 holds (EM-2)
        try:
            if touch:
                raw = self._pipelined(self._scripts[op], name, argv)
            else:
                raw = self._scripts[op](keys=[self.key(name)], args=argv)
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis {op} failed: {type(exc).__name__}: {exc}") from exc
        data = json.loads(raw)
        lapsed = data.get("lapsed")
        return Answer(
            record=decode(data["record"]),
            now=float(data["now"]),
            result=data.get("result"),
            lapsed=lapsed if isinstance(lapsed, str) else None,
            moved=bool(data.get("moved")),
        )

    def _pipelined(self, script: Script, name: str, argv: list[Any]) -> Any:
        """The transition and the registry touch in one round trip (EVALSHA twice, no
        SCRIPT EXISTS first); after a NOSCRIPT (a restarted server) load both and retry once."""
        from redis.exceptions import NoScriptError

        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, 1, self.key(name), *argv)
            pipe.evalsha(self._touch.sha, 1, self.registry_key, name)
            results = pipe.execute(raise_on_error=False)
            if attempt == 1 and any(isinstance(r, NoScriptError) for r in results):
                self.client.script_load(script.script)
                self.client.script_load(self._touch.script)
                continue
            for result in results:
                if isinstance(result, Exception):
                    raise result
            return results[0]
        raise AssertionError("unreachable")  # pragma: no cover

    def load(self, name: str) -> Answer:
        return self._run("load", name, touch=True)

    def inspect(self, name: str) -> Answer:
        return self._run("load", name)

    def trip(
        self, name: str, trigger: str, recovery_timeout: float, factor: float = 1.0, cap: float = math.inf
    ) -> Answer:
        return self._run("trip", name, trigger, repr(float(recovery_timeout)), repr(float(factor)), _cap(cap))

    def acquire_probe(self, name: str, token: str, max_calls: int, lease_seconds: float) -> Answer:
        answer = self._run("acquire_probe", name, token, int(max_calls), repr(float(lease_seconds)))
        answer.result = bool(answer.result)
        return answer

    def finish_probe(
        self,
        name: str,
        token: str,
        version: int,
        outcome: str,
        max_calls: int,
        recovery_timeout: float,
        factor: float = 1.0,
        cap: float = math.inf,
    ) -> Answer:
        return self._run(
            "finish_probe",
            name,
            token,
            int(version),
            outcome,
            int(max_calls),
            repr(float(recovery_timeout)),
            repr(float(factor)),
            _cap(cap),
        )

    def force(self, name: str, mode: str, ttl_seconds: float, reason: str, actor: str | None) -> Answer:
        return self._run("force", name, mode, repr(float(ttl_seconds)), reason or "", actor or "", touch=True)

    def release(self, name: str) -> Answer:
        return self._run("release", name)

    def sweep(self, name: str) -> Answer:
        answer = self._run("sweep", name)
        answer.result = bool(answer.result)
        return answer

    def names(self) -> dict[str, float]:
        import redis

        try:
            pairs = self.client.zrange(self.registry_key, 0, -1, withscores=True)
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis registry read failed: {exc}") from exc
        return {(n.decode("utf-8") if isinstance(n, bytes) else n): float(s) for n, s in pairs}

    def prune(self, older_than: float) -> list[str]:
        import redis

        try:
            stale = self.client.zrangebyscore(self.registry_key, "-inf", f"({older_than}")
            names = []
            for raw in stale:  # one breaker at a time: its keys share a slot, the registry's may not
                name = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                if self._prune(keys=[self.key(name)]):
                    self.client.zrem(self.registry_key, name)
                    names.append(name)
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis prune failed: {exc}") from exc
        return names

    def lock(self, name: str, ttl_seconds: float) -> str | None:
        import redis

        token = uuid.uuid4().hex
        try:
            ok = self.client.set(
                f"{self.prefix}:lock:{{{safe_key(name)}}}", token, nx=True, px=max(1, int(ttl_seconds * 1000))
            )
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis lock failed: {exc}") from exc
        return token if ok else None

    def extend(self, name: str, token: str, ttl_seconds: float) -> bool:
        import redis

        try:
            key = f"{self.prefix}:lock:{{{safe_key(name)}}}"
            return bool(self._extend(keys=[key], args=[token, max(1, int(ttl_seconds * 1000))]))
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis lock extend failed: {exc}") from exc

    def unlock(self, name: str, token: str) -> bool:
        import redis

        try:
            return bool(self._unlock(keys=[f"{self.prefix}:lock:{{{safe_key(name)}}}"], args=[token]))
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis unlock failed: {exc}") from exc

    def reset(self, name: str) -> None:
        import redis

        try:
            self.client.delete(self.key(name))
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis reset failed: {exc}") from exc


def _cap(seconds: float) -> str:
    """A cap for the Lua scripts: ``""`` for no cap (they read it as ``math.huge``)."""
    return "" if math.isinf(seconds) else repr(float(seconds))
