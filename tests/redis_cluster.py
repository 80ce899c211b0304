"""A private three-master Redis Cluster for the cluster tests (ST-2, ST-4).

:class:`LocalCluster` starts three ``redis-server --cluster-enabled yes`` processes on free
ports in a temporary directory, joins them with ``redis-cli --cluster create`` (no
replicas), waits until every node reports ``cluster_state:ok`` and agrees on the slot map,
and stops them (by PID) at the end. Nothing is written to disk but the nodes' own cluster
config files in the temporary directory. The cluster belongs to the test session: tests
may flush it, reshard it and read ``INFO`` from it without disturbing anyone.

:meth:`LocalCluster.migrate_slot` moves one hash slot, keys included, from its master to
another the way ``redis-cli --cluster reshard`` does (SETSLOT IMPORTING / MIGRATING,
MIGRATE in batches, SETSLOT NODE on every master), with hooks between the steps so a test
can keep callers running while the slot is half moved (ASK) and after it moved (MOVED).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import redis

from tests.stores.redis_tools import server_command, wait_for

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (32768 when unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def cluster_port(taken: list[int]) -> int:
    """A free port P whose cluster bus port P + 10000 is free too, both below the ports the
    kernel gives outgoing connections: a port in that range can be taken by any connection
    between this check and the node's bind (a node that cannot bind exits with 1)."""
    high = _ephemeral_low() - 10000 - 1
    low, high = (10000, high) if high > 11000 else (20000, 55000)
    for _ in range(200):
        port = random.randint(low, high)
        if port not in taken and _bindable(port) and _bindable(port + 10000):
            return port
    raise ClusterStartError("no free pair of ports (P, P + 10000) found")


class ClusterStartError(RuntimeError):
    """The local cluster could not be started (a binary is missing, a node or the create failed)."""


class LocalCluster:
    """Three Redis Cluster masters on 127.0.0.1, owned by this process.

    Args:
        masters: how many master processes (3: the smallest cluster redis-cli creates).
    """

    def __init__(self, masters: int = 3) -> None:
        self.masters = masters
        self.ports: list[int] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.directory: str | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 20.0) -> LocalCluster:
        """Start the nodes, create the cluster and wait for ``cluster_state:ok`` everywhere.

        Raises:
            ClusterStartError: a binary is missing, a node exits, or the cluster does not
                become healthy within *timeout* seconds (the nodes started are stopped).
        """
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise ClusterStartError("redis-server and redis-cli must be installed")
        for attempt in range(3):  # a node that lost its port to another process: new ports
            self.directory = tempfile.mkdtemp(prefix="baldur-cluster-")
            try:
                self._start(timeout)
            except BaseException as exc:
                self.stop()
                self.ports = []
                if isinstance(exc, ClusterStartError) and "exited with" in str(exc) and attempt < 2:
                    continue
                if isinstance(exc, ClusterStartError):
                    raise
                raise ClusterStartError(f"{type(exc).__name__}: {exc}") from exc
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, timeout: float) -> None:
        assert self.directory is not None and REDIS_SERVER is not None and REDIS_CLI is not None
        for _ in range(self.masters):
            port = cluster_port(self.ports)
            self.ports.append(port)
            self.processes.append(self._spawn(port))
        for port, process in zip(self.ports, self.processes, strict=True):

            def up(port: int = port, process: subprocess.Popen[bytes] = process) -> bool:
                if process.poll() is not None:
                    raise ClusterStartError(
                        f"redis-server on port {port} exited with {process.returncode}: {self._log_tail(port)}"
                    )
                return self._ping(port)

            wait_for(up, timeout, f"redis-server on port {port} to answer PING")
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        created = subprocess.run(
            [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=timeout,
        )
        if created.returncode != 0:
            raise ClusterStartError(
                f"redis-cli --cluster create failed ({created.returncode}): {created.stdout[-800:]!r}"
            )
        wait_for(self.healthy, timeout, "cluster_state:ok on every node", step=0.05)

    def _log_tail(self, port: int) -> str:
        """The end of the node's log (the directory is removed when the start fails)."""
        assert self.directory is not None
        try:
            with open(os.path.join(self.directory, f"redis-{port}.log"), "rb") as log:
                return log.read()[-400:].decode("utf-8", "replace").strip()
        except OSError:
            return "(no log)"

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        assert self.directory is not None and REDIS_SERVER is not None
        with open(os.path.join(self.directory, f"redis-{port}.log"), "ab") as log:
            return subprocess.Popen(
                server_command(
                    port,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    os.path.join(self.directory, f"nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "5000",
                    # the other masters keep serving their slots once a master is marked failed
                    # (Redis' default stops them all, CLUSTERDOWN, after the node timeout: on a
                    # loaded machine the killed-master test then outlasted it)
                    "--cluster-require-full-coverage",
                    "no",
                    "--dir",
                    self.directory,
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self, port: int) -> None:
        """SIGKILL the master on *port* by its PID (an abrupt node failure) and reap it."""
        process = self.processes[self.ports.index(port)]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)

    def restart(self, port: int, timeout: float = 15.0) -> None:
        """Start the killed master on *port* again (same node id and slots, from its cluster
        config file; no data) and wait until the cluster is healthy."""
        index = self.ports.index(port)
        assert self.processes[index].poll() is not None, f"node {port} still runs"
        self.processes[index] = self._spawn(port)
        wait_for(lambda: self._ping(port), timeout, f"redis-server on port {port} to answer PING")
        wait_for(self.healthy, timeout, "cluster_state:ok after the restart", step=0.05)

    def stop(self) -> None:
        """Terminate every node (SIGTERM, then SIGKILL) by its PID and remove the directory."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(5)
        self.processes = []
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    # ------------------------------------------------------------------ access
    @property
    def url(self) -> str:
        """A ``redis://`` URL of the first node: what ``BALDUR_REDIS_URL`` names."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        """A plain (non-cluster) client on one node, for CLUSTER commands and INFO."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5)

    def _ping(self, port: int) -> bool:
        try:
            with self.node(port) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def healthy(self) -> bool:
        """Every node says ``cluster_state:ok`` and sees the same slot owners for all 16384 slots."""
        maps = []
        for port in self.ports:
            with self.node(port) as client:
                if client.cluster("INFO").get("cluster_state") != "ok":
                    return False
                maps.append(self._owners(client))
        return all(owners == maps[0] for owners in maps) and len(maps[0]) == 16384

    @staticmethod
    def _owners(client: redis.Redis) -> dict[int, int]:
        owners = {}
        for start, end, master, *_replicas in client.execute_command("CLUSTER SLOTS"):
            for slot in range(int(start), int(end) + 1):
                owners[slot] = int(master[1])
        return owners

    def node_ids(self) -> dict[int, str]:
        """``{port: node id}`` of every master."""
        ids = {}
        for port in self.ports:
            with self.node(port) as client:
                ids[port] = client.execute_command("CLUSTER MYID").decode()
        return ids

    def owner(self, slot: int) -> int:
        """The port of the master that owns *slot* (as the first node sees it)."""
        with self.node(self.ports[0]) as client:
            return self._owners(client)[slot]

    def keyslot(self, key: str) -> int:
        with self.node(self.ports[0]) as client:
            return int(client.execute_command("CLUSTER KEYSLOT", key))

    def error_count(self, port: int, code: str) -> int:
        """How many error replies starting with *code* (``ASK``, ``MOVED``, ``NOSCRIPT``...) the
        master on *port* has sent since it started (``INFO errorstats``)."""
        with self.node(port) as client:
            stats = client.info("errorstats")
        entry = stats.get(f"errorstat_{code}") or {}
        return int(entry.get("count", 0))

    def flush(self) -> None:
        """FLUSHALL on every master (this private cluster only) and forget loaded scripts."""
        for port in self.ports:
            with self.node(port) as client:
                client.flushall()
                client.script_flush()

    # --------------------------------------------------------------- resharding
    def migrate_slot(
        self,
        slot: int,
        target: int,
        *,
        half_moved: Callable[[], Any] | None = None,
        moved: Callable[[], Any] | None = None,
        batch: int = 1,
    ) -> None:
        """Move hash *slot* with its keys from its owner to the master on port *target*.

        The steps of ``redis-cli --cluster reshard``: the target is set IMPORTING and the
        source MIGRATING; keys are moved with MIGRATE, *batch* at a time (during this, a
        command for a key already moved gets ``ASK`` from the source); then SETSLOT NODE
        on the target, the source and the other masters (from then on the old owner
        answers ``MOVED``).

        Args:
            slot: the hash slot.
            target: port of the receiving master (must not own the slot).
            half_moved: called once after the first batch moved, while the slot is
                MIGRATING (some of its keys answer ASK).
            moved: called after the slot was handed over.
            batch: keys per MIGRATE.
        """
        source = self.owner(slot)
        assert source != target, f"slot {slot} already lives on {target}"
        ids = self.node_ids()
        src, dst = self.node(source), self.node(target)
        try:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
            called = False
            while True:
                keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "REPLACE", "KEYS", *keys)
                if half_moved is not None and not called:
                    called = True
                    half_moved()
            if half_moved is not None and not called:
                half_moved()
            # the target first, then the source, then everyone else (as redis-cli does)
            dst.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
            src.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
            for port in self.ports:
                if port not in (source, target):
                    with self.node(port) as other:
                        other.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
        finally:
            src.close()
            dst.close()
        wait_for(lambda: self.healthy() and self.owner(slot) == target, 10, f"slot {slot} to move to {target}")
        if moved is not None:
            moved()

    def wait_until_settled(self, timeout: float = 10.0) -> None:
        wait_for(self.healthy, timeout, "the cluster to settle")


def start_or_none() -> tuple[LocalCluster | None, str]:
    """Start a cluster; ``(cluster, "")`` or ``(None, why it failed)``. Measures nothing."""
    started = time.monotonic()
    try:
        cluster = LocalCluster().start()
    except ClusterStartError as exc:
        return None, str(exc)
    cluster.started_in = time.monotonic() - started  # type: ignore[attr-defined]
    return cluster, ""
