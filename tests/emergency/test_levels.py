"""EM-1, EM-3: Emergency Mode levels, their expiry, the process cache, backends and read failures.

Time is a FakeClock (``em_clock``) wherever one process is involved; the cross-process
tests start a real second interpreter (tests/emergency/peer.py) whose short cache comes
from its environment.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import stat

import pytest

from baldur_django.core import emergency
from baldur_django.core.errors import BaldurError, ConfigError
from baldur_django.core.events import EmergencyLevelChanged, bus
from baldur_django.core.testing import RecordingListener


def _records(caplog, event):
    return [r for r in caplog.records if getattr(r, "event", None) == event]


class CountingBackend:
    """Wraps a backend and counts the reads that reach it (I/O)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.reads = 0
        self.fail: Exception | None = None

    def read(self):
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.inner.read()

    def update(self, change):
        return self.inner.update(change)


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize("level", [True, False, 1.0, "3", 4, -1, None, 3.5])
def test_em1_bad_level_is_a_config_error_and_writes_nothing(level, em_clock, emergency_state_file):
    """EM-1: a level that is not an int 0..3 (booleans included) raises ConfigError; no file appears."""
    with pytest.raises(ConfigError, match="level="):
        emergency.set_level(level, minutes=5)
    assert not emergency_state_file.exists()
    assert emergency.current_level() == 0


@pytest.mark.parametrize("minutes", [0, -1, 1440.5, True, math.nan, math.inf, "5"])
def test_em1_bad_minutes_is_a_config_error_and_writes_nothing(minutes, em_clock, emergency_state_file):
    """EM-1: minutes must be a number > 0 and <= 1440; anything else raises and writes nothing."""
    with pytest.raises(ConfigError, match="minutes="):
        emergency.set_level(3, minutes=minutes)
    assert not emergency_state_file.exists()


def test_em1_minutes_none_uses_the_manual_override_lifetime(em_clock, emergency_state_file, monkeypatch):
    """EM-1: minutes=None lasts BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES; fractions are allowed."""
    monkeypatch.setenv("BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES", "7")
    emergency.mode.source.reset()
    state = emergency.set_level(2)
    assert state.expires_at == pytest.approx(em_clock.wall() + 7 * 60)
    assert emergency.set_level(1, minutes=0.5).expires_at == pytest.approx(em_clock.wall() + 30)
    on_disk = json.loads(emergency_state_file.read_text())
    assert on_disk["level"] == 1 and on_disk["source"] == "manual"


# ------------------------------------------------------------------------ set / expiry
def test_em1_the_setting_process_sees_the_level_at_once(em_clock, emergency_state_file):
    """EM-1: after set_level the writer's own cache holds the new level (no wait for the cache)."""
    assert emergency.current_level() == 0  # cache now fresh for 30 s at level 0
    emergency.set_level(3, minutes=10, reason="everything is down", actor="alice")
    assert emergency.current_level() == 3 and emergency.frozen()
    status = emergency.status()
    assert status["level"] == 3 and status["reason"] == "everything is down" and status["actor"] == "alice"
    assert status["source"] == "manual" and status["backend"] == "file"
    assert status["expires_at"] == pytest.approx(em_clock.wall() + 600)
    emergency.set_level(0)
    assert emergency.current_level() == 0 and not emergency.frozen()
    assert emergency.status()["expires_at"] is None


def test_em1_a_level_expires_on_its_own_and_logs_expired_once(em_clock, memory_level, caplog):
    """EM-1: once its expiry (wall clock) passes, a level reads 0 and emergency.expired is logged once."""
    emergency.set_level(3, minutes=1)
    em_clock.advance(59.0)
    assert emergency.current_level() == 3
    with caplog.at_level(logging.INFO, logger="baldur.emergency"):
        em_clock.advance(1.0)
        assert emergency.current_level() == 0
        assert not emergency.frozen()
        em_clock.advance(120.0)  # the cache refreshes and reads the expired record again
        assert emergency.current_level() == 0
    expired = _records(caplog, "emergency.expired")
    assert len(expired) == 1 and expired[0].getMessage().startswith("emergency.expired")
    assert emergency.status()["level"] == 0


def test_em3_step_down_keeps_the_expiry_and_stops_at_zero(em_clock, memory_level, caplog):
    """EM-3: step_down lowers the level one at a time, keeping the expiry; at 0 it stays 0 and writes nothing."""
    events = RecordingListener(bus)
    try:
        emergency.set_level(3, minutes=20, actor="alice")
        expires = emergency.status()["expires_at"]
        em_clock.advance(60)
        with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
            assert emergency.step_down(actor="bob") == 2
        assert not emergency.frozen() and emergency.current_level() == 2
        assert emergency.status()["expires_at"] == expires
        assert emergency.step_down() == 1
        assert emergency.step_down() == 0
        assert emergency.status()["expires_at"] is None
        assert emergency.step_down() == 0
    finally:
        bus.unsubscribe(events)
    changes = [e for e in events.events if isinstance(e, EmergencyLevelChanged)]
    assert [(e.previous, e.level, e.action) for e in changes] == [
        (0, 3, "set"),
        (3, 2, "step_down"),
        (2, 1, "step_down"),
        (1, 0, "step_down"),
    ]
    assert changes[1].actor == "bob" and changes[0].actor == "alice" and changes[0].source == "manual"
    assert _records(caplog, "emergency.stepped_down")[0].level == 2


def test_em1_level_set_is_published_and_logged(em_clock, memory_level, caplog):
    """EM-1: a change is one EmergencyLevelChanged on the bus and one emergency.level_set line."""
    events = RecordingListener(bus)
    try:
        with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
            emergency.set_level(2, minutes=5, reason="search is flaky", actor="ops")
    finally:
        bus.unsubscribe(events)
    (change,) = [e for e in events.events if isinstance(e, EmergencyLevelChanged)]
    assert (change.level, change.previous, change.source, change.actor, change.minutes) == (2, 0, "manual", "ops", 5.0)
    (line,) = _records(caplog, "emergency.level_set")
    assert line.getMessage().startswith("emergency.level_set") and line.level == 2 and line.previous == 0


# ---------------------------------------------------------------------------------- cache
def test_em1_no_backend_read_while_the_cache_is_fresh(em_clock, monkeypatch):
    """EM-1: reads inside BALDUR_EMERGENCY_CACHE_SECONDS do no I/O; the first read after it does one."""
    monkeypatch.setenv("BALDUR_EMERGENCY_CACHE_SECONDS", "10")
    emergency.mode.source.reset()
    backend = CountingBackend(emergency.MemoryLevelBackend())
    emergency.use_backend(backend)
    backend.inner.update(lambda current: emergency.LevelState(level=3, expires_at=em_clock.wall() + 3600))
    assert emergency.current_level() == 3 and backend.reads == 1
    for _ in range(1000):
        assert emergency.frozen()
    em_clock.advance(9.9)
    assert emergency.current_level() == 3 and backend.reads == 1
    em_clock.advance(0.1)
    assert emergency.current_level() == 3 and backend.reads == 2


def test_em1_another_process_sees_the_level_after_its_cache_expires(em_clock, emergency_state_file):
    """EM-1: a second view of the same file keeps its cached level until its cache period ends."""
    other = emergency.EmergencyMode(clock=em_clock)
    assert other.current_level() == 0  # cached for 30 s
    emergency.set_level(3, minutes=5)
    em_clock.advance(29.0)
    assert other.current_level() == 0
    em_clock.advance(1.0)
    assert other.current_level() == 3


# ---------------------------------------------------------------------------- read failures
def test_em1_corrupt_file_keeps_the_last_level_and_warns_once_per_interval(em_clock, emergency_state_file, caplog):
    """EM-1: a corrupt state file is a failed read: no exception, the last level kept (it still
    expires on its own schedule), emergency.read_failed at most once per warning interval."""
    emergency.set_level(3, minutes=10)
    emergency_state_file.write_text('{"level": 3, "expires_at": 17')  # torn / corrupt
    with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
        for _ in range(5):  # five cache periods of 30 s: 150 s, with a 60 s warning interval
            em_clock.advance(30.0)
            assert emergency.current_level() == 3
    warnings = _records(caplog, "emergency.read_failed")
    assert len(warnings) == 3  # at 30 s, 90 s and 150 s: once per 60 s interval
    assert "corrupt" in warnings[0].getMessage()
    status = emergency.status()
    assert status["level"] == 3 and status["error"]
    em_clock.advance(600.0)  # past the held level's expiry
    assert emergency.current_level() == 0


@pytest.mark.parametrize(
    "content", ["", "[]", '{"level": true}', '{"level": 9}', '{"level": 3, "expires_at": "soon"}', "\x00\x01"]
)
def test_em1_a_process_that_never_read_a_level_runs_unfrozen(content, em_clock, emergency_state_file, caplog):
    """EM-1: with an unreadable state from the start the process runs at level 0, without an exception."""
    emergency_state_file.write_text(content)
    with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
        assert emergency.current_level() == 0
        assert emergency.frozen() is False
    assert len(_records(caplog, "emergency.read_failed")) == 1
    with pytest.raises(BaldurError):
        emergency.status(strict=True)


def test_em1_set_level_replaces_a_corrupt_file_but_step_down_refuses(em_clock, emergency_state_file):
    """EM-1: an operator's set repairs a corrupt file; a step down cannot know the level and raises."""
    emergency_state_file.write_text("garbage")
    with pytest.raises(emergency.EmergencyStateError, match="unreadable"):
        emergency.step_down()
    assert emergency_state_file.read_text() == "garbage"
    emergency.set_level(2, minutes=5)
    assert json.loads(emergency_state_file.read_text())["level"] == 2


def test_em1_a_level_that_cannot_be_written_raises_and_writes_nothing(em_clock, tmp_path, monkeypatch):
    """EM-1: the state file's directory is missing or read-only: set_level raises a BaldurError
    naming the file, and nothing (no temp file either) is left behind."""
    missing = tmp_path / "no-such-dir" / "level.json"
    monkeypatch.setenv("BALDUR_EMERGENCY_STATE_FILE", str(missing))
    emergency.mode.source.reset()
    with pytest.raises(BaldurError, match="no-such-dir"):
        emergency.set_level(3, minutes=5)
    assert not missing.parent.exists()
    if os.geteuid() == 0:
        return  # root writes into read-only directories; the missing directory covered it
    locked = tmp_path / "ro"
    locked.mkdir()
    (locked / "level.json.lock").write_text("")
    os.chmod(locked, stat.S_IRUSR | stat.S_IXUSR)
    try:
        monkeypatch.setenv("BALDUR_EMERGENCY_STATE_FILE", str(locked / "level.json"))
        emergency.mode.source.reset()
        with pytest.raises(BaldurError):
            emergency.set_level(3, minutes=5)
        assert sorted(p.name for p in locked.iterdir()) == ["level.json.lock"]
    finally:
        os.chmod(locked, stat.S_IRWXU)


def test_em1_file_write_leaves_no_temp_file_and_is_readable_by_others(em_clock, emergency_state_file):
    """EM-1: a write renames its temp file over the state file (mode 0644), leaving no temp file."""
    emergency.set_level(1, minutes=5)
    emergency.set_level(2, minutes=5)
    names = sorted(p.name for p in emergency_state_file.parent.iterdir())
    assert names == ["level.json", "level.json.lock"]
    assert stat.S_IMODE(emergency_state_file.stat().st_mode) == 0o644


# ------------------------------------------------------------------------ two processes
@pytest.mark.multiprocess
def test_em1_file_backend_two_processes(peer, emergency_state_file):
    """EM-1: (real clocks in both processes) a level set in this process reaches a second real process through the file once the
    peer's cache (1 s, from its environment) expires; the peer's first read after the write is
    still its cached 0, and it needed no more than a few backend reads to see the change."""
    other = peer("file", BALDUR_EMERGENCY_CACHE_SECONDS="1")
    assert other.hello == {"ready": True, "level": 0, "django": False}
    emergency.set_level(3, minutes=10, actor="here")
    answer = other.ask(op="wait", level=3, timeout=15)
    assert answer["first"] == 0 and answer["level"] == 3
    assert 1 <= answer["reads"] <= 3  # the cache, not a read per poll
    assert other.ask(op="set", level=1, minutes=5) == {"level": 1}  # the peer writes, we read
    assert emergency.current_level() == 3  # our cache is still fresh
    assert emergency.refresh() == 1


# --------------------------------------------------------------------------------- redis
@pytest.mark.redis
def test_em1_redis_key_is_hash_tagged(redis_level, em_clock):
    """EM-1/ST-2: the level lives in one hash-tagged key, as JSON."""
    emergency.use_backend(redis_level)
    emergency.set_level(2, minutes=5)
    assert redis_level.key == f"{redis_level.prefix}:{{emergency}}:level"
    assert json.loads(redis_level.client.get(redis_level.key))["level"] == 2


@pytest.mark.redis
@pytest.mark.multiprocess
def test_em1_redis_backend_two_processes(peer, redis_level):
    """EM-1: a second real process reads the level this one wrote in Redis after its cache expires."""
    emergency.use_backend(redis_level)
    other = peer(f"redis:redis://127.0.0.1:6379/12|{redis_level.prefix}", BALDUR_EMERGENCY_CACHE_SECONDS="1")
    assert other.hello["level"] == 0
    emergency.set_level(3, minutes=10)
    answer = other.ask(op="wait", level=3, timeout=15)
    assert answer["first"] == 0 and answer["level"] == 3
    other.ask(op="set", level=2, minutes=5)
    assert emergency.current_level() == 3
    assert emergency.refresh() == 2


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.redis
def test_em1_unreachable_redis_keeps_the_last_level_and_warns_once(redis_level, em_clock, caplog):
    """EM-1: Redis goes away (a closed local port): readers keep the last level without an
    exception, warn once per interval, and the held level still expires on its own; a set
    raises a BaldurError."""
    from baldur_django.core.stores.redis import connect

    emergency.use_backend(redis_level)
    emergency.set_level(3, minutes=3)
    redis_level.client = connect(f"redis://127.0.0.1:{_closed_port()}/0", socket_timeout=0.2)
    with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
        em_clock.advance(30.0)
        assert emergency.current_level() == 3
        em_clock.advance(29.0)
        assert emergency.frozen()  # cache still fresh: no second attempt
        em_clock.advance(1.0)
        assert emergency.frozen()  # a second failed read inside the warning interval: no warning
    assert len(_records(caplog, "emergency.read_failed")) == 1
    with pytest.raises(BaldurError, match="Redis"):
        emergency.set_level(1, minutes=5)
    em_clock.advance(120.0)  # past the 3 minutes
    assert emergency.current_level() == 0


def test_em1_redis_backend_without_url_is_a_read_failure_not_an_exception(em_clock, monkeypatch, caplog):
    """EM-1/CFG-3: the redis backend with no Redis configured: readers run at 0 and warn; a set raises ConfigError."""
    monkeypatch.setenv("BALDUR_EMERGENCY_BACKEND", "redis")
    emergency.mode.source.reset()
    emergency.set_redis_client_factory(None)
    try:
        with caplog.at_level(logging.WARNING, logger="baldur.emergency"):
            assert emergency.current_level() == 0
        assert "BALDUR_REDIS_URL" in _records(caplog, "emergency.read_failed")[0].getMessage()
        with pytest.raises(ConfigError, match="BALDUR_REDIS_URL"):
            emergency.set_level(3, minutes=5)
    finally:
        import baldur_django.emergency  # the facade installs the Django-aware factory

        emergency.set_redis_client_factory(baldur_django.emergency._django_redis_client)
