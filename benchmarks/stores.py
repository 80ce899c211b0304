"""Shared-store benchmark: what a Redis-backed breaker costs per call.

``python -m benchmarks --stores [--quick]`` (or ``python -m benchmarks.stores``) measures,
in one process and on one real Redis server (``redis://127.0.0.1:6379/11`` unless
``--redis-url`` says otherwise), side by side:

* ``baldur memory``   - ``circuit_breaker`` with no shared store (the package default);
* ``baldur redis``    - the same decorator on a breaker attached to a ``RedisStore``
  (exactly what ``registry.set_store`` does to every breaker; default sync interval);
* ``pybreaker redis`` - ``pybreaker.CircuitBreaker`` with ``CircuitRedisStorage``.

Figures:

1. median overhead over a bare call of a successful CLOSED call and of a rejected OPEN
   call (interleaved rounds paired with the bare call, as in ``benchmarks.harness``).
   pybreaker's Redis storage makes round trips on every call, so each of its rounds runs
   ``1/pybreaker_scale`` of the calls and its elapsed time is scaled up: the per-call
   figure is the same average, measured on fewer calls;
2. store commands per call: the growth of ``INFO commandstats`` (every command the server
   ran, those inside Lua scripts included, minus the benchmark's own ``INFO``) over
   ``count_calls`` calls of each contender in turn, next to the exact count of commands
   the contender's own client sent. commandstats is server-wide: run this alone;
3. round trips per probe admission: client round trips around one ``acquire()`` that
   admits a HALF_OPEN probe (scripts already loaded, periodic consult out of the way).

Goals (printed PASS/MISS): fewer than 0.01 store commands per CLOSED call; a CLOSED call
on the Redis store within 1.5 x the memory store's overhead; one round trip per probe
admission. Results and method: ``docs/performance.md``, section "Shared stores".
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import baldur_django as baldur
from baldur_django.core.clock import SYSTEM_CLOCK
from baldur_django.core.events import bus
from baldur_django.core.registry import registry
from baldur_django.core.stores.redis import RedisStore
from baldur_django.core.sync import StoreGuard

from .cli import run_redis_bench
from .harness import Sample, interleave, loop_calls, loop_rejections

__all__ = [
    "StoresSettings",
    "STORES_DEFAULT",
    "STORES_QUICK",
    "StoresResult",
    "CommandCounter",
    "counting_client",
    "commandstats",
    "bench_stores",
    "evaluate_stores",
    "format_stores",
    "main",
]

BARE = "bare"
MEMORY = "baldur memory"
REDIS = "baldur redis"
PYBREAKER = "pybreaker redis"
CONTENDERS = (MEMORY, REDIS, PYBREAKER)
DEFAULT_URL = "redis://127.0.0.1:6379/11"
_OPEN_FOR_SECONDS = 3600


@dataclass(frozen=True)
class StoresSettings:
    """How much to measure.

    Attributes:
        rounds: interleaved rounds of the CLOSED and OPEN timings.
        calls: calls per contender per round (CLOSED); pybreaker runs ``calls // pybreaker_scale``.
        reject_calls: rejected calls per contender per round (OPEN).
        pybreaker_scale: how many times fewer calls pybreaker's Redis storage makes per round.
        count_calls: calls per contender for the commandstats count (100,000 by default).
        warmup: calls through every contender before measuring.
        redis_url: the server (and database) every contender uses.
        seed: seeds the per-round shuffle.
    """

    rounds: int = 41
    calls: int = 20_000
    reject_calls: int = 5_000
    pybreaker_scale: int = 40
    count_calls: int = 100_000
    warmup: int = 1_000
    redis_url: str = DEFAULT_URL
    seed: int = 1


STORES_DEFAULT = StoresSettings()
STORES_QUICK = StoresSettings(
    rounds=9, calls=5_000, reject_calls=1_000, pybreaker_scale=25, count_calls=20_000, warmup=500
)


# ------------------------------------------------------------------- counting
class CommandCounter:
    """Commands and round trips sent by the connections of one :func:`counting_client`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commands = 0
        self.round_trips = 0
        self.names: dict[str, int] = {}

    def add(self, names: list[str], trips: int = 0) -> None:
        with self._lock:
            self.commands += len(names)
            self.round_trips += trips
            for name in names:
                self.names[name] = self.names.get(name, 0) + 1

    def snapshot(self) -> tuple[int, int]:
        """(commands, round trips) so far."""
        with self._lock:
            return self.commands, self.round_trips


def _command_name(args: tuple) -> str:
    first = args[0]
    if isinstance(first, bytes):
        first = first.decode()
    return str(first).split(" ")[0].lower()


def counting_client(url: str, counter: CommandCounter, socket_timeout: float = 2.0, max_connections: int = 50) -> Any:
    """A redis-py client with ``connect()``'s options (no retries, no health checks) whose
    connections count every command and round trip they send into *counter*."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    class CountingConnection(redis.Connection):
        def send_command(self, *args: Any, **kwargs: Any) -> None:
            counter.add([_command_name(args)])
            return super().send_command(*args, **kwargs)

        def pack_commands(self, commands: Any) -> Any:
            commands = list(commands)
            counter.add([_command_name(c) for c in commands])
            return super().pack_commands(commands)

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counter.add([], trips=1)
            return super().send_packed_command(command, check_health)

    return redis.Redis.from_url(
        url,
        connection_class=CountingConnection,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        max_connections=max_connections,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def commandstats(client: Any) -> dict[str, int]:
    """``INFO commandstats`` as ``{command: calls}`` (server-wide, scripts' commands included)."""
    stats = client.info("commandstats")
    return {key[len("cmdstat_") :]: int(value["calls"]) for key, value in stats.items() if key.startswith("cmdstat_")}


def _grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {}
    for name, calls in after.items():
        grown = calls - before.get(name, 0) - (1 if name == "info" else 0)  # our own INFO
        if grown > 0:
            out[name] = grown
    return out


# --------------------------------------------------------------------- result
@dataclass
class CommandCount:
    """Commands for *calls* calls: ``server`` from commandstats, ``client`` sent by the contender."""

    calls: int
    server: dict[str, int]
    client_commands: int
    client_round_trips: int

    @property
    def server_per_call(self) -> float:
        return sum(self.server.values()) / self.calls

    @property
    def client_per_call(self) -> float:
        return self.client_commands / self.calls


@dataclass
class StoresResult:
    """Everything :func:`bench_stores` measured."""

    settings: StoresSettings
    bare_closed: float
    bare_open: float
    closed: dict[str, Sample]
    open: dict[str, Sample]
    commands_closed: dict[str, CommandCount]
    commands_open: dict[str, CommandCount]
    probe_round_trips: int
    probe_commands: dict[str, int]
    consult_round_trips: int
    consult_commands: dict[str, int]
    redis_version: str
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)
    prefix: str = ""  # the key prefix this run used (deleted at the end)


# ------------------------------------------------------------------ contenders
def _target() -> int:
    return 1


class _Down(Exception):
    """The failure used to trip the breakers."""


def _down() -> int:
    raise _Down("dependency down")


class _Contenders:
    """Builds the three contenders on one server under one key prefix; cleans up after."""

    def __init__(self, settings: StoresSettings) -> None:
        import pybreaker
        import redis

        self.pybreaker = pybreaker
        self.settings = settings
        self.run = uuid.uuid4().hex[:8]
        self.prefix = f"bench-stores-{self.run}"
        self.admin = redis.Redis.from_url(settings.redis_url, socket_timeout=5.0)
        self.admin.ping()
        self.baldur_counter = CommandCounter()
        self.store = RedisStore(counting_client(settings.redis_url, self.baldur_counter), prefix=self.prefix)
        self.guard = StoreGuard(self.store, lambda: 60.0, bus.publish, SYSTEM_CLOCK.monotonic, SYSTEM_CLOCK.wall)
        self.py_counter = CommandCounter()
        self.py_client = counting_client(settings.redis_url, self.py_counter)
        self.names: list[str] = []
        self.names_sent: dict[tuple[str, str], list[str]] = {}  # command kinds each contender's client sent

    def _name(self, kind: str) -> str:
        name = f"{self.prefix}.{kind}"
        self.names.append(name)
        return name

    def baldur_memory(self, kind: str, target: Callable[[], Any], **overrides: Any) -> Callable[[], Any]:
        return baldur.circuit_breaker(self._name(kind), **overrides)(target)

    def baldur_redis(self, kind: str, target: Callable[[], Any], **overrides: Any) -> Callable[[], Any]:
        name = self._name(kind)
        # attach before decorating, as registry.set_store() at start-up does
        breaker = registry.get(name, overrides or None)
        breaker.use_store(self.guard)
        return baldur.circuit_breaker(name, **overrides)(target)

    def pybreaker_redis(self, kind: str, target: Callable[[], Any], reset_timeout: float = 60) -> Callable[[], Any]:
        pybreaker = self.pybreaker
        storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, self.py_client, namespace=self._name(kind))
        return pybreaker.CircuitBreaker(fail_max=5, reset_timeout=reset_timeout, state_storage=storage)(target)

    def cleanup(self) -> None:
        for key in self.admin.scan_iter(f"{self.prefix}*"):  # baldur's keys and pybreaker's namespaces
            self.admin.delete(key)
        for name in self.names:
            registry._breakers.pop(name, None)
            registry._overrides.pop(name, None)


def _trip(func: Callable[[], Any], rejection: type[BaseException] | tuple) -> None:
    for _ in range(1_000):
        try:
            func()
        except rejection:
            return
        except _Down:
            continue
    raise RuntimeError(f"{func!r} never opened")


def _count(
    admin: Any,
    func: Callable[[], Any],
    counter: CommandCounter | None,
    calls: int,
    rejection: Any = None,
    sent: list[str] | None = None,
) -> CommandCount:
    if counter:
        counter.names.clear()
    before = commandstats(admin)
    c0, t0 = counter.snapshot() if counter else (0, 0)
    if rejection is None:
        loop_calls(func, calls)
    else:
        loop_rejections(func, calls, rejection)
    c1, t1 = counter.snapshot() if counter else (0, 0)
    server = _grown(before, commandstats(admin))
    if counter and sent is not None:
        sent.extend(name if name != "script" else "script|exists" for name in counter.names)
    return CommandCount(calls, server, c1 - c0, t1 - t0)


def _scaled(runner: Callable[[int], int], scale: int) -> Callable[[int], int]:
    """Run ``n // scale`` calls and report the elapsed time of *n* at that average pace."""

    def run(n: int) -> int:
        m = max(1, n // scale)
        return runner(m) * n // m

    return run


def _probe_admission(c: _Contenders) -> tuple[int, dict[str, int], int, dict[str, int]]:
    """Round trips of one probe admission and of one periodic consult, Redis store."""
    timeout = 0.2
    probe = c.baldur_redis("probe", _down, failure_threshold=1, recovery_timeout=timeout)
    breaker = probe.breaker
    pybreaker_errors = (baldur.CircuitOpenError, _Down)
    for _ in range(2):  # round 1 loads every script on the server; round 2 is measured
        _trip(probe, baldur.CircuitOpenError)
        time.sleep(timeout * 1.5)  # let the recovery timeout pass on both clocks
        breaker.sync()  # the periodic consult, out of the way (and measured below)
        c.baldur_counter.names.clear()
        _c0, t0 = c.baldur_counter.snapshot()
        permit = breaker.acquire()
        _c1, t1 = c.baldur_counter.snapshot()
        if not permit.trial:
            raise RuntimeError("the probe admission did not admit a trial")
        probe_names = dict(c.baldur_counter.names)
        breaker.record_failure(permit)  # back to OPEN for the next round
    try:
        probe()
    except pybreaker_errors:
        pass
    c.baldur_counter.names.clear()
    _s0, r0 = c.baldur_counter.snapshot()
    breaker.sync()
    _s1, r1 = c.baldur_counter.snapshot()
    return t1 - t0, probe_names, r1 - r0, dict(c.baldur_counter.names)


def bench_stores(
    settings: StoresSettings = STORES_DEFAULT, progress: Callable[[str], None] | None = None
) -> StoresResult:
    """Run every measurement of this module; see the module docstring.

    Raises:
        redis.ConnectionError: the server at ``settings.redis_url`` does not answer.
    """
    started = time.monotonic()
    say = progress or (lambda text: None)
    c = _Contenders(settings)
    try:
        version = str(c.admin.info("server").get("redis_version", "?"))
        say("CLOSED calls")
        closed = {
            MEMORY: c.baldur_memory("closed.memory", _target),
            REDIS: c.baldur_redis("closed.redis", _target),
            PYBREAKER: c.pybreaker_redis("closed.pybreaker", _target),
        }
        for func in closed.values():
            loop_calls(func, settings.warmup)
        if closed[REDIS].breaker.snapshot()["store_available"] is not True:  # type: ignore[attr-defined]
            raise RuntimeError("the Redis store did not answer during the warm-up")
        runners = {
            BARE: lambda n: loop_calls(_target, n),
            MEMORY: lambda n: loop_calls(closed[MEMORY], n),
            REDIS: lambda n: loop_calls(closed[REDIS], n),
            PYBREAKER: _scaled(lambda n: loop_calls(closed[PYBREAKER], n), settings.pybreaker_scale),
        }
        closed_samples = interleave(
            runners, baseline=BARE, rounds=settings.rounds, n=settings.calls, seed=settings.seed
        )

        say("OPEN rejections")
        pyerr = c.pybreaker.CircuitBreakerError
        rejections: dict[str, Any] = {MEMORY: baldur.CircuitOpenError, REDIS: baldur.CircuitOpenError, PYBREAKER: pyerr}
        opened = {
            MEMORY: c.baldur_memory("open.memory", _down, recovery_timeout=_OPEN_FOR_SECONDS),
            REDIS: c.baldur_redis("open.redis", _down, recovery_timeout=_OPEN_FOR_SECONDS),
            PYBREAKER: c.pybreaker_redis("open.pybreaker", _down, reset_timeout=_OPEN_FOR_SECONDS),
        }
        for name, func in opened.items():
            _trip(func, rejections[name])
        runners = {
            BARE: lambda n: loop_rejections(_target, n, _Down),
            MEMORY: lambda n: loop_rejections(opened[MEMORY], n, rejections[MEMORY]),
            REDIS: lambda n: loop_rejections(opened[REDIS], n, rejections[REDIS]),
            PYBREAKER: _scaled(lambda n: loop_rejections(opened[PYBREAKER], n, pyerr), settings.pybreaker_scale),
        }
        open_samples = interleave(
            runners, baseline=BARE, rounds=settings.rounds, n=settings.reject_calls, seed=settings.seed
        )
        record = c.store.inspect(opened[REDIS].breaker.name).record  # type: ignore[attr-defined]
        if record.state != "open":
            raise RuntimeError(f"the shared record left OPEN during the measurement: {record}")

        say(f"commandstats over {settings.count_calls:,} calls each")
        counters = {MEMORY: None, REDIS: c.baldur_counter, PYBREAKER: c.py_counter}
        commands_closed, commands_open = {}, {}
        for name in CONTENDERS:
            sent = c.names_sent.setdefault(("CLOSED", name), [])
            commands_closed[name] = _count(c.admin, closed[name], counters[name], settings.count_calls, sent=sent)
        for name in CONTENDERS:
            sent = c.names_sent.setdefault(("OPEN", name), [])
            commands_open[name] = _count(
                c.admin, opened[name], counters[name], settings.count_calls, rejections[name], sent
            )

        say("probe admission")
        probe_trips, probe_names, consult_trips, consult_names = _probe_admission(c)
    finally:
        c.cleanup()
    bare_closed = closed_samples.pop(BARE).median
    bare_open = open_samples.pop(BARE).median
    result = StoresResult(
        settings=settings,
        bare_closed=bare_closed,
        bare_open=bare_open,
        closed=closed_samples,
        open=open_samples,
        commands_closed=commands_closed,
        commands_open=commands_open,
        probe_round_trips=probe_trips,
        probe_commands=probe_names,
        consult_round_trips=consult_trips,
        consult_commands=consult_names,
        redis_version=version,
        prefix=c.prefix,
    )
    # commandstats is server-wide: flag command kinds a contender cannot have caused
    script_inside = {"time", "get", "set", "zadd", "del", "zrange", "zrangebyscore", "zrem"}
    for label, counts in (("CLOSED", commands_closed), ("OPEN", commands_open)):
        for name in CONTENDERS:
            own = set(c.names_sent.get((label, name), ()))
            allowed = (
                set()
                if name == MEMORY
                else own | {"script|exists", "script|load"} | (script_inside if name == REDIS else set())
            )
            foreign = {k: v for k, v in counts[name].server.items() if k not in allowed}
            if foreign:
                result.notes.append(
                    f"{label} {name}: commandstats also counted {foreign}, which this contender never sends: another "
                    "client used the server meanwhile, so its server-side figure is an upper bound"
                )
    result.elapsed = time.monotonic() - started
    return result


# ---------------------------------------------------------------------- goals
@dataclass(frozen=True)
class StoresVerdict:
    text: str
    value: str
    status: str


def evaluate_stores(result: StoresResult) -> list[StoresVerdict]:
    """PASS/MISS of the three shared-store goals."""
    per_call = result.commands_closed[REDIS].server_per_call
    memory = result.closed[MEMORY].overhead
    redis_ = result.closed[REDIS].overhead
    ratio = redis_ / memory if memory > 0 else None
    return [
        StoresVerdict(
            "store commands per CLOSED call < 0.01 (commandstats)",
            f"{per_call:.5f}",
            "PASS" if per_call < 0.01 else "MISS",
        ),
        StoresVerdict(
            "Redis-store CLOSED overhead <= 1.5 x memory store's",
            "n/a" if ratio is None else f"{ratio:.2f}x",
            "N/A" if ratio is None else ("PASS" if ratio <= 1.5 else "MISS"),
        ),
        StoresVerdict(
            "one round trip per probe admission",
            str(result.probe_round_trips),
            "PASS" if result.probe_round_trips == 1 else "MISS",
        ),
    ]


def _ns(value: float) -> str:
    return f"+{value:,.0f} ns" if value >= 0 else f"{value:,.0f} ns"


def format_stores(result: StoresResult) -> str:
    """The report as text: timings, command counts, probe admission, goal verdicts."""
    s = result.settings
    out = [
        f"Shared stores: Redis {result.redis_version} at {s.redis_url}; {s.rounds} rounds; "
        f"CLOSED {s.calls:,} / OPEN {s.reject_calls:,} calls a round (pybreaker 1/{s.pybreaker_scale} of that); "
        f"commandstats over {s.count_calls:,} calls",
        "",
        f"{'contender':<18}{'CLOSED call':>16}{'OPEN rejection':>18}{'cmds/CLOSED':>14}{'cmds/OPEN':>12}"
        f"{'client cmds/CLOSED':>20}",
    ]
    for name in CONTENDERS:
        cc, co = result.commands_closed[name], result.commands_open[name]
        client = "-" if name == MEMORY else f"{cc.client_per_call:.5f}"
        out.append(
            f"{name:<18}{_ns(result.closed[name].overhead):>16}{_ns(result.open[name].overhead):>18}"
            f"{cc.server_per_call:>14.5f}{co.server_per_call:>12.5f}{client:>20}"
        )
    out.append(f"{'bare call':<18}{result.bare_closed:>13,.0f} ns{result.bare_open:>15,.0f} ns")
    out += [
        "",
        "(CLOSED/OPEN: median ns over a bare call; cmds: INFO commandstats growth per call, commands run inside",
        " Lua scripts included; client cmds: commands the contender's own client sent, exact)",
        "",
        f"probe admission: {result.probe_round_trips} round trip(s), commands {result.probe_commands}",
        f"periodic consult (every BALDUR_CB_SYNC_INTERVAL_SECONDS): {result.consult_round_trips} round trip(s), "
        f"commands {result.consult_commands}",
        f"baldur redis, server side over {s.count_calls:,} CLOSED calls: {result.commands_closed[REDIS].server}",
        f"pybreaker redis, server side over {s.count_calls:,} CLOSED calls: {result.commands_closed[PYBREAKER].server}",
    ]
    for note in result.notes:
        out.append(f"NOTE: {note}")
    out += ["", "Goals:"]
    for verdict in evaluate_stores(result):
        out.append(f"  {verdict.status:<5} {verdict.text}: {verdict.value}")
    out.append(f"\n(measured in {result.elapsed:.1f} s)")
    return "\n".join(out)


def to_json(result: StoresResult) -> dict[str, Any]:
    """Every figure as plain data."""
    return {
        "settings": asdict(result.settings),
        "redis_version": result.redis_version,
        "bare_ns": {"closed": result.bare_closed, "open": result.bare_open},
        "overhead_ns": {
            "closed": {name: result.closed[name].overhead for name in CONTENDERS},
            "open": {name: result.open[name].overhead for name in CONTENDERS},
        },
        "commands_per_call": {
            "closed": {name: result.commands_closed[name].server_per_call for name in CONTENDERS},
            "open": {name: result.commands_open[name].server_per_call for name in CONTENDERS},
        },
        "client_commands_per_call_closed": {name: result.commands_closed[name].client_per_call for name in CONTENDERS},
        "probe_round_trips": result.probe_round_trips,
        "consult_round_trips": result.consult_round_trips,
        "goals": [asdict(v) for v in evaluate_stores(result)],
        "notes": result.notes,
    }


def main(argv: list[str] | None = None, *, quick: bool | None = None, json_file: str | None = None) -> int:
    """``python -m benchmarks.stores [--quick] [--redis-url URL] [--json FILE]``; returns the exit code."""
    return run_redis_bench(
        argv,
        prog="python -m benchmarks.stores",
        description="shared-store benchmark",
        default_url=DEFAULT_URL,
        settings=(STORES_DEFAULT, STORES_QUICK),
        bench=bench_stores,
        render=format_stores,
        as_json=to_json,
        quick=quick,
        json_file=json_file,
        quiet=("baldur", "pybreaker"),  # the OPEN scenario trips on purpose
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
