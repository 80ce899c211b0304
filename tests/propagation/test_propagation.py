"""EM-6: cluster propagation over Redis pub/sub.

Claims about processes run in real OS processes (``tests.propagation.peer``, a forking
helper); claims about one process drive a real :class:`Propagator` on the real Redis
(DB 14, a channel of each test's own), the test publishing as a peer would. Outages are
real: a private ``redis-server`` killed, restarted and SIGSTOPped, a TCP server that never
answers, a closed port. Waits on other processes poll a condition with a deadline.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

import baldur_django as baldur
from baldur_django.contrib import propagation
from baldur_django.core.breaker import PEER_APPLIED, PEER_BLOCKED, PEER_LIFTED, PEER_UNCHANGED
from baldur_django.core.config import SettingsSource
from baldur_django.core.errors import CircuitOpenError, ConfigError
from baldur_django.core.events import Forced, ForceLapsed, Released, StateChanged, TripBlocked, bus
from baldur_django.core.states import CircuitState
from tests.conftest import need_server
from tests.stores.redis_tools import REDIS_SERVER, RedisServer, free_port

from .conftest import REDIS_DB, REDIS_URL, ROOT, Listener, wait_for

LOGGER = "baldur.circuit_breaker"
FAST = {"failure_threshold": 1, "failure_rate_threshold": 0, "recovery_timeout": 0.05, "half_open_max_calls": 1}
SLOW = {"failure_threshold": 1, "failure_rate_threshold": 0, "recovery_timeout": 60}


def service() -> str:
    return f"svc-{uuid.uuid4().hex[:8]}"


def lines(caplog, event):
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def peer_message(name: str, state: str, origin: str = "a-peer", **extra) -> str:
    return json.dumps({"v": 1, "origin": origin, "seq": 1, "service": name, "state": state, "trigger": "x", **extra})


def client_factory(port: int, db: int = 0):
    """A factory of plain clients on 127.0.0.1:*port* (no retries), like ``pubsub_client``'s."""

    def factory(timeout):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return redis.Redis(
            host="127.0.0.1",
            port=port,
            db=db,
            socket_timeout=timeout,
            socket_connect_timeout=2.0,
            retry=Retry(NoBackoff(), 0),
        )

    return factory


# ------------------------------------------------------------------ the breaker side (core)


def test_em6_apply_peer_open_and_closed_publish_trigger_propagated(clock, events):
    """EM-6: a peer's OPEN opens a CLOSED or HALF_OPEN breaker and a peer's CLOSED closes it, with no
    threshold crossed, each published once with trigger ``propagated``; a repeat changes nothing."""
    breaker = baldur.get_breaker(service())
    assert breaker.apply_peer("open") == PEER_APPLIED
    assert breaker.state is CircuitState.OPEN and breaker.snapshot()["consecutive_failures"] == 0
    assert breaker.apply_peer("open") == PEER_UNCHANGED
    assert breaker.apply_peer("closed") == PEER_APPLIED
    assert breaker.apply_peer("closed") == PEER_UNCHANGED
    breaker.apply_peer("open")
    clock.advance(breaker.config.recovery_timeout)
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.apply_peer("open") == PEER_APPLIED  # HALF_OPEN -> OPEN
    assert events.transitions() == [
        ("closed", "open", "propagated"),
        ("open", "closed", "propagated"),
        ("closed", "open", "propagated"),
        ("open", "half_open", "recovery_timeout"),
        ("half_open", "open", "propagated"),
    ]
    with pytest.raises(ConfigError, match="'half_open'"):
        breaker.apply_peer("half_open")


def test_em6_apply_peer_against_forces(clock, events, caplog):
    """EM-6, OP-4: a peer's OPEN meets a forced closed as a trip does (refused, trip_blocked
    logged with trigger propagated); a peer's CLOSED is applied over a forced open (the hazard)."""
    held = baldur.get_breaker(service())
    held.force_close(10)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert held.apply_peer("open") == PEER_BLOCKED
    assert held.state is CircuitState.CLOSED and held.forced == "closed"
    blocked = [e for e in events.events if isinstance(e, TripBlocked)]
    assert [(e.forced, e.trigger) for e in blocked] == [("closed", "propagated")]
    assert [r.trigger for r in lines(caplog, "circuit_breaker.trip_blocked")] == ["propagated"]
    assert held.apply_peer("closed") == PEER_UNCHANGED and held.forced == "closed"

    lifted = baldur.get_breaker(service())
    lifted.force_open(10)
    assert lifted.apply_peer("open") == PEER_UNCHANGED and lifted.forced == "open"
    assert lifted.apply_peer("closed") == PEER_LIFTED
    assert lifted.state is CircuitState.CLOSED and lifted.forced is None
    assert events.transitions()[-1] == ("open", "closed", "propagated")


def test_em6_apply_peer_on_a_shared_store_rereads_the_record_next_call(fresh_registry, clock, events):
    """EM-6, ST-3: with a shared store the record stays the authority: after a peer's CLOSED lifted
    a force locally, the next admission consults the store and takes the force back."""
    import fakeredis

    from baldur_django.core.stores.redis import RedisStore

    fresh_registry.set_store(RedisStore(fakeredis.FakeRedis(), prefix=f"t-{uuid.uuid4().hex[:8]}"))
    breaker = baldur.get_breaker(service())
    breaker.force_open(10)  # written to the shared record
    assert breaker.apply_peer("closed") == PEER_LIFTED
    assert events.transitions()[-1] == ("open", "closed", "propagated")
    with pytest.raises(CircuitOpenError):
        breaker.acquire()  # consulted the record: forced open again
    assert breaker.forced == "open" and breaker.state is CircuitState.OPEN


def test_em6_decisions_published_are_opens_and_closes_of_this_process_only():
    """EM-6: what the listener publishes: automatic opens and closes, forces, and a release or a
    lapse only when it lands in OPEN or CLOSED; never HALF_OPEN, never a propagated transition."""
    at = 1.0
    assert propagation.decision_of(StateChanged("s", at, "closed", "open", "consecutive_failures")) == "open"
    assert propagation.decision_of(StateChanged("s", at, "half_open", "closed", "half_open_success")) == "closed"
    assert propagation.decision_of(StateChanged("s", at, "open", "half_open", "recovery_timeout")) is None
    assert propagation.decision_of(StateChanged("s", at, "closed", "open", "propagated")) is None
    assert propagation.decision_of(Forced("s", at, mode="closed", from_state="open", to_state="closed")) == "closed"
    assert propagation.decision_of(Forced("s", at, mode="open", from_state="open", to_state="open")) == "open"
    assert propagation.decision_of(Released("s", at, previous="open", from_state="open", to_state="half_open")) is None
    assert propagation.decision_of(Released("s", at, previous="closed", from_state="closed", to_state="closed")) is None
    assert propagation.decision_of(ForceLapsed("s", at, previous="open", from_state="half_open", to_state="open")) == (
        "open"
    )
    assert propagation.decision_of(TripBlocked("s", at, forced="closed", trigger="x")) is None


def test_em6_message_format_round_trip_and_rejections():
    """EM-6: the message format: what encode writes decode reads; anything else is refused with a reason."""
    data = propagation.encode("origin1", 7, "pay ments {x}", "open", "failure_rate", 12.5)
    assert propagation.decode(data) == {
        "origin": "origin1",
        "service": "pay ments {x}",
        "state": "open",
        "trigger": "failure_rate",
        "at": 12.5,
        "seq": 7,
    }
    bad = [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not an object"),
        (json.dumps({"v": 2, "origin": "o", "service": "s", "state": "open"}), "version"),
        (json.dumps({"v": 1, "service": "s", "state": "open"}), "origin"),
        (json.dumps({"v": 1, "origin": "o", "service": "", "state": "open"}), "service"),
        (json.dumps({"v": 1, "origin": "o", "service": "s", "state": "half_open"}), "state"),
        (b"x" * (propagation.MAX_MESSAGE_BYTES + 1), "bytes"),
        (12, "type int"),
    ]
    for payload, why in bad:
        with pytest.raises(ValueError, match=why):
            propagation.decode(payload)
    assert propagation.channel_name("p", 3) == "p:propagation:3"
    with pytest.raises(ConfigError, match="prefix"):
        propagation.channel_name("")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_queue": 0}, "max_queue"),
        ({"health_interval": 6}, "health_interval"),
        ({"health_interval": 0}, "health_interval"),
        ({"backoff_max": 0.01}, "backoff_max"),
        ({"channel": ""}, "channel"),
    ],
)
def test_em6_bad_propagator_arguments_are_config_errors(kwargs, match):
    """EM-6, CFG-3: bad arguments name themselves; the health check is at most every 5 s."""
    with pytest.raises(ConfigError, match=match):
        propagation.Propagator(client_factory=client_factory(1), **{"channel": "c", **kwargs})


# ------------------------------------------------------------------ real processes


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em6_peer_decisions_reach_other_processes_once_with_trigger_propagated(trio, raw):
    """EM-6: an OPEN decided by A's own threshold reaches B and C (other OS processes) with trigger
    ``propagated``, and so does A's automatic CLOSED; each decision is one message on the channel:
    B and C publish nothing back (no echo)."""
    prefix, (a, b, c) = trio
    name = service()
    a.send("register", service=name, overrides=FAST)
    for peer in (b, c):
        peer.send("register", service=name, overrides=SLOW)
    listener = Listener(raw, propagation.channel_name(prefix, REDIS_DB))
    try:
        assert a.send("trip", service=name)["state"] == "open"
        for peer in (b, c):
            assert peer.send("wait", service=name, state="open")["state"] == "open"
        assert a.send("recover", service=name)["state"] == "closed"  # half_open_success
        for peer in (b, c):
            assert peer.send("wait", service=name, state="closed")["state"] == "closed"
        for peer in (a, b, c):
            assert peer.send("flush")["flushed"]
        published = [m for m in listener.drain() if m.get("service") == name]
    finally:
        listener.close()
    origin_a = a.ready()["origin"]
    assert [(m["origin"], m["state"], m["trigger"]) for m in published] == [
        (origin_a, "open", "consecutive_failures"),
        (origin_a, "closed", "half_open_success"),
    ]
    for peer in (b, c):
        shown = shown_once(peer, name, lambda shown: len(shown["transitions"]) >= 2)
        assert shown["transitions"] == [
            ["state_changed", "closed", "open", "propagated"],
            ["state_changed", "open", "closed", "propagated"],
        ]
    assert [t[3] for t in a.send("show", service=name)["transitions"]] == [
        "consecutive_failures",
        "recovery_timeout",
        "half_open_success",
    ]


def shown_once(peer, name, ready, timeout=10.0):
    """The peer's ``show`` answer once *ready(answer)* holds, or the last one at the deadline.

    A peer's state is visible before the event of that transition reaches its listener (events
    are published after the breaker's lock is let go), so a test that reads the transitions
    right after ``wait`` may find the last one missing."""
    deadline = time.monotonic() + timeout
    shown = peer.send("show", service=name)
    while not ready(shown) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling another process's listener, with a deadline
        shown = peer.send("show", service=name)
    return shown


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em6_peer_closed_is_applied_over_a_local_forced_open(trio):
    """EM-6 (the documented hazard): B holds a forced open; A's own recovery publishes CLOSED and B
    applies it, force lifted, trigger propagated (on the memory backend the force is gone)."""
    _, (a, b, _c) = trio
    name = service()
    a.send("register", service=name, overrides=FAST)
    b.send("register", service=name, overrides=SLOW)
    assert b.send("force_open", service=name)["state"] == "open"
    assert a.send("wait", service=name, state="open")["state"] == "open"  # B's force reached A as OPEN
    assert a.send("recover", service=name)["state"] == "closed"
    assert b.send("wait", service=name, state="closed")["state"] == "closed"
    expected = ["state_changed", "open", "closed", "propagated"]
    shown = shown_once(b, name, lambda shown: shown["transitions"][-1:] == [expected])
    assert shown["forced"] is None and shown["last_trigger"] == "propagated"
    assert shown["transitions"][-1] == expected
    assert b.send("stats")["lifted"] >= 1


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em6_peer_open_meets_a_local_forced_closed_like_a_trip(trio):
    """EM-6, OP-4: B holds a forced closed; A's trip reaches B and is refused there as a trip is
    (trip_blocked, trigger propagated); B stays CLOSED and forced."""
    _, (a, b, _c) = trio
    name = service()
    a.send("register", service=name, overrides=SLOW)
    b.send("register", service=name, overrides=SLOW)
    blocked_before = b.send("stats")["blocked"]
    b.send("force_close", service=name)
    assert a.send("trip", service=name)["state"] == "open"
    wait_for(lambda: b.send("stats")["blocked"] > blocked_before, 10, "B to refuse A's OPEN")
    shown = shown_once(b, name, lambda shown: ["trip_blocked", "", "", "propagated"] in shown["transitions"])
    assert shown["state"] == "closed" and shown["forced"] == "closed"
    assert ["trip_blocked", "", "", "propagated"] in shown["transitions"]


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em6_level3_still_applies_a_peers_decision(trio):
    """EM-6, EM-2: at Level 3 C takes no automatic decision of its own, yet applies A's OPEN and CLOSED."""
    _, (a, _b, c) = trio
    name, own = service(), service()
    a.send("register", service=name, overrides=FAST)
    c.send("register", service=name, overrides=SLOW)
    c.send("register", service=own, overrides=SLOW)
    assert c.send("level", level=3)["level"] == 3
    try:
        assert c.send("fail", service=own, times=3)["state"] == "closed"  # frozen: no trip of its own
        assert a.send("trip", service=name)["state"] == "open"
        assert c.send("wait", service=name, state="open")["state"] == "open"
        assert a.send("recover", service=name)["state"] == "closed"
        assert c.send("wait", service=name, state="closed")["state"] == "closed"
        transitions = shown_once(c, name, lambda shown: len(shown["transitions"]) >= 2)["transitions"]
        assert [t[3] for t in transitions] == ["propagated", "propagated"]
    finally:
        c.send("level", level=0)


FORKER = r"""
import json, logging, os, sys, time
logging.getLogger("baldur").setLevel(logging.CRITICAL + 1)
from baldur_django.contrib import propagation
from baldur_django.core.registry import registry

def say(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()

def wait_state(name, state):
    deadline = time.monotonic() + 20
    breaker = registry.get(name)
    while breaker.state.value != state and time.monotonic() < deadline:
        time.sleep(0.005)  # polling another process's decision, with a deadline
    return breaker.state.value, breaker.snapshot()["last_trigger"]

prefix = sys.argv[1]
for name in ("flip", "from-child"):
    registry.get(name, {"failure_threshold": 1, "failure_rate_threshold": 0, "recovery_timeout": 60})
parent = propagation.install(prefix=prefix, health_interval=1.0)
assert parent.wait_connected(20)
before = (parent.origin, parent.subscriber_address)
pid = os.fork()
who = "child" if pid == 0 else "parent"
p = propagation.get_propagator()
assert p.wait_connected(20)
say(who=who, pid=os.getpid(), origin=p.origin, address=list(p.subscriber_address), running=p.running,
    parent_origin=before[0], parent_address=list(before[1]))
for state in ("open", "closed"):
    now, trigger = wait_state("flip", state)
    say(who=who, service="flip", state=now, trigger=trigger)
if who == "child":
    breaker = registry.get("from-child")
    breaker.record_failure(breaker.acquire())
    assert p.flush(10)
    say(who=who, service="from-child", state=breaker.state.value, published=p.published)
    os._exit(0)
now, trigger = wait_state("from-child", "open")
say(who=who, service="from-child", state=now, trigger=trigger)
os.waitpid(pid, 0)
"""


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em6_a_forked_child_runs_its_own_subscriber(redis_up, raw, prefix):
    """EM-6: a process forked after its parent started propagation (gunicorn --preload, Celery
    prefork) runs its own subscriber on a connection of its own (two subscriptions, distinct
    CLIENT ids and origins), both apply a peer's flips, and the parent applies the child's decision."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALDUR_")}
    env.update(PYTHONPATH=str(ROOT), BALDUR_REDIS_URL=REDIS_URL)
    process = subprocess.Popen(
        [sys.executable, "-c", FORKER, prefix], stdout=subprocess.PIPE, text=True, cwd=str(ROOT), env=env
    )
    try:
        reader = iter(process.stdout)

        def read() -> dict:
            line = next(reader, "")
            assert line, f"forker exited ({process.poll()})"
            return json.loads(line)

        hello = {m["who"]: m for m in (read(), read())}
        parent, child = hello["parent"], hello["child"]
        assert child["running"] and parent["running"]
        assert child["pid"] != parent["pid"] and child["origin"] != parent["origin"]
        assert child["parent_origin"] == parent["origin"] and parent["address"] == parent["parent_address"]
        channel = propagation.channel_name(prefix, REDIS_DB)
        assert raw.pubsub_numsub(channel) == [(channel.encode(), 2)]
        ids = {c["addr"]: c["id"] for c in raw.client_list(_type="pubsub")}
        addresses = [f"{m['address'][0]}:{m['address'][1]}" for m in (parent, child)]
        assert all(a in ids for a in addresses) and ids[addresses[0]] != ids[addresses[1]]

        raw.publish(channel, peer_message("flip", "open", origin="test"))
        flips = [read(), read()]  # nobody goes on before the "closed" flip
        raw.publish(channel, peer_message("flip", "closed", origin="test"))
        # the child goes on to its own decision after its "closed" line, so its "from-child"
        # line may come before the parent's "closed" one: four lines, told apart by service
        rest = [read() for _ in range(4)]
        flips += [m for m in rest if m["service"] == "flip"]
        assert sorted((m["who"], m["state"], m["trigger"]) for m in flips) == [
            ("child", "closed", "propagated"),
            ("child", "open", "propagated"),
            ("parent", "closed", "propagated"),
            ("parent", "open", "propagated"),
        ]
        last = {m["who"]: m for m in rest if m["service"] == "from-child"}
        assert last["child"]["state"] == "open" and last["child"]["published"] == 1
        assert (last["parent"]["state"], last["parent"]["trigger"]) == ("open", "propagated")
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


# ------------------------------------------------------------------ one process, real Redis


@pytest.mark.redis
def test_em6_malformed_messages_and_unknown_services_are_ignored(propagators, raw, prefix, caplog, fresh_registry):
    """EM-6: malformed messages, unknown services and this process's own messages change nothing and
    end nothing (DEBUG lines for the first two); the next good message is applied."""
    known = baldur.get_breaker(service())
    p = propagators(client_factory=client_factory(6379, REDIS_DB), prefix=prefix, health_interval=1.0).start()
    assert p.wait_connected(10)
    garbage = [
        b"not json",
        b"\xff",
        json.dumps([1]),
        json.dumps({"v": 1, "origin": "x", "service": known.name, "state": "half_open"}),
        json.dumps({"v": 9, "origin": "x", "service": known.name, "state": "open"}),
        json.dumps({"v": 1, "service": known.name, "state": "open"}),
    ]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for payload in garbage:
            raw.publish(p.channel, payload)
        raw.publish(p.channel, peer_message("never-registered", "open"))
        raw.publish(p.channel, peer_message(known.name, "open", origin=p.origin))  # its own: skipped
        raw.publish(p.channel, peer_message(known.name, "open"))
        wait_for(lambda: p.applied == 1, 10, "the good message")
    assert known.state is CircuitState.OPEN
    assert "never-registered" not in fresh_registry.names()
    assert (p.ignored, p.own, p.received) == (len(garbage) + 1, 1, len(garbage) + 3)
    ignored = lines(caplog, "circuit_breaker.propagation_ignored")
    assert len(ignored) == len(garbage) + 1 and {r.levelno for r in ignored} == {logging.DEBUG}
    assert ignored[-1].service == "never-registered" and "unknown service" in ignored[-1].getMessage()
    assert p.connected and p.losses == 0


def test_em6_a_hung_redis_never_delays_or_fails_a_protected_call(propagators, hung_server, prefix, caplog):
    """EM-6, ST-4: with a Redis that accepts connections and never answers, protected calls that
    trip, get rejected and are forced keep returning while the publisher thread is stuck inside a
    PUBLISH; decisions beyond the bounded queue are dropped and counted, the subscriber's loss is logged."""
    name = service()

    @baldur.circuit_breaker(name, failure_threshold=1, failure_rate_threshold=0, recovery_timeout=60)
    def call(ok=True):
        if not ok:
            raise ConnectionError("dependency down")
        return "ok"

    # the publisher waits 300 s for the hung server: longer than this test
    p = propagators(
        client_factory=client_factory(hung_server.port),
        source=SettingsSource(environ={"BALDUR_REDIS_SOCKET_TIMEOUT": "300"}),
        prefix=prefix,
        max_queue=2,
        health_interval=0.2,
        backoff_max=0.2,
    )
    bus.subscribe(p)
    p.start()
    outcomes: list[str] = []

    def in_a_thread(calls):
        # a hang guard, not a timing assertion: the hung server never answers, so a call
        # that waited on it would never return
        caller = threading.Thread(target=calls, daemon=True)
        caller.start()
        caller.join(10)
        assert not caller.is_alive(), "a protected call waited on Redis"

    def trip():
        try:
            call(ok=False)  # the trip: its OPEN is the publisher's first message
        except ConnectionError:
            outcomes.append("failed")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        in_a_thread(trip)
        wait_for(lambda: p.in_flight, 10, "the publisher to be held by the hung server")

        def more_calls():
            breaker = baldur.get_breaker(name)
            for _ in range(3):
                breaker.force_close(10)
                outcomes.append(call())
                breaker.release()
                breaker.force_open(10)
                try:
                    call()
                except CircuitOpenError:
                    outcomes.append("rejected")
                breaker.release()

        in_a_thread(more_calls)
        wait_for(lambda: p.losses == 1, 10, "the subscriber to give up on the hung server")
    assert outcomes == ["failed"] + ["ok", "rejected"] * 3
    assert p.in_flight and p.published == 0 and hung_server.received  # still held by the first publish
    assert p.dropped == 6 - 2  # six decisions after the first; two fit the queue
    assert lines(caplog, "circuit_breaker.propagation_dropped")
    assert len(lines(caplog, "circuit_breaker.propagation_lost")) == 1


def test_em6_an_unreachable_redis_is_logged_once_and_calls_carry_on(propagators, prefix, caplog):
    """EM-6, ST-4: a closed port: every decision's publish fails (counted, dropped, not replayed), the
    subscriber keeps retrying with backoff and logs the loss once; the calls are not affected."""
    name = service()
    breaker = baldur.get_breaker(name)
    p = propagators(client_factory=client_factory(free_port()), prefix=prefix, backoff_initial=0.01, backoff_max=0.02)
    bus.subscribe(p)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        p.start()
        for _ in range(3):
            breaker.force_open(5)
            breaker.force_close(5)
        assert p.flush(10)
        wait_for(lambda: p.failed_attempts >= 5, 10, "several reconnect attempts")
    assert p.publish_failures == 6 and p.published == 0
    assert breaker.state is CircuitState.CLOSED
    assert len(lines(caplog, "circuit_breaker.propagation_lost")) == 1
    assert len(lines(caplog, "circuit_breaker.propagation_dropped")) == 1  # once per warning interval


@pytest.fixture
def private_redis():
    need_server("the redis-server binary (this test starts its own)", REDIS_SERVER is not None)
    server = RedisServer().start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.pid, signal.SIGCONT)
    server.stop()


def _publisher(server):
    import redis

    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


@pytest.mark.redis
def test_em6_subscriber_reconnects_after_a_redis_restart(propagators, private_redis, prefix, caplog):
    """EM-6: Redis killed and restarted: the subscriber logs the loss once (however many reconnect
    attempts fail), resubscribes with backoff, logs the return once, and applies the next flip."""
    breaker = baldur.get_breaker(service())
    p = propagators(
        client_factory=client_factory(private_redis.port), prefix=prefix, backoff_initial=0.02, backoff_max=0.1
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        p.start()
        assert p.wait_connected(10)
        _publisher(private_redis).publish(p.channel, peer_message(breaker.name, "open"))
        wait_for(lambda: breaker.state is CircuitState.OPEN, 10, "the first flip")
        private_redis.kill()
        wait_for(lambda: p.failed_attempts >= 3, 10, "reconnect attempts while Redis is down")
        assert not p.connected
        private_redis.start()
        wait_for(lambda: p.subscriptions == 2, 10, "the subscription to come back")
        _publisher(private_redis).publish(p.channel, peer_message(breaker.name, "closed"))
        wait_for(lambda: breaker.state is CircuitState.CLOSED, 10, "the flip after the restart")
    assert len(lines(caplog, "circuit_breaker.propagation_lost")) == 1
    assert len(lines(caplog, "circuit_breaker.propagation_restored")) == 1
    assert p.losses == 1


@pytest.mark.redis
def test_em6_health_check_detects_a_frozen_redis(propagators, private_redis, prefix, caplog):
    """EM-6: a SIGSTOPped Redis keeps the TCP connection open and silent, and the subscriber has no
    read timeout: its PING goes unanswered, the loss is logged, and after SIGCONT it resubscribes
    and applies the next flip."""
    breaker = baldur.get_breaker(service())
    p = propagators(client_factory=client_factory(private_redis.port), prefix=prefix, health_interval=0.2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        p.start()
        assert p.wait_connected(10)
        os.kill(private_redis.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: p.losses == 1, 10, "the health check to notice")
        finally:
            os.kill(private_redis.pid, signal.SIGCONT)
        wait_for(lambda: p.subscriptions == 2, 15, "the subscription to come back")
        _publisher(private_redis).publish(p.channel, peer_message(breaker.name, "open"))
        wait_for(lambda: breaker.state is CircuitState.OPEN, 10, "the flip")
    (lost,) = lines(caplog, "circuit_breaker.propagation_lost")
    assert "no answer to PING" in lost.getMessage()
    assert len(lines(caplog, "circuit_breaker.propagation_restored")) == 1


# ------------------------------------------------------------------ Django wiring and checks


@pytest.mark.redis
def test_em6_pubsub_client_has_no_read_timeout(settings, redis_up):
    """EM-6: backends.pubsub_client() is built from BALDUR_REDIS_URL or the django-redis alias,
    without a read timeout unless one is asked for (the publisher's)."""
    from baldur_django.backends import pubsub_client

    settings.BALDUR_REDIS_URL = REDIS_URL
    settings.BALDUR_REDIS_SOCKET_TIMEOUT = 0.5
    client = pubsub_client()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] is None and kwargs["db"] == REDIS_DB and client.ping()
    assert pubsub_client(0.5).connection_pool.connection_kwargs["socket_timeout"] == 0.5
    settings.BALDUR_REDIS_URL = None
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "shared": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/15",
            "OPTIONS": {"SOCKET_TIMEOUT": 0.1},
        },
    }
    settings.BALDUR_REDIS_CACHE_ALIAS = "shared"
    client = pubsub_client()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] is None and kwargs["db"] == 15 and client.ping()
    settings.BALDUR_REDIS_CACHE_ALIAS = "default"
    with pytest.raises(ConfigError, match="BALDUR_REDIS_URL"):
        pubsub_client()


@pytest.mark.redis
def test_em6_propagation_on_a_redis_cluster(settings, redis_cluster, propagators, prefix):
    """EM-6, ST-2: with BALDUR_REDIS_CLUSTER, pubsub_client() talks classic pub/sub to the node
    BALDUR_REDIS_URL names, and a decision published through another node of the cluster is applied."""
    from baldur_django.backends import pubsub_client

    settings.BALDUR_REDIS_URL = redis_cluster.url
    settings.BALDUR_REDIS_CLUSTER = True
    breaker = baldur.get_breaker(service())
    p = propagators(prefix=prefix, health_interval=1.0).start()  # the default factory: pubsub_client
    assert p.channel == propagation.channel_name(prefix, 0) and p.wait_connected(10)
    other = redis_cluster.node(redis_cluster.ports[-1])
    try:
        assert other.publish(p.channel, peer_message(breaker.name, "open")) == 0  # no subscriber on that node
        wait_for(lambda: breaker.state is CircuitState.OPEN, 10, "the flip from another node")
    finally:
        other.close()
    settings.BALDUR_REDIS_URL = None
    with pytest.raises(ConfigError, match="BALDUR_REDIS_CLUSTER"):
        pubsub_client()


@pytest.mark.redis
def test_em6_the_setting_starts_and_stops_propagation(settings, redis_up, monkeypatch, raw):
    """EM-6, CFG-2: turning BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED on (with Redis configured)
    starts this process's propagation through the settings reload; turning it off stops it; a
    change that does not concern it keeps the same one running."""
    monkeypatch.setattr(propagation, "DEFAULT_PREFIX", f"t-em6-{uuid.uuid4().hex[:12]}")
    breaker = baldur.get_breaker(service())
    assert propagation.get_propagator() is None
    settings.BALDUR_REDIS_URL = REDIS_URL
    settings.BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED = True
    try:
        running = propagation.get_propagator()
        assert running is not None and running.channel == propagation.channel_name(propagation.DEFAULT_PREFIX, REDIS_DB)
        assert running.wait_connected(10)
        settings.BALDUR_CB_FAILURE_THRESHOLD = 3
        assert propagation.get_propagator() is running
        raw.publish(running.channel, peer_message(breaker.name, "open"))
        wait_for(lambda: breaker.state is CircuitState.OPEN, 10, "the flip")
    finally:
        settings.BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED = False
    assert propagation.get_propagator() is None and not running.running


def test_em6_setting_on_without_redis_logs_and_starts_nothing(settings, caplog):
    """EM-6, CFG-3: the setting on with no Redis configured starts nothing and says why (ERROR on
    baldur.config), never an exception in the settings reload."""
    with caplog.at_level(logging.ERROR, logger="baldur.config"):
        settings.BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED = True
    assert propagation.get_propagator() is None
    assert any("cluster propagation is not running" in r.getMessage() for r in caplog.records)


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("BALDUR_") and name != "BALDUR_EMERGENCY_STATE_FILE":
            monkeypatch.delenv(name)
    return monkeypatch


def _checks():
    from baldur_django.checks import check_settings

    return [m for m in check_settings() if m.id.startswith("baldur.")]


def test_em6_checks_need_redis_and_warn_about_forces_on_the_memory_backend(clean_env, settings):
    """EM-6: system checks: propagation on without Redis is error baldur.E009; on with Redis and the
    memory backend is warning baldur.W010 (forces live in one process there, and a peer's CLOSED lifts
    them); on a shared store, or with propagation off, neither. The knob is no longer reserved."""
    from baldur_django.checks import Codes
    from baldur_django.core.knobs import RESERVED

    assert "BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED" not in RESERVED
    assert _checks() == []
    clean_env.setenv("BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED", "true")  # env: no reload, nothing starts
    (error,) = _checks()
    assert error.id == Codes.PROPAGATION_WITHOUT_REDIS == "baldur.E009"
    assert "BALDUR_REDIS_CACHE_ALIAS='default'" in error.msg and "BALDUR_REDIS_URL" in error.hint
    clean_env.setenv("BALDUR_REDIS_URL", "redis://:secret@127.0.0.1:6379/3")
    (warning,) = _checks()
    assert warning.id == Codes.PROPAGATION_LIFTS_FORCES == "baldur.W010"
    assert "memory" in warning.msg and "force" in warning.hint and "secret" not in warning.msg + warning.hint
    clean_env.setenv("BALDUR_STATE_BACKEND", "redis")
    assert _checks() == []
    clean_env.delenv("BALDUR_REDIS_URL")
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}}
    assert _checks() == []  # the django-redis alias serves both
    clean_env.setenv("BALDUR_CB_CLUSTER_STATE_PROPAGATION_ENABLED", "false")
    clean_env.setenv("BALDUR_STATE_BACKEND", "memory")
    assert _checks() == []


# ------------------------------------------------------------------ the benchmark (structure only)


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em6_benchmark_smoke(redis_up):
    """EM-6 (benchmark plumbing): a tiny run of benchmarks/propagation.py with real processes
    reports one delay per peer per flip and a verdict; no timing is asserted."""
    from benchmarks.propagation import PropagationSettings, bench_propagation, evaluate, format_propagation, to_json

    result = bench_propagation(PropagationSettings(workers=2, flips=4, redis_url=REDIS_URL))
    assert len(result.flip_delays) == 4 and len(result.peer_delays) == 4 * 1
    assert all(d >= 0 for d in result.peer_delays)
    assert result.messages == 4  # one message per decision, none echoed
    text = format_propagation(result)
    assert "p99" in text and evaluate(result).status in ("PASS", "MISS")
    assert json.loads(json.dumps(to_json(result)))["flips"] == 4
