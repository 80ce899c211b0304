"""Redis implementation of the store protocol: one Lua script per transition.

Each transition is a script in ``core/stores/lua/`` (with a shared prelude that reads the
record as :func:`~.base.decode` does and normalises it using Redis ``TIME``), registered once with ``register_script``
and called by SHA; redis-py reloads a script after a ``NOSCRIPT`` (a restarted server)
and retries once. Values are JSON. One breaker's keys share a hash tag
(``baldur:{<safe name>}:state``) so a Redis Cluster keeps them in one slot; the registry
is a sorted set of names scored by last-seen Redis time.

Every Redis error becomes :class:`StoreUnavailable` (the breaker falls back to local
judgement). ``redis`` is imported lazily, only here.

Redis Cluster (``connect(url, cluster=True)``, ``BALDUR_REDIS_CLUSTER``): every command
and script touches one key, or the keys of one breaker (one hash tag, one slot); the
pipelined load/force sends the transition and the registry touch, which live in different
slots, as a cluster pipeline (one command per node). redis-py's ``RedisCluster`` follows
``MOVED`` and ``ASK`` and waits out ``TRYAGAIN``; what it cannot resolve (a node down, a
slot not covered) is store trouble like any other.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, urlparse

from .base import Answer, StoreUnavailable, decode, safe_key

if TYPE_CHECKING:  # redis is imported lazily at run time
    from redis.commands.core import Script

__all__ = ["ClusterClient", "RedisStore", "connect", "decode_answer", "is_cluster", "store_errors"]

_SCRIPTS = ("load", "inspect", "trip", "acquire_probe", "finish_probe", "force", "release", "clear", "sweep")


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


def store_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean store trouble, matched by type, never by message.

    redis-py's errors (``RedisError``: connection, timeout, pool exhausted, cluster down),
    socket errors, and the cluster client's own ``RedisClusterException``, which is not a
    ``RedisError``: raised when no node answers (redis-py 8 raises its subclass
    ``RedisClusterUnreachableError`` then), a slot is not covered, or a command cannot be
    routed.

    Returns:
        A tuple of exception classes for an ``except`` clause.
    """
    import redis
    from redis.exceptions import RedisClusterException

    return (redis.RedisError, OSError, RedisClusterException)


def connect(url: str, socket_timeout: float = 0.25, max_connections: int = 50, *, cluster: bool = False) -> Any:
    """A redis-py client for *url* with short timeouts and no client-side retries.

    Opens no connection: the plain client connects on its first command, the cluster
    client (:class:`ClusterClient`) discovers the cluster on its first command.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL (a cluster: ``redis://`` or
            ``rediss://`` naming any one node, database 0).
        socket_timeout: connect and read timeout, seconds (per node on a cluster).
        max_connections: pool size (per node on a cluster); an exhausted pool is an
            error, not a wait.
        cluster: *url* names one node of a Redis Cluster (``BALDUR_REDIS_CLUSTER``).

    Returns:
        ``redis.Redis``, or a :class:`ClusterClient` when *cluster* is true.

    Raises:
        ConfigError: *cluster* with a ``unix://`` URL or a database other than 0.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    if cluster:
        return ClusterClient(url, socket_timeout=socket_timeout, max_connections=max_connections)
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        max_connections=max_connections,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (:class:`ClusterClient` or redis-py's ``RedisCluster``)."""
    if isinstance(client, ClusterClient):
        return True
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, RedisCluster)


class ClusterClient:
    """redis-py's ``RedisCluster`` for one node's URL, built on its first command.

    ``RedisCluster`` discovers the cluster (``CLUSTER SLOTS``) as soon as it is made; this
    wrapper defers that to the first command, so building a store never connects and a
    cluster that is down at startup is store trouble on the first call (the breaker falls
    back to local judgement) rather than an exception while Django starts. A failed
    discovery is tried again on the next command. Everything else is the cluster client's
    own: attribute access goes to it.

    Options: *socket_timeout* seconds for connect and read on every node, a pool of
    *max_connections* per node, cluster-level retries off (``Retry(NoBackoff(), 0)``: a
    node that does not answer is reported at once; the client refreshes its slot map for
    the next command). ``MOVED``, ``ASK`` and ``TRYAGAIN`` (resharding) are followed by the
    client within its bounded redirection budget (16 hops per command).

    Args:
        url: ``redis://`` or ``rediss://`` URL of any node, database 0.
        socket_timeout: seconds.
        max_connections: pool size per node.

    Raises:
        ConfigError: a ``unix://`` URL, or a database other than 0 (a cluster has only 0).
    """

    def __init__(self, url: str, *, socket_timeout: float = 0.25, max_connections: int = 50) -> None:
        from ..errors import ConfigError

        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss"):
            raise ConfigError(
                "BALDUR_REDIS_CLUSTER: a Redis Cluster is reached over TCP; BALDUR_REDIS_URL must be a redis:// "
                f"or rediss:// URL of one node, not a {parsed.scheme}:// URL"
            )
        db = (parse_qs(parsed.query).get("db") or [""])[0] or parsed.path.strip("/") or "0"
        if not db.isdigit() or int(db) != 0:
            raise ConfigError(
                f"BALDUR_REDIS_CLUSTER: a Redis Cluster has only database 0, but BALDUR_REDIS_URL names "
                f"database {db} (use redis://host:port/0 or no database)"
            )
        self.url = url
        self.socket_timeout = socket_timeout
        self.max_connections = max_connections
        self._client: Any = None
        self._lock = threading.Lock()

    def get_client(self) -> Any:
        """The ``RedisCluster``, discovering the cluster on the first call.

        Raises:
            redis.exceptions.RedisClusterException, redis.RedisError: no node answered
                (redis-py 8: ``RedisClusterUnreachableError``, a ``RedisClusterException``).
        """
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    from redis.backoff import NoBackoff
                    from redis.cluster import RedisCluster
                    from redis.retry import Retry

                    client = self._client = RedisCluster.from_url(
                        self.url,
                        socket_timeout=self.socket_timeout,
                        socket_connect_timeout=self.socket_timeout,
                        max_connections=self.max_connections,
                        retry=Retry(NoBackoff(), 0),
                        health_check_interval=0,
                    )
        return client

    def get_encoder(self) -> Any:
        """The encoder of the client (``register_script`` hashes scripts with it): redis-py's
        defaults, known without connecting."""
        import redis.connection

        module: Any = redis.connection  # Encoder is not in its typed exports
        return module.Encoder("utf-8", "strict", False)

    def register_script(self, script: str) -> Script:
        """A ``Script`` bound to this wrapper: its SHA is computed now, the cluster is reached
        on its first call; after a ``NOSCRIPT`` it is loaded on every master that answers
        (:meth:`script_load`) and run again."""
        from redis.commands.core import Script

        return Script(cast(Any, self), script)

    def script_load(self, script: str) -> str:
        """Load *script* on every master that answers and return its SHA. redis-py sends
        ``SCRIPT LOAD`` to every master at once and fails when one is down; a script is
        needed only on the masters holding the keys it runs on, and those answer (an
        operation on a dead master's keys fails on its own, as store trouble).

        Raises:
            redis.exceptions.ConnectionError / TimeoutError: no master answered.
        """
        from redis.exceptions import ConnectionError as Unreachable
        from redis.exceptions import TimeoutError as TimedOut

        client = self.get_client()
        sha: str | None = None
        failure: Exception | None = None
        for node in client.get_primaries():
            try:
                loaded = client.execute_command("SCRIPT LOAD", script, target_nodes=node)
                sha = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
            except (Unreachable, TimedOut) as exc:
                failure = exc
        if sha is None:
            raise failure if failure is not None else Unreachable("the cluster has no master")
        return sha

    def close(self) -> None:
        """Close the cluster client's connections, if it was ever built."""
        client = self._client
        if client is not None:
            client.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private and dunder names are never the cluster client's
            raise AttributeError(name)
        return getattr(self.get_client(), name)

    def __repr__(self) -> str:
        return f"<ClusterClient {self.url.split('@')[-1]!r} built={self._client is not None}>"


class RedisStore:
    """The store protocol on Redis.

    Args:
        client: a redis-py client (``connect(url)`` or ``django_redis.get_redis_connection``);
            typed ``Any``: redis-py's command annotations change between its versions and
            return unions of the sync and async shapes.
        prefix: key prefix (``"baldur"``).
        clock: for tests only: a function returning Unix seconds that the transition scripts
            use as "now" instead of Redis ``TIME`` (the differential test pins both sides of
            a comparison to one time this way). Leave it None in production: the scripts
            then read ``TIME``, the store's own clock that every host agrees on.
        record_ttl: seconds a CLOSED, unforced record lives after its last write or read by
            a worker (``BALDUR_REGISTRY_IDLE_SECONDS``), so the records of idle breakers
            expire; an OPEN, half-open or forced record never does. None or 0: never.
            The fleet jobs' reads (:meth:`inspect`, :meth:`sweep`) keep the time left.
    """

    backend = "redis"

    def __init__(
        self,
        client: Any,
        prefix: str = "baldur",
        *,
        clock: Callable[[], float] | None = None,
        record_ttl: float | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self.record_ttl = record_ttl
        reader = _read("_record")  # how a stored record is read, shared by the transitions and prune
        prelude = reader + "\n" + _read("_prelude")
        self._scripts = {name: client.register_script(prelude + "\n" + _read(name)) for name in _SCRIPTS}
        self._touch = client.register_script(_read("registry_touch"))
        self._unlock = client.register_script(_read("unlock"))
        self._extend = client.register_script(_read("extend"))
        self._prune = client.register_script(reader + "\n" + _read("prune"))
        self.registry_key = f"{prefix}:registry"

    def key(self, name: str) -> str:
        """The record key of breaker *name*; its ``{...}`` hash tag is the breaker's own."""
        return f"{self.prefix}:{{{safe_key(name)}}}:state"

    def _argv(self, args: tuple[Any, ...], frozen: bool, *, read: bool = False) -> list[Any]:
        """The ARGV of a transition script: the operation's arguments, then the idle lifetime
        of a record (ms, ``"~"`` first for a fleet job's read, ``""`` for none), the pinned
        clock (``""``: use Redis ``TIME``), and the Level 3 flag, always in the last
        three places."""
        argv = ["" if a is None else a for a in args]
        ttl = self.record_ttl
        argv.append(f"{'~' if read else ''}{max(1, int(ttl * 1000))}" if ttl and ttl > 0 else "")
        argv.append("" if self.clock is None else repr(float(self.clock())))
        argv.append("1" if frozen else "0")
        return argv

    def _run(self, op: str, name: str, *args: Any, frozen: bool, touch: bool = False, read: bool = False) -> Answer:
        argv = self._argv(args, frozen, read=read)
        try:
            if touch:
                raw = self._pipelined(self._scripts[op], name, argv)
            else:
                raw = self._scripts[op](keys=[self.key(name)], args=argv)
        except store_errors() as exc:
            raise StoreUnavailable(f"redis {op} failed: {type(exc).__name__}: {exc}") from exc
        return decode_answer(op, raw)

    def _pipelined(self, script: Script, name: str, argv: list[Any]) -> Any:
        """The transition and the registry touch in one round trip (EVALSHA twice, no
        SCRIPT EXISTS first); after a NOSCRIPT (a restarted server) load the scripts and
        retry once, only the commands that met it: a flush can land between the two, and
        a transition that already ran must not run again (its answer would be lost)."""
        from redis.exceptions import NoScriptError

        commands = [(script, (self.key(name), *argv)), (self._touch, (self.registry_key, name))]
        results: list[Any] = [None, None]
        pending = [0, 1]
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for i in pending:
                command, args = commands[i]
                # execute_command: a cluster pipeline refuses its evalsha() method, but routes
                # EVALSHA by its keys (each of these touches one key)
                pipe.execute_command("EVALSHA", command.sha, 1, *args)
            for i, result in zip(pending, pipe.execute(raise_on_error=False), strict=True):
                results[i] = result
            pending = [i for i in pending if isinstance(results[i], NoScriptError)]
            if not pending or attempt == 2:
                break
            for i in pending:
                self.client.script_load(commands[i][0].script)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results[0]

    def load(self, name: str, *, frozen: bool = False) -> Answer:
        return self._run("load", name, frozen=frozen, touch=True)

    def inspect(self, name: str, *, frozen: bool = False) -> Answer:
        return self._run("inspect", name, frozen=frozen, read=True)

    def trip(
        self,
        name: str,
        *,
        trigger: str,
        recovery_timeout: float,
        backoff_factor: float = 1.0,
        recovery_timeout_max: float = math.inf,
        frozen: bool = False,
    ) -> Answer:
        return self._run(
            "trip",
            name,
            trigger,
            repr(float(recovery_timeout)),
            repr(float(backoff_factor)),
            _cap(recovery_timeout_max),
            frozen=frozen,
        )

    def acquire_probe(
        self, name: str, *, token: str, max_calls: int, lease_seconds: float, frozen: bool = False
    ) -> Answer:
        return self._run("acquire_probe", name, token, int(max_calls), repr(float(lease_seconds)), frozen=frozen)

    def finish_probe(
        self,
        name: str,
        *,
        token: str,
        version: int,
        outcome: str,
        max_calls: int,
        recovery_timeout: float,
        backoff_factor: float = 1.0,
        recovery_timeout_max: float = math.inf,
        frozen: bool = False,
    ) -> Answer:
        return self._run(
            "finish_probe",
            name,
            token,
            int(version),
            outcome,
            int(max_calls),
            repr(float(recovery_timeout)),
            repr(float(backoff_factor)),
            _cap(recovery_timeout_max),
            frozen=frozen,
        )

    def force(
        self,
        name: str,
        *,
        mode: str,
        ttl_seconds: float,
        reason: str = "",
        actor: str | None = None,
        frozen: bool = False,
    ) -> Answer:
        # the actor travels as "" (None) or "=" + actor, so an empty actor stays "" as in the rules
        who = "" if actor is None else "=" + actor
        return self._run("force", name, mode, repr(float(ttl_seconds)), reason or "", who, frozen=frozen, touch=True)

    def release(self, name: str, *, frozen: bool = False) -> Answer:
        return self._run("release", name, frozen=frozen)

    def clear(self, name: str, *, frozen: bool = False) -> Answer:
        return self._run("clear", name, frozen=frozen, touch=True)

    def sweep(self, name: str, *, frozen: bool = False) -> Answer:
        return self._run("sweep", name, frozen=frozen, read=True)

    def names(self) -> dict[str, float]:
        """The registry: name -> last seen (Redis time). With *record_ttl*, the names whose
        record expired (idle) are removed from it first, so it stays as small as the records.
        """
        try:
            if self.record_ttl and self.record_ttl > 0:
                self._forget_expired()
            pairs = self.client.zrange(self.registry_key, 0, -1, withscores=True)
        except store_errors() as exc:
            raise StoreUnavailable(f"redis registry read failed: {exc}") from exc
        return {(n.decode("utf-8") if isinstance(n, bytes) else n): float(s) for n, s in pairs}

    def _forget_expired(self) -> None:
        """Remove from the registry the names unseen for longer than *record_ttl* whose record
        is gone: one read of the old names, one pipelined ``EXISTS`` per batch, one ``ZREM``.
        A name a worker registers again meanwhile comes back with its next read."""
        seconds, micros = self.client.time()
        horizon = float(seconds) + float(micros) / 1e6 - float(self.record_ttl or 0.0)
        old = self.client.zrangebyscore(self.registry_key, "-inf", f"({horizon}")
        for start in range(0, len(old), 1000):
            batch = [raw.decode("utf-8") if isinstance(raw, bytes) else raw for raw in old[start : start + 1000]]
            pipe = self.client.pipeline(transaction=False)
            for name in batch:
                pipe.exists(self.key(name))
            gone = [name for name, there in zip(batch, pipe.execute(), strict=True) if not there]
            if gone:
                self.client.zrem(self.registry_key, *gone)

    def prune(self, *, older_than: float) -> list[str]:
        try:
            stale = self.client.zrangebyscore(self.registry_key, "-inf", f"({older_than}")
            names = []
            for raw in stale:  # one breaker at a time: its keys share a slot, the registry's may not
                name = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                if self._prune(keys=[self.key(name)]):
                    self.client.zrem(self.registry_key, name)
                    names.append(name)
        except store_errors() as exc:
            raise StoreUnavailable(f"redis prune failed: {exc}") from exc
        return names

    def lock(self, name: str, *, ttl_seconds: float) -> str | None:
        token = uuid.uuid4().hex
        try:
            ok = self.client.set(
                f"{self.prefix}:lock:{{{safe_key(name)}}}", token, nx=True, px=max(1, int(ttl_seconds * 1000))
            )
        except store_errors() as exc:
            raise StoreUnavailable(f"redis lock failed: {exc}") from exc
        return token if ok else None

    def extend(self, name: str, *, token: str, ttl_seconds: float) -> bool:
        try:
            key = f"{self.prefix}:lock:{{{safe_key(name)}}}"
            return bool(self._extend(keys=[key], args=[token, max(1, int(ttl_seconds * 1000))]))
        except store_errors() as exc:
            raise StoreUnavailable(f"redis lock extend failed: {exc}") from exc

    def unlock(self, name: str, *, token: str) -> bool:
        try:
            return bool(self._unlock(keys=[f"{self.prefix}:lock:{{{safe_key(name)}}}"], args=[token]))
        except store_errors() as exc:
            raise StoreUnavailable(f"redis unlock failed: {exc}") from exc

    def reset(self, name: str) -> None:
        try:  # two commands: the registry's slot may not be the record's (Redis Cluster)
            self.client.delete(self.key(name))
            self.client.zrem(self.registry_key, name)
        except store_errors() as exc:
            raise StoreUnavailable(f"redis reset failed: {exc}") from exc

    # --- bulk reads for the fleet jobs (added by the perf work, new methods only:
    # the per-name methods above are unchanged, and core/maintenance.py falls back to them
    # for a store without these) ---
    def inspect_many(self, names: list[str], *, frozen: bool = False) -> list[Answer]:
        """:meth:`inspect` of every name in *names*, pipelined: one round trip per batch
        instead of one per breaker (for the fleet jobs over many breakers). Answers in the order of *names*.

        Raises:
            StoreUnavailable: the server failed the batch (no partial answer is returned).
        """
        return self._run_many("inspect", names, frozen=frozen)

    def sweep_many(self, names: list[str], *, frozen: bool = False) -> list[Answer]:
        """:meth:`sweep` of every name in *names*, pipelined (see :meth:`inspect_many`);
        ``answer.result`` is True for each record the sweep moved to HALF_OPEN.

        Raises:
            StoreUnavailable: the server failed the batch.
        """
        return self._run_many("sweep", names, frozen=frozen)

    def _run_many(self, op: str, names: list[str], *, frozen: bool) -> list[Answer]:
        from redis.exceptions import NoScriptError

        if not names:
            return []
        script = self._scripts[op]
        argv = self._argv((), frozen, read=True)
        raws: list[Any] = [None] * len(names)
        pending = list(range(len(names)))
        try:
            for attempt in (1, 2):
                pipe = self.client.pipeline(transaction=False)
                for i in pending:
                    pipe.execute_command("EVALSHA", script.sha, 1, self.key(names[i]), *argv)
                for i, raw in zip(pending, pipe.execute(raise_on_error=False), strict=True):
                    raws[i] = raw
                pending = [i for i in pending if isinstance(raws[i], NoScriptError)]
                if not pending or attempt == 2:
                    break
                self.client.script_load(script.script)  # a restarted server: load once, retry those
            for raw in raws:
                if isinstance(raw, Exception):
                    raise raw
        except store_errors() as exc:
            raise StoreUnavailable(f"redis {op} (batch of {len(names)}) failed: {type(exc).__name__}: {exc}") from exc
        return [decode_answer(op, raw) for raw in raws]


def decode_answer(op: str, raw: Any) -> Answer:
    """The :class:`Answer` of transition script *op* from the JSON text it returned.

    ``acquire_probe`` and ``sweep`` answer True/False; every other result is passed on.
    """
    data = json.loads(raw)
    lapsed = data.get("lapsed")
    result = data.get("result")
    return Answer(
        record=decode(data["record"]),
        now=float(data["now"]),
        result=bool(result) if op in ("acquire_probe", "sweep") else result,
        lapsed=lapsed if isinstance(lapsed, str) else None,
        moved=bool(data.get("moved")),
    )


def _cap(seconds: float) -> str:
    """A cap for the Lua scripts: ``""`` for no cap (they read it as ``math.huge``)."""
    return "" if math.isinf(seconds) else repr(float(seconds))
