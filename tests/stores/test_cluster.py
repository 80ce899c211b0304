"""ST-2/ST-4 on a real Redis Cluster: three local masters, one per session (tests/redis_cluster.py).

The store contract runs on the cluster as the ``cluster`` param of tests/stores/test_contract.py
and the limiter's script in tests/inbound/test_ratelimit_cluster.py. Here:

* one breaker's keys share a slot (the hash tag is the breaker's safe key), and the pipelined
  transition + registry touch spans two masters, reloading scripts after ``SCRIPT FLUSH``;
* the fleet jobs' owner-token locks (lock, extend, unlock) and the Emergency Mode backend,
  whose concurrent read-modify-writes lose nothing;
* Django: ``BALDUR_REDIS_CLUSTER`` builds cluster clients (no connection at build time),
  the system checks E070 / E071;
* ST-4: a cluster unreachable at start, and a master killed and restarted while breakers
  run: store trouble, local judgement, recovery;
* the fleet's half-open budget with real processes on the cluster;
* resharding under load: the slot of a breaker's record moves to another master while
  threads call through the breaker; the client meets ASK and MOVED (counted by the
  servers), no caller sees an exception, no store call fails, the record is intact.

Budget: this file about 9 s, the cluster start (about 2 s) included; every test named
"cluster" (`-k cluster`: this file, the contract and other `backend` tests on the cluster,
the limiter) about 13 s of test time in all, 20 s on a machine busy with other suites.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import uuid

import pytest
import redis
from django.test import override_settings
from redis.exceptions import RedisClusterException

import baldur_django as baldur
from baldur_django.backends import STORE_SETTINGS, build_store, redis_client
from baldur_django.checks import Codes, check_settings
from baldur_django.core import emergency, maintenance
from baldur_django.core.config import settings as baldur_settings
from baldur_django.core.errors import CircuitOpenError, ConfigError
from baldur_django.core.stores.base import StoreUnavailable, safe_key
from baldur_django.core.stores.redis import ClusterClient, RedisStore, connect, is_cluster, store_errors
from tests.redis_cluster import cluster_port
from tests.stores.redis_tools import wait_for
from tests.stores.test_fleet import dep, half_open_budget_rounds, shared_store, spawn  # noqa: F401 - fixtures

pytestmark = [pytest.mark.timeout(120)]

LOGGER = "baldur.circuit_breaker"


class DependencyDown(Exception):
    """The protected dependency's own failure."""


def lines(caplog, event):
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def name_on(store, cluster, want_owner, stem, avoid=None):
    """A breaker name whose record lives on the master *want_owner* (a port) and, with
    *avoid*, not on that port; searched among ``<stem>-0``, ``<stem>-1``, ..."""
    for i in range(500):
        name = f"{stem}-{i}"
        owner = cluster.owner(cluster.keyslot(store.key(name)))
        if (want_owner is None or owner == want_owner) and owner != avoid:
            return name
    raise AssertionError("no such name")


# ----------------------------------------------------------------------------- hash tags
def test_st2_cluster_keys_of_one_breaker_share_one_slot(redis_cluster, cluster_client):
    """ST-2/CB-12: a record key's hash tag is the breaker's whole safe key, whatever braces the
    name holds, so everything about one breaker is one slot; different breakers spread over
    the slots; the emergency key has a tag of its own; every store call works (no CROSSSLOT)."""
    store = RedisStore(cluster_client, prefix=cluster_client.test_prefix)
    names = ["payments", "{payments}", "a{b}c", "}{", "{}", "ünï cødé", "n" * 300]
    slots = {}
    for name in names:
        key = store.key(name)
        assert key.count("{") == 1 and key.count("}") == 1, key
        slots[name] = redis_cluster.keyslot(key)
        assert slots[name] == redis_cluster.keyslot(safe_key(name))
        assert store.load(name).record.state == "closed"
        assert store.trip(name, trigger="consecutive_failures", recovery_timeout=30.0).result == "tripped"
    assert len(set(slots.values())) == len(names)
    assert len({redis_cluster.owner(slot) for slot in slots.values()}) > 1  # several masters hold breakers
    assert set(store.names()) == set(names)
    level_key = emergency.RedisLevelBackend(cluster_client).key
    assert redis_cluster.keyslot(level_key) == redis_cluster.keyslot("emergency")


def test_st4_cluster_transition_and_registry_touch_on_two_masters_reload_scripts(redis_cluster, cluster_client):
    """ST-2/ST-4: load and force pipeline the transition and the registry touch, whose keys live
    on two different masters; after SCRIPT FLUSH everywhere (a restarted node) each node answers
    NOSCRIPT once per script it lacks, the scripts are loaded and the calls succeed silently."""
    store = RedisStore(cluster_client, prefix=cluster_client.test_prefix)
    registry_owner = redis_cluster.owner(redis_cluster.keyslot(store.registry_key))
    name = name_on(store, redis_cluster, None, "two-masters", avoid=registry_owner)
    record_owner = redis_cluster.owner(redis_cluster.keyslot(store.key(name)))
    for port in redis_cluster.ports:
        with redis_cluster.node(port) as node:
            node.script_flush()
    before = {port: redis_cluster.error_count(port, "NOSCRIPT") for port in (record_owner, registry_owner)}
    assert store.load(name).record.version == 0
    assert store.force(name, mode="open", ttl_seconds=60.0, reason="drill", actor="ops").record.forced == "open"
    assert name in store.names()
    after = {port: redis_cluster.error_count(port, "NOSCRIPT") for port in (record_owner, registry_owner)}
    # one NOSCRIPT per script and node, then loaded everywhere: the record's master lacked the load
    # and the force scripts, the registry's master the touch script (once, for both calls)
    assert after == {record_owner: before[record_owner] + 2, registry_owner: before[registry_owner] + 1}
    assert store.inspect(name).record.force_reason == "drill"


# ------------------------------------------------------------------------------ fleet jobs
def test_st5_cluster_fleet_jobs_lock_extend_and_unlock(redis_cluster, cluster_client, fresh_registry, clock):
    """ST-5: on the cluster a fleet job runs once under its owner-token lock: a held lock makes a
    run skip; a run sweeps breakers spread over several masters, renews its lock (owner only)
    past half its lifetime, and releases it at the end."""
    store = RedisStore(cluster_client, prefix=cluster_client.test_prefix)
    fresh_registry.set_store(store)
    names = [f"sweep-{i}" for i in range(6)]
    for name in names:
        store.load(name)
        store.trip(name, trigger="consecutive_failures", recovery_timeout=0.001)
    assert len({redis_cluster.owner(redis_cluster.keyslot(store.key(n))) for n in names}) > 1
    wait_for(lambda: store.inspect(names[-1]).now > store.inspect(names[-1]).record.open_until, what="timeouts")

    held = store.lock("task:recovery_sweep", ttl_seconds=30.0)
    assert maintenance.recovery_sweep().skipped == "locked"
    assert store.unlock("task:recovery_sweep", token=held) is True
    report = maintenance.recovery_sweep()
    assert report.skipped is None and sorted(report.moved) == sorted(names)
    assert all(store.inspect(n).record.state == "half_open" for n in names)

    def body(store, report, lock):
        clock.advance(20.0)  # past half the 30 s lifetime: ensure() must renew, as the owner
        lock.ensure()
        assert store.extend(lock.name, token="not-the-owner", ttl_seconds=30.0) is False
        assert store.lock(lock.name, ttl_seconds=30.0) is None
        report.breakers = 1

    report = maintenance.run_locked("cluster_drill", 30.0, body)
    assert report.skipped is None and report.breakers == 1
    token = store.lock("task:cluster_drill", ttl_seconds=30.0)  # released by the run
    assert token and store.unlock("task:cluster_drill", token=token)


# ----------------------------------------------------------------------- emergency mode
def test_em1_cluster_emergency_level_backend_concurrent_writers_lose_nothing(redis_cluster, cluster_client):
    """EM-1 on the cluster: a level set through one client is read through another; 4 threads
    with clients of their own do 25 read-modify-writes each on the shared record, all at
    once: the compare-and-set keeps every one (100)."""
    prefix = cluster_client.test_prefix
    emergency.use_backend(emergency.RedisLevelBackend(cluster_client, prefix=prefix))
    emergency.set_level(2, minutes=5, reason="cluster drill", actor="ops")
    reader_client = connect(redis_cluster.url, socket_timeout=2.0, cluster=True)
    reader = emergency.RedisLevelBackend(reader_client, prefix=prefix)
    state = reader.read()
    assert (state.level, state.reason, state.actor) == (2, "cluster drill", "ops")

    def bump(current):
        return dataclasses.replace(current, check_streak=current.check_streak + 1)

    barrier = threading.Barrier(4)
    failures = []

    def writer():
        client = connect(redis_cluster.url, socket_timeout=2.0, cluster=True)
        backend = emergency.RedisLevelBackend(client, prefix=prefix)
        try:
            barrier.wait()
            for _ in range(25):
                backend.update(bump)
        except Exception as exc:
            failures.append(exc)
        finally:
            client.close()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=writer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
    final = reader.read()
    assert final.check_streak == 100 and final.level == 2
    reader_client.close()


# ---------------------------------------------------------------------- Django settings
def test_st2_cluster_setting_builds_cluster_clients_without_connecting(redis_cluster):
    """ST-2: with BALDUR_REDIS_CLUSTER the store, Emergency Mode's redis backend and
    redis_client() get cluster clients for BALDUR_REDIS_URL, built without a connection; a
    force through the installed store is what a separate cluster client reads; the knob is a
    store setting (changing it rebuilds the store)."""
    assert "BALDUR_REDIS_CLUSTER" in STORE_SETTINGS
    with override_settings(
        BALDUR_STATE_BACKEND="redis",
        BALDUR_REDIS_URL=redis_cluster.url,
        BALDUR_REDIS_CLUSTER=True,
        BALDUR_REDIS_SOCKET_TIMEOUT=0.4,
        BALDUR_REDIS_MAX_CONNECTIONS=7,
    ):
        store = build_store()
        assert isinstance(store.client, ClusterClient) and store.client._client is None  # nothing opened yet
        assert is_cluster(redis_client())
        name = f"django-{uuid.uuid4().hex[:8]}"
        store.force(name, mode="open", ttl_seconds=60.0, reason="via settings", actor="ops")
        nodes = store.client.get_nodes()
        assert len(nodes) == 3 and store.client.retry.get_retries() == 0  # no retries but redirections
        for node in nodes:  # the package's timeouts and pool size, on every node
            pool = node.redis_connection.connection_pool
            kwargs = pool.connection_kwargs
            assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], pool.max_connections) == (0.4, 0.4, 7)
        other = RedisStore(connect(redis_cluster.url, cluster=True))
        assert other.inspect(name).record.forced == "open"
        with override_settings(BALDUR_EMERGENCY_BACKEND="redis"):
            emergency.reset()
            try:
                backend = emergency.mode.backend()
                assert backend.name == "redis" and is_cluster(backend.client)
                emergency.set_level(1, minutes=1, reason="cluster", actor="ops")
                assert emergency.RedisLevelBackend(other.client).read().level == 1
                emergency.set_level(0)
            finally:
                emergency.reset()
    with override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_URL=redis_cluster.url):
        assert not is_cluster(build_store().client)  # the knob off: a plain client


def test_st2_cluster_from_environment_variables_without_django(redis_cluster):
    """ST-2 in plain Python: BALDUR_REDIS_CLUSTER from the environment gives the registry's
    store and Emergency Mode's redis backend cluster clients (nothing connected at build)."""
    from baldur_django.core.config import SettingsSource
    from baldur_django.core.registry import Registry

    environ = {
        "BALDUR_STATE_BACKEND": "redis",
        "BALDUR_REDIS_URL": redis_cluster.url,
        "BALDUR_REDIS_CLUSTER": "true",
        "BALDUR_EMERGENCY_BACKEND": "redis",
    }
    source = SettingsSource(environ=environ)
    registry = Registry(source=source)
    registry._store_from_settings()
    assert isinstance(registry.store.client, ClusterClient) and registry.store.client._client is None
    assert registry.store.load("plain").record.state == "closed"
    mode = emergency.EmergencyMode(source=source)
    emergency.set_redis_client_factory(None)  # plain Python: no Django client factory
    try:
        backend = mode.backend()
        assert isinstance(backend.client, ClusterClient) and backend.read().level in (0, 1, 2, 3)
    finally:
        import baldur_django.emergency  # the Django factory back (installed on import)

        emergency.set_redis_client_factory(baldur_django.emergency._django_redis_client)
    registry.store.client.close()


def test_st2_cluster_client_carries_classic_pubsub(redis_cluster):
    """ST-2 (pub/sub on a cluster, for EM-6): a subscriber on one cluster client receives what
    another cluster client publishes, and so does a plain client subscribed on every single
    node: classic pub/sub crosses the cluster bus, so one node's URL is enough for it."""
    channel = f"baldur:test:{uuid.uuid4().hex[:8]}"
    publisher = connect(redis_cluster.url, cluster=True)
    subscriber = connect(redis_cluster.url, socket_timeout=2.0, cluster=True)
    plain = [redis_cluster.node(port) for port in redis_cluster.ports]
    subscriptions = [subscriber.pubsub()] + [node.pubsub() for node in plain]
    try:
        for pubsub in subscriptions:
            pubsub.subscribe(channel)

        def next_of(pubsub, kind):
            message = pubsub.get_message(timeout=0.1)
            return message if message and message["type"] == kind else None

        for pubsub in subscriptions:
            wait_for(lambda pubsub=pubsub: next_of(pubsub, "subscribe"), 5, "the subscription")
        assert publisher.publish(channel, "opened") >= 1
        for pubsub in subscriptions:
            message = wait_for(lambda pubsub=pubsub: next_of(pubsub, "message"), 5, "the message")
            assert message["data"] == b"opened"
    finally:
        for pubsub in subscriptions:
            pubsub.close()
        for client in [publisher, subscriber, *plain]:
            client.close()


def test_cfg3_cluster_without_url_or_with_a_bad_url_is_refused():
    """CFG-3/ST-2: BALDUR_REDIS_CLUSTER without BALDUR_REDIS_URL is check error E070 and a
    ConfigError when a client is built (a django-redis alias is no cluster client); a socket
    URL or a database other than 0 is E071 and a ConfigError naming the problem."""
    with override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_CLUSTER=True, BALDUR_REDIS_URL=None):
        ids = [m.id for m in check_settings()]
        assert ids == [Codes.REDIS_CLUSTER_WITHOUT_URL] == ["baldur.E070"]
        with pytest.raises(ConfigError, match="BALDUR_REDIS_CLUSTER=True needs BALDUR_REDIS_URL"):
            build_store()
    for url, why in (("redis://u:secret@10.0.0.5:6379/3", "only database 0"), ("unix:///tmp/r.sock", "unix://")):
        with override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_CLUSTER=True, BALDUR_REDIS_URL=url):
            (message,) = check_settings()
            assert message.id == Codes.REDIS_CLUSTER_BAD_URL == "baldur.E071" and why in message.msg
            assert "secret" not in message.msg + message.hint
            with pytest.raises(ConfigError, match=why.replace("/", "")):
                build_store()
    with override_settings(BALDUR_REDIS_CLUSTER=True, BALDUR_REDIS_URL="redis://10.0.0.5:6379"):
        assert check_settings() == []  # no database in the URL is database 0


# ------------------------------------------------------------------------ store trouble
def test_st4_cluster_unreachable_at_start_is_store_trouble(fresh_registry, caplog):
    """ST-4: a cluster that does not answer at all: the store builds (no connection), every
    store call is StoreUnavailable (never a cluster exception), and a breaker on it judges
    locally: failures trip it, callers see only their own errors and CircuitOpenError."""
    client = connect(f"redis://127.0.0.1:{cluster_port([])}/0", socket_timeout=0.2, cluster=True)
    store = RedisStore(client, prefix="nowhere")
    with pytest.raises(StoreUnavailable) as unreachable:
        store.load("x")
    # by type, not by message: redis-py 8 raises RedisClusterUnreachableError here, a
    # RedisClusterException; older ones a RedisClusterException or a ConnectionError
    assert isinstance(unreachable.value.__cause__, (RedisClusterException, redis.ConnectionError))
    fresh_registry.set_store(store)

    @baldur.circuit_breaker("cluster-unreachable", failure_threshold=2, recovery_timeout=600)
    def dependency(ok=True):
        if not ok:
            raise DependencyDown()
        return "ok"

    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert dependency() == "ok"
        for _ in range(2):
            with pytest.raises(DependencyDown):
                dependency(ok=False)
        with pytest.raises(CircuitOpenError):
            dependency()
    assert fresh_registry.guard.failures >= 2
    assert len(lines(caplog, "circuit_breaker.store_unavailable")) == 1


#: redis-py exceptions that are not about the store being unreachable or unusable
_NOT_STORE_TROUBLE = {"ChildDeadlockedError", "IncorrectPolicyType"}


def _redis_py_errors() -> list[type[BaseException]]:
    import inspect

    import redis.exceptions

    return [
        klass
        for name, klass in inspect.getmembers(redis.exceptions, inspect.isclass)
        if issubclass(klass, BaseException)
        and klass.__module__ == "redis.exceptions"
        and name not in _NOT_STORE_TROUBLE
    ]


def test_st4_every_redis_py_error_type_is_store_trouble():
    """ST-4: the store catches redis-py's errors by type. Every exception class redis-py
    defines (redis-py 8's RedisClusterUnreachableError, MaxConnectionsError and the rest,
    and the older ones) is one of store_errors(), so a new release that adds a root class
    of its own fails here rather than reaching a caller."""
    errors = _redis_py_errors()
    assert redis.exceptions.RedisClusterException in errors and redis.exceptions.ConnectionError in errors
    assert [klass.__name__ for klass in errors if not issubclass(klass, store_errors())] == []


@pytest.mark.parametrize(
    "name", ["RedisClusterUnreachableError", "SlotNotCoveredError", "MaxConnectionsError", "ClusterDownError"]
)
def test_st4_redis_py_cluster_and_pool_errors_become_store_unavailable(name):
    """ST-4: a script call that meets one of these redis-py errors (some only in redis-py 8)
    is StoreUnavailable with the redis-py error as its cause, whatever its message."""
    import redis.exceptions

    klass = getattr(redis.exceptions, name, None)
    if klass is None:
        pytest.skip(f"redis-py {redis.__version__} has no {name}")

    class Failing:
        def register_script(self, script):
            def run(*args, **kwargs):
                raise klass("no words the store could match")

            return run

    with pytest.raises(StoreUnavailable) as caught:
        RedisStore(Failing(), prefix="failing").inspect("x")
    assert type(caught.value.__cause__) is klass


def test_st4_cluster_master_killed_then_back(redis_cluster, cluster_client, fresh_registry, caplog):
    """ST-4: a master SIGKILLed while breakers run: the breaker whose record lived there falls
    back to local judgement (trips locally, callers see no store error) while a breaker on
    another master keeps sharing; when the master is back (empty, no persistence) the
    breaker logs store_recovered and pushes the trip it made meanwhile."""
    store = RedisStore(cluster_client, prefix=cluster_client.test_prefix)
    fresh_registry.set_store(store)
    victim = redis_cluster.ports[-1]
    dead_name = name_on(store, redis_cluster, victim, "victim")
    alive_name = name_on(store, redis_cluster, None, "survivor", avoid=victim)
    seen = []

    def protected(name):
        @baldur.circuit_breaker(name, failure_threshold=2, recovery_timeout=600)
        def call(ok=True):
            seen.append(name)
            if not ok:
                raise DependencyDown()
            return "ok"

        return call

    dead, alive = protected(dead_name), protected(alive_name)
    assert dead() == "ok" and alive() == "ok"  # first use: both records adopted from the cluster
    with caplog.at_level(logging.INFO, logger=LOGGER):
        redis_cluster.kill(victim)
        try:
            for call in (dead, alive):
                for _ in range(2):
                    with pytest.raises(DependencyDown):
                        call(ok=False)
                with pytest.raises(CircuitOpenError):
                    call()
            assert store.inspect(alive_name).record.state == "open"  # shared as usual
            with pytest.raises(StoreUnavailable):
                store.inspect(dead_name)
            assert fresh_registry.guard.failures >= 1
            assert lines(caplog, "circuit_breaker.store_unavailable")
        finally:
            redis_cluster.restart(victim)

        def pushed():
            dead.breaker.sync()  # a consult: the store answers again, the local trip is pushed
            try:
                return store.inspect(dead_name).record.state == "open"
            except StoreUnavailable:
                return False  # the client's first call to the restarted node reconnects

        wait_for(pushed, 10, "the local trip to reach the restarted master")
        assert lines(caplog, "circuit_breaker.store_recovered")
    assert dead.breaker.state.value == "open" and alive.breaker.state.value == "open"


def test_st4_cluster_master_down_scripts_load_on_the_live_masters(
    redis_cluster, cluster_client, fresh_registry, monkeypatch
):
    """ST-4 (seen in a tox run): a master is unreachable and a live master has lost its
    scripts (a restart, a failover, a SCRIPT FLUSH): the next operation on a record of the
    live master gets NOSCRIPT, and loading the script again must not need the dead master. It
    loads on every master that answers and the operation succeeds. (The dead master is
    simulated: SCRIPT LOAD sent to it fails as a refused connection does, so the session's
    cluster is left whole for the other tests.)"""
    from redis.cluster import RedisCluster
    from redis.exceptions import ConnectionError as Refused

    store = RedisStore(cluster_client, prefix=cluster_client.test_prefix)
    victim = redis_cluster.ports[-1]
    alive_name = name_on(store, redis_cluster, None, "live", avoid=victim)
    assert store.load(alive_name).record.state == "closed"  # the scripts are loaded everywhere
    real = RedisCluster.execute_command

    def execute(self, *args, **kwargs):
        if args and str(args[0]).upper() == "SCRIPT LOAD":
            targets = kwargs.get("target_nodes")
            nodes = self.get_primaries() if targets is None else targets if isinstance(targets, list) else [targets]
            if any(node.port == victim for node in nodes):
                raise Refused(f"Error 111 connecting to 127.0.0.1:{victim}. Connection refused.")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RedisCluster, "execute_command", execute)
    for port in redis_cluster.ports[:-1]:
        redis.Redis(port=port, socket_timeout=2.0).script_flush()
    answer = store.trip(alive_name, trigger="consecutive_failures", recovery_timeout=600.0)
    assert answer.record.state == "open"
    assert store.inspect(alive_name).record.state == "open"


# ------------------------------------------------------------------------ fleet processes
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("shared_store", ["cluster"], indirect=True)
def test_st2_cluster_fleet_half_open_budget_with_real_processes(spawn, shared_store, dep):  # noqa: F811
    """ST-2/CB-6 on the cluster: 4 worker processes together send at most half_open_max_calls
    probes per round, exactly that many when they succeed, and each round closes the record."""
    _, store = shared_store
    half_open_budget_rounds(4, spawn, store, dep, rounds=2)


# --------------------------------------------------------------------------- resharding
def test_st4_cluster_resharding_under_load_no_caller_error(redis_cluster, cluster_client, fresh_registry, monkeypatch):
    """ST-2/ST-4: while 4 threads call through a breaker (with failures, so it trips, probes and
    closes) and a fifth runs the fleet jobs, the slot holding the breaker's record migrates to
    another master (SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE). The old owner answers
    ASK while the slot is half moved and MOVED after (counted by the server), the client follows
    both: no caller sees an exception, no store call fails, and the record, now on the new
    master, kept its history (its version only grew)."""
    monkeypatch.setenv("BALDUR_CB_SYNC_INTERVAL_SECONDS", "0.005")  # consult (store round trip) ~every call
    baldur_settings.reset()
    store = RedisStore(cluster_client, prefix=cluster_client.test_prefix)
    fresh_registry.set_store(store)
    name = "resharded"
    slot = redis_cluster.keyslot(store.key(name))
    source = redis_cluster.owner(slot)
    target = next(port for port in redis_cluster.ports if port != source)

    @baldur.circuit_breaker(name, failure_threshold=2, recovery_timeout=0.02, half_open_max_calls=1)
    def dependency(ok):
        if not ok:
            raise DependencyDown()
        return "ok"

    stop = threading.Event()
    errors: list[BaseException] = []
    progress = [0]
    lock = threading.Lock()

    def caller(offset):
        n = offset
        while not stop.is_set():
            n += 1
            try:
                dependency((n // 7) % 3 != 0)  # runs of failures and of successes
            except (DependencyDown, CircuitOpenError):
                pass
            except BaseException as exc:
                errors.append(exc)
            with lock:
                progress[0] += 1

    def jobs():
        while not stop.is_set():
            try:
                maintenance.recovery_sweep()
                maintenance.sync_state()
            except BaseException as exc:
                errors.append(exc)

    def after(more):
        target_count = progress[0] + more
        wait_for(lambda: progress[0] >= target_count, 20, f"{more} more calls")

    threads = [threading.Thread(target=caller, args=(i * 5,)) for i in range(4)] + [threading.Thread(target=jobs)]
    for t in threads:
        t.start()
    try:
        after(300)
        version = store.inspect(name).record.version
        assert version > 0  # it has been tripping and closing
        asks, moves = redis_cluster.error_count(source, "ASK"), redis_cluster.error_count(source, "MOVED")
        redis_cluster.migrate_slot(slot, target, half_moved=lambda: after(300), moved=lambda: after(300))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    assert fresh_registry.guard.failures == 0  # every redirection was followed: never store trouble
    assert redis_cluster.error_count(source, "ASK") > asks
    assert redis_cluster.error_count(source, "MOVED") > moves
    assert redis_cluster.owner(slot) == target
    with redis_cluster.node(target) as node:
        assert node.exists(store.key(name)) == 1
    assert store.inspect(name).record.version > version
