"""Where the emergency record is kept: a file per host, a Redis key, or this process's memory.

Every backend offers the same two operations: :meth:`LevelBackend.read` and an atomic
read-modify-write :meth:`LevelBackend.update`. The rules of what a change writes live in
:mod:`.record` and :mod:`.activation`; the backends only store text.

* :class:`FileLevelBackend` (``BALDUR_EMERGENCY_BACKEND="file"``, the default): one JSON file,
  replaced by renaming a temporary file with a unique name in the same directory (never a
  torn read); writers serialise on an ``flock`` of ``<file>.lock``.
* :class:`RedisLevelBackend` (``"redis"``): one hash-tagged key, changed by a compare-and-set
  script and tried again when another writer got there first.
* :class:`MemoryLevelBackend`: tests and single-process tools (not a setting).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..config import SettingsSource
from ..errors import ConfigError
from .record import EmergencyReadError, EmergencyStateError, LevelState, decode, encode

__all__ = [
    "Change",
    "LevelBackend",
    "MemoryLevelBackend",
    "FileLevelBackend",
    "RedisLevelBackend",
    "default_redis_client",
    "redis_client_factory",
    "install_redis_client_factory",
]

#: A read-modify-write step: gets the current record (None when corrupt), returns the new
#: one or None to write nothing.
Change = Callable[["LevelState | None"], "LevelState | None"]


def project_level_file(environ: Any = None, modules: Any = None) -> str:
    """The level file used when ``BALDUR_EMERGENCY_STATE_FILE`` is unset.

    A file in the system temp directory whose name is derived from the Django project (the
    path of its settings module), so every process of one project on a host shares it and
    two projects on the same host never do: a level declared for one site cannot freeze
    another. Without Django (no ``DJANGO_SETTINGS_MODULE``) the name comes from the path of
    the running program's main module.

    Args:
        environ (Mapping[str, str] | None): environment variables (``os.environ`` by default).
        modules (Mapping[str, module] | None): loaded modules (``sys.modules`` by default).

    Returns:
        str: ``<temp dir>/baldur_emergency_<12 hex digits>.json``.
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    name = environ.get("DJANGO_SETTINGS_MODULE") or "__main__"
    module = modules.get(name)
    where = getattr(module, "__file__", None) or name
    identity = os.path.realpath(where) if where != name else name
    digest = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"baldur_emergency_{digest}.json")


class LevelBackend(Protocol):
    """Where the level is kept. ``name`` is ``"file"``, ``"redis"`` or ``"memory"``."""

    name: str

    def read(self) -> LevelState:
        """The stored record (level 0 when none). Raises EmergencyReadError."""

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        """Atomic read-modify-write. *change* gets the current record (None when it is
        corrupt) and returns the new one, or None to write nothing; it may run more than
        once and must not have side effects. Returns ``(before, written)``.

        Raises:
            EmergencyStateError: the record could not be stored; nothing changed.
        """


class MemoryLevelBackend:
    """The level in this process only: tests and single-process tools (not a setting)."""

    name = "memory"

    def __init__(self, raw: str | None = None) -> None:
        self._raw = raw
        self._lock = threading.Lock()

    def read(self) -> LevelState:
        return decode(self._raw)

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        with self._lock:
            try:
                current: LevelState | None = decode(self._raw)
            except EmergencyReadError:
                current = None
            new = change(current)
            if new is not None:
                self._raw = encode(new)
            return current, new

    def corrupt(self, raw: str) -> None:
        """Store *raw* as it is (tests of corrupt records)."""
        self._raw = raw


class FileLevelBackend:
    """The level in a JSON file on this host, replaced atomically.

    Args:
        path: the state file (``BALDUR_EMERGENCY_STATE_FILE``). Its directory must exist.
    """

    name = "file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._seen: tuple[bytes, LevelState] | None = None  # the last text decoded and its record

    def read(self) -> LevelState:
        """The record in the file (level 0 when there is none).

        Costs one open and one read of a small file; unchanged text is not decoded again.

        Raises:
            EmergencyReadError: the file cannot be read or is corrupt.
        """
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return LevelState()
        except OSError as exc:
            raise EmergencyReadError(f"cannot read {self.path}: {exc}") from None
        seen = self._seen
        if seen is not None and seen[0] == raw:
            return seen[1]
        state = decode(raw)
        self._seen = (raw, state)
        return state

    def _write(self, data: bytes) -> None:
        """Temp file with a unique name in the same directory, fsync, rename over the file."""
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        try:
            lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EmergencyStateError(f"cannot write the emergency level to {self.path}: {exc}") from None
        try:
            try:
                import fcntl

                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            except ImportError:  # pragma: no cover - not POSIX: the rename is still atomic
                pass
            try:
                current: LevelState | None = self.read()
            except EmergencyReadError:
                current = None
            new = change(current)
            if new is not None:
                try:
                    self._write(encode(new).encode("utf-8"))
                except OSError as exc:
                    raise EmergencyStateError(f"cannot write the emergency level to {self.path}: {exc}") from None
            return current, new
        finally:
            os.close(lock_fd)  # releases the flock


#: Compare-and-set of the level key: KEYS[1] the key; ARGV[1] "1" when the writer read a
#: value (ARGV[2]), "0" when it read none; ARGV[3] the new document. 1 when stored, 0 when
#: another writer changed the key since it was read.
_COMPARE_AND_SET = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if current ~= ARGV[2] then return 0 end
elseif current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
"""
_CAS_ATTEMPTS = 20


class RedisLevelBackend:
    """The level in Redis key ``<prefix>:{emergency}:level``.

    A change reads the key, computes the new state and stores it with a compare-and-set
    script (one key, so the same on a Redis Cluster); when another writer got there
    first it reads again (at most 20 attempts).

    Args:
        client: a redis-py client (the one the breaker store would use), a cluster client included.
        prefix: key prefix, ``"baldur"`` by default.
    """

    name = "redis"

    def __init__(self, client: Any, prefix: str = "baldur") -> None:
        self.client = client
        self.key = f"{prefix}:{{emergency}}:level"
        self._cas = client.register_script(_COMPARE_AND_SET)

    def read(self) -> LevelState:
        try:
            raw = self.client.get(self.key)
        except Exception as exc:  # redis.RedisError, OSError: the backend did not answer
            raise EmergencyReadError(f"redis read failed: {type(exc).__name__}: {exc}") from None
        return decode(raw)

    def update(self, change: Change) -> tuple[LevelState | None, LevelState | None]:
        for attempt in range(_CAS_ATTEMPTS):
            if attempt:
                # another writer won the last round: a short random pause before the next
                # read, growing with each lost round, so writers that keep colliding spread
                # out instead of retrying in step (at most about 0.2 s over all rounds)
                time.sleep(random.uniform(0.0, 0.001 * attempt))
            try:
                raw = self.client.get(self.key)
            except Exception as exc:  # redis errors: nothing was stored
                raise EmergencyStateError(
                    f"cannot read the emergency level from Redis: {type(exc).__name__}: {exc}"
                ) from None
            try:
                current: LevelState | None = decode(raw)
            except EmergencyReadError:
                current = None
            new = change(current)
            if new is None:
                return current, None
            try:
                stored = self._cas(
                    keys=[self.key], args=["0" if raw is None else "1", raw or "", encode(new)], client=self.client
                )
            except Exception as exc:  # redis errors: nothing was stored
                raise EmergencyStateError(
                    f"cannot write the emergency level to Redis: {type(exc).__name__}: {exc}"
                ) from None
            if stored:
                return current, new
        raise EmergencyStateError(
            f"cannot write the emergency level to Redis: other writers changed it {_CAS_ATTEMPTS} times in a row"
        )


def default_redis_client(source: SettingsSource) -> Any:
    """A redis-py client built from ``BALDUR_REDIS_URL`` (plain Python, no Django).

    Args:
        source: the settings (``BALDUR_REDIS_URL``, ``BALDUR_REDIS_SOCKET_TIMEOUT`` in
            seconds, ``BALDUR_REDIS_MAX_CONNECTIONS``, ``BALDUR_REDIS_CLUSTER``).

    Returns:
        The client (a cluster client when ``BALDUR_REDIS_CLUSTER`` is on).

    Raises:
        ConfigError: ``BALDUR_REDIS_URL`` is not set.
    """
    url = source.get("BALDUR_REDIS_URL")
    if not url:
        raise ConfigError("BALDUR_EMERGENCY_BACKEND='redis' without Django needs BALDUR_REDIS_URL")
    from ..stores.redis import connect

    return connect(
        url,
        source.get("BALDUR_REDIS_SOCKET_TIMEOUT"),
        source.get("BALDUR_REDIS_MAX_CONNECTIONS"),
        cluster=source.get("BALDUR_REDIS_CLUSTER"),
    )


_redis_client_factory: Callable[[], Any] | None = None


def redis_client_factory() -> Callable[[], Any] | None:
    """The installed builder of the Redis backend's client (None: :func:`default_redis_client`)."""
    return _redis_client_factory


def install_redis_client_factory(factory: Callable[[], Any] | None) -> None:
    """Install how the Redis backend gets its client; see the package's ``set_redis_client_factory``.

    Args:
        factory: a callable with no arguments returning a redis-py client, or None.
    """
    global _redis_client_factory
    _redis_client_factory = factory
