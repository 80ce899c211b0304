"""The command line shared by the Redis-backed benchmarks (``benchmarks.stores``, ``benchmarks.inbound``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any


def run_redis_bench(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    default_url: str,
    settings: tuple[Any, Any],
    bench: Callable[..., Any],
    render: Callable[[Any], str],
    as_json: Callable[[Any], Any],
    quick: bool | None = None,
    json_file: str | None = None,
    redis_url: str | None = None,
    quiet: tuple[str, ...] = ("baldur",),
) -> int:
    """Parse ``[--quick] [--redis-url URL] [--json FILE]``, run *bench*, print *render*'s text.

    Args:
        settings: ``(default, quick)`` settings dataclasses with a ``redis_url`` field.
        quick, json_file, redis_url: override the parsed arguments (for tests).
        quiet: loggers silenced during the run (breakers trip on purpose).

    Returns:
        The exit code: 0, or 2 when Redis cannot be reached (a usage problem, not a crash).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help="a short run (noisier figures)")
    parser.add_argument("--redis-url", default=default_url, help=f"server and database to use (default {default_url})")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the figures as JSON to FILE")
    args = parser.parse_args(argv or [])
    quick = args.quick if quick is None else quick
    json_file = args.json if json_file is None else json_file
    chosen = settings[1] if quick else settings[0]
    url = redis_url or args.redis_url
    if url != default_url:
        chosen = replace(chosen, redis_url=url)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        result = bench(chosen, progress=lambda text: print(f"measuring {text} ...", file=sys.stderr, flush=True))
    except Exception as exc:
        import redis

        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            print(f"cannot reach Redis at {chosen.redis_url}: {exc}", file=sys.stderr)
            return 2
        raise
    print(render(result))
    if json_file:
        with open(json_file, "w", encoding="utf-8") as handle:
            json.dump(as_json(result), handle, indent=2)
    return 0
