"""What the failure predicates cost: ``python -m benchmarks --predicates [--quick] [--rounds N] [--cpu-time]``.

The CLOSED success of ``circuit_breaker`` (a plain value, and a response with status 200),
as the median overhead over a bare call with the interleaved harness, in one process:

* ``no predicates``: the defaults;
* ``exception predicates``: ``ignore_exceptions=(KeyError, f)`` and ``failure_predicate=f``,
  which a call that returns never consults: the overhead must be the same;
* ``result_predicate``: ``result_predicate=f`` (``f`` answers False), which judges every
  returned value: the one setting that adds work to a success.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import baldur_django as baldur

from .harness import clock_name, interleave, loop_calls, use_cpu_time
from .scenarios import _target, _target_response

__all__ = ["measure", "main"]

VARIANTS: dict[str, dict[str, Any]] = {
    "no predicates": {},
    "exception predicates": {"ignore_exceptions": (KeyError, lambda exc: False), "failure_predicate": lambda exc: True},
    "result_predicate": {"result_predicate": lambda value: False},
}


def measure(rounds: int = 81, calls: int = 20_000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Median ns over a bare call per variant, for a plain value and a response.

    Returns:
        ``{"plain value" | "response 200": {variant: ns over bare}}``.
    """
    out: dict[str, dict[str, float]] = {}
    for label, target in (("plain value", _target), ("response 200", _target_response)):
        runners: dict[str, Callable[[int], int]] = {"bare": lambda n, t=target: loop_calls(t, n)}
        for name, options in VARIANTS.items():
            func = baldur.circuit_breaker(f"bench-predicates-{label}-{name}", **options)(target)
            for _ in range(300):  # a full, healthy window
                func()
            runners[name] = lambda n, f=func: loop_calls(f, n)
        samples = interleave(runners, baseline="bare", rounds=rounds, n=calls, seed=seed)
        out[label] = {name: samples[name].overhead for name in VARIANTS}
    return out


def main(argv: list[str] | None = None, *, quick: bool = False, rounds: int | None = None) -> int:
    """Print the table; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks --predicates")
    parser.add_argument("--cpu-time", action="store_true")
    args = parser.parse_args(argv or [])
    use_cpu_time(args.cpu_time)
    figures = measure(rounds=rounds or (25 if quick else 81), calls=5_000 if quick else 20_000)
    print(f"CLOSED success of circuit_breaker, median ns over a bare call ({clock_name()})")
    print(f"{'variant':<22} {'plain value':>12} {'response 200':>13}")
    for name in VARIANTS:
        print(f"{name:<22} {figures['plain value'][name]:>10.0f}ns {figures['response 200'][name]:>11.0f}ns")
    return 0
