"""Showing that store I/O runs off the event loop, by event order rather than by timing.

A pytest plugin (loaded by tests/conftest.py) with the ``hung_redis`` fixture, plus
:class:`TickWatch`.

``hung_redis`` is a TCP server that accepts connections and answers nothing: a Redis
client's command hangs on it until :meth:`HungRedis.release` closes every connection (the
command then fails: store trouble). :class:`TickWatch` wraps the store and runs the code
under test next to a ticker task on the same event loop; the ticker counts its ticks, and
releases the hung server once it has ticked :data:`TICKS` times since the oldest store call
in flight began. So:

- store I/O in a worker thread: the loop keeps ticking while the call hangs, the ticker
  releases it, and that call saw at least ``TICKS`` ticks, however loaded the machine is;
- store I/O on the loop's thread: no tick can happen while the call blocks the loop, so
  the release never comes, the call ends at its socket timeout, and it saw 0 ticks.

Nothing is measured on a clock; the socket timeout (:data:`HANG_LIMIT`) only ends a hang
that the ticker can never release.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

#: ticks the loop must make while a store call hangs before the hung server lets it go
TICKS = 3
#: the store's socket timeout in the hung-store tests, seconds: it only ends a hang that the
#: ticker cannot release (store I/O on the loop), so it can be far longer than any stall
HANG_LIMIT = 5.0


class HungRedis:
    """A local TCP server that accepts connections and never answers, until released."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.05)  # how often the accept loop looks at the stop flag
        self.port: int = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran."""
        return self._released.is_set()

    def url(self) -> str:
        """A ``redis://`` URL for the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            with self._lock:
                if self._released.is_set():
                    conn.close()
                else:
                    self._held.append(conn)

    def release(self) -> None:
        """Close every held connection (a hung command fails at once); later ones are closed
        as soon as they are accepted."""
        with self._lock:
            self._released.set()
            held, self._held = self._held, []
        for conn in held:
            conn.close()

    def stop(self) -> None:
        """Stop accepting and close everything."""
        self._stop.set()
        self._thread.join(5)
        self.release()
        self._listener.close()


@pytest.fixture
def hung_redis() -> Iterator[HungRedis]:
    """A :class:`HungRedis`, stopped after the test."""
    server = HungRedis()
    yield server
    server.stop()


class TickWatch:
    """Wraps a store; counts a loop ticker's ticks during each call made to it.

    Args:
        inner: the store.
        hung: the server *inner* talks to, released after :data:`TICKS` ticks during a
            call; None for a store that does not hang.
    """

    def __init__(self, inner: Any, hung: HungRedis | None = None) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.hung = hung
        self.ticks = 0
        #: (operation, ticks during it) of every finished call, in the order they finished
        self.during: list[tuple[str, int]] = []
        self._open: list[int] = []  # the tick count at the start of each call in flight
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            start = self.ticks
            with self._lock:
                self._open.append(start)
            try:
                return target(*args, **kwargs)
            finally:
                end = self.ticks
                with self._lock:
                    self._open.remove(start)
                    self.during.append((name, end - start))

        return call

    def most_ticks_during_a_call(self) -> int:
        """The most ticks the loop made while any one store call ran (0: every call blocked
        the loop, or none was made)."""
        return max((ticks for _, ticks in self.during), default=0)

    def _tick(self) -> None:
        self.ticks += 1
        with self._lock:
            oldest = min(self._open, default=None)
        if self.hung is not None and oldest is not None and self.ticks - oldest >= TICKS:
            self.hung.release()

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await *awaitable* next to the ticker task; returns its result."""
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                await asyncio.sleep(0.001)
                self._tick()

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)  # the ticker is running before the code under test starts
        try:
            return await awaitable
        finally:
            done.set()
            await task
