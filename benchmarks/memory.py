"""Where a breaker's memory goes: a tracemalloc breakdown by source line.

``python -m benchmarks.memory [N]`` (or ``./dev bench --memory``) makes *N* breakers of the
default configuration through ``circuit_breaker(name)(f)`` and one call each, and prints the
bytes per breaker that every allocating source line is responsible for, largest first, with
what allocates there. The total is the figure of the bench's memory scenario.
"""

from __future__ import annotations

import gc
import linecache
import sys
import tracemalloc
from dataclasses import dataclass

import baldur_django as baldur

__all__ = ["Line", "breakdown", "format_breakdown", "main"]


@dataclass(frozen=True)
class Line:
    """One allocating source line: ``where`` (file:line), bytes and blocks per breaker, its code."""

    where: str
    bytes_per_breaker: float
    blocks_per_breaker: float
    code: str


def _target() -> int:
    return 1


def breakdown(count: int = 1_000, prefix: str = "bench.memory.breakdown") -> tuple[float, list[Line]]:
    """Trace *count* new default breakers (decorated, called once).

    Returns:
        (total bytes per breaker, the allocating lines largest first).
    """
    keep: list[object] = [None] * count
    names = [f"{prefix}.{i}" for i in range(count)]
    baldur.circuit_breaker(prefix + ".warm")(_target)()
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        start = tracemalloc.get_traced_memory()[0]
        for i, name in enumerate(names):
            func = baldur.circuit_breaker(name)(_target)
            func()
            keep[i] = func
        gc.collect()
        total = (tracemalloc.get_traced_memory()[0] - start) / count
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    lines = []
    for stat in after.compare_to(before, "lineno"):
        if stat.size_diff <= 0:
            continue
        frame = stat.traceback[0]
        where = f"{_short(frame.filename)}:{frame.lineno}"
        code = linecache.getline(frame.filename, frame.lineno).strip()
        lines.append(Line(where, stat.size_diff / count, stat.count_diff / count, code))
    lines.sort(key=lambda line: -line.bytes_per_breaker)
    return total, lines


def _short(filename: str) -> str:
    marker = "baldur_django/"
    index = filename.rfind(marker)
    return filename[index:] if index >= 0 else filename.rsplit("/", 1)[-1]


def format_breakdown(total: float, lines: list[Line], top: int = 30) -> str:
    """The breakdown as a table (lines under 8 bytes per breaker are summed up)."""
    out = [f"memory per breaker (default config, decorated, one call): {total:.0f} bytes", ""]
    out.append(f"{'bytes':>7}  {'blocks':>6}  where / code")
    shown = 0.0
    for line in lines[:top]:
        if line.bytes_per_breaker < 8:
            break
        shown += line.bytes_per_breaker
        out.append(f"{line.bytes_per_breaker:7.0f}  {line.blocks_per_breaker:6.2f}  {line.where}  {line.code[:90]}")
    out.append(f"{total - shown:7.0f}          (the rest)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    count = int(args[0]) if args else 1_000
    print(format_breakdown(*breakdown(count)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
