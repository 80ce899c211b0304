"""EM-1: the file backend is written atomically (temp file + rename): a reader never sees a
torn document, and the harness below demonstrably catches a writer that is not atomic."""

from __future__ import annotations

import sys
import threading

from baldur_django.core import emergency


class InPlaceBackend(emergency.FileLevelBackend):
    """A deliberately wrong writer: truncates the file and writes it in two halves, pausing
    in between until the reader has read the file once (so a torn read is certain)."""

    def __init__(self, path, reader_read: threading.Event) -> None:
        super().__init__(path)
        self.reader_read = reader_read

    def _write(self, data: bytes) -> None:
        with open(self.path, "wb") as handle:
            handle.write(data[: len(data) // 2])
            handle.flush()
            self.reader_read.clear()
            self.reader_read.wait(2.0)
            handle.write(data[len(data) // 2 :])


def hammer(backend, reader_read: threading.Event, writes: int = 300) -> tuple[int, int]:
    """A writer thread rewrites levels 1..3 *writes* times while a reader thread reads the
    file as fast as it can. Returns ``(reads, torn)``: reads made and reads that were not a
    valid document."""
    backend.update(lambda current: emergency.LevelState(level=1, expires_at=2e9))
    start = threading.Barrier(2)
    done = threading.Event()
    counts = {"reads": 0, "torn": 0}

    def reader() -> None:
        start.wait()
        while not done.is_set():
            try:
                state = backend.read()
                assert state.level in (1, 2, 3)
            except (emergency.EmergencyReadError, AssertionError):
                counts["torn"] += 1
            counts["reads"] += 1
            reader_read.set()

    def writer() -> None:
        start.wait()
        try:
            for i in range(writes):
                level = 1 + i % 3
                backend.update(
                    lambda current, level=level: emergency.LevelState(
                        level=level, expires_at=2e9, reason="x" * (i % 50), actor="writer"
                    )
                )
        finally:
            done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(old)
    return counts["reads"], counts["torn"]


def test_em1_atomic_file_writes_are_never_torn(tmp_path):
    """EM-1: hundreds of rewrites under a hammering reader: every read is a valid document."""
    reads, torn = hammer(emergency.FileLevelBackend(tmp_path / "level.json"), threading.Event())
    assert reads > 0
    assert torn == 0


def test_em1_meta_the_hammer_catches_a_writer_that_is_not_atomic(tmp_path):
    """EM-1 (meta): the same harness with an in-place writer sees torn reads, so the test above
    would fail for a non-atomic implementation."""
    reader_read = threading.Event()
    reads, torn = hammer(InPlaceBackend(tmp_path / "level.json", reader_read), reader_read, writes=30)
    assert torn > 0, f"{reads} reads and none torn: the harness cannot see a non-atomic write"
