"""Tables, goal verdicts and JSON output for the benchmark results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .scenarios import (
    APROTECT_KNOB_ROW,
    APROTECT_ROW,
    CIRCUIT_BREAKER,
    CIRCUITBREAKER,
    CONTENDERS,
    PROTECT_KNOB_ROW,
    PROTECT_ROW,
    PROTECTED,
    RESPONSE_ROW,
    RETRY_ROW,
    BenchSettings,
    ScenarioResult,
)

__all__ = ["Goal", "GOALS", "Verdict", "evaluate", "format_report", "to_json"]


@dataclass(frozen=True)
class Goal:
    """``subject / reference`` in *scenario* must be <= *limit* (or >= when higher is better)."""

    text: str
    scenario: str
    subject: str
    reference: str
    limit: float
    higher_is_better: bool = False


# Issue 12's goals. The call styles (protect/aprotect, retry) are compared with
# ``protected``, the decorator with the same options; ``circuit_breaker`` builds the same
# wrapper, so either reference gives the same ratio up to noise.
GOALS = (
    Goal(
        "circuit_breaker CLOSED-success overhead <= 0.40 x circuitbreaker's",
        "closed",
        CIRCUIT_BREAKER,
        CIRCUITBREAKER,
        0.40,
    ),
    Goal(
        "protected (no retry, no fallback) CLOSED overhead <= 1.5 x circuit_breaker's",
        "closed",
        PROTECTED,
        CIRCUIT_BREAKER,
        1.5,
    ),
    Goal(
        "circuit_breaker returning a response (status 200) overhead <= 0.5 x circuitbreaker's",
        "closed",
        RESPONSE_ROW,
        CIRCUITBREAKER,
        0.5,
    ),
    Goal("protected(retry=True), success first time, overhead <= 2 x protected's", "closed", RETRY_ROW, PROTECTED, 2.0),
    Goal("protect(name, fn) overhead <= 1.5 x protected's", "closed", PROTECT_ROW, PROTECTED, 1.5),
    Goal(
        "protect(name, fn, failure_threshold=3) overhead <= 1.5 x protected's",
        "closed",
        PROTECT_KNOB_ROW,
        PROTECTED,
        1.5,
    ),
    Goal(
        "circuit_breaker OPEN-rejection overhead <= 0.75 x circuitbreaker's",
        "open",
        CIRCUIT_BREAKER,
        CIRCUITBREAKER,
        0.75,
    ),
    Goal("protected OPEN-rejection overhead <= 0.75 x circuitbreaker's", "open", PROTECTED, CIRCUITBREAKER, 0.75),
    Goal("circuit_breaker async overhead <= circuitbreaker's", "async", CIRCUIT_BREAKER, CIRCUITBREAKER, 1.0),
    Goal("protected async overhead <= circuitbreaker's", "async", PROTECTED, CIRCUITBREAKER, 1.0),
    Goal(
        "async protected(retry=True), success first time, overhead <= 2 x protected's",
        "async",
        RETRY_ROW,
        PROTECTED,
        2.0,
    ),
    Goal("aprotect(name, factory) overhead <= 1.5 x async protected's", "async", APROTECT_ROW, PROTECTED, 1.5),
    Goal(
        "aprotect(name, factory, failure_threshold=3) overhead <= 1.5 x async protected's",
        "async",
        APROTECT_KNOB_ROW,
        PROTECTED,
        1.5,
    ),
    Goal(
        "circuit_breaker thread throughput >= circuitbreaker's", "threads", CIRCUIT_BREAKER, CIRCUITBREAKER, 1.0, True
    ),
    Goal("protected thread throughput >= circuitbreaker's", "threads", PROTECTED, CIRCUITBREAKER, 1.0, True),
    Goal("protect(name, fn) thread throughput >= 0.5 x protected's", "threads", PROTECT_ROW, PROTECTED, 0.5, True),
    Goal(
        "protect(name, fn, failure_threshold=3) thread throughput >= 0.5 x protected's",
        "threads",
        PROTECT_KNOB_ROW,
        PROTECTED,
        0.5,
        True,
    ),
)


@dataclass(frozen=True)
class Verdict:
    """One goal's outcome: ``status`` is ``PASS``, ``MISS`` or ``N/A`` (not measured or
    the reference figure is not positive, so no ratio can be formed)."""

    goal: Goal
    ratio: float | None
    status: str


def evaluate(results: dict[str, ScenarioResult]) -> list[Verdict]:
    """The verdict of every goal whose scenario is in *results*."""
    verdicts = []
    for goal in GOALS:
        result = results.get(goal.scenario)
        if result is None:
            continue
        subject, reference = result.value(goal.subject), result.value(goal.reference)
        if subject is None or reference is None or reference <= 0:
            verdicts.append(Verdict(goal, None, "N/A"))
            continue
        ratio = subject / reference
        ok = ratio >= goal.limit if goal.higher_is_better else ratio <= goal.limit
        verdicts.append(Verdict(goal, ratio, "PASS" if ok else "MISS"))
    return verdicts


def _cell(result: ScenarioResult, name: str) -> str:
    if name in result.missing:
        return "n/a"
    value = result.value(name)
    if value is None:
        return "-"
    if result.throughput:
        sample = result.samples[name]
        return f"{value / 1e6:.2f} M/s ({sample.overhead:.2f}x)"
    return f"+{value:.0f} ns" if value >= 0 else f"{value:.0f} ns"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        lines.append(
            "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        )
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_report(
    results: dict[str, ScenarioResult], env: dict[str, Any], settings: BenchSettings, elapsed: float
) -> str:
    """The human-readable report: environment, headline table, details, goal verdicts."""
    out = []
    out.append(
        f"Python {env['python']} ({env['implementation']}) on {env['platform']}; "
        f"{env['usable_cpus']} usable CPU(s) of {env['cpus']}; load average {env['loadavg'][0]:.2f} at start"
    )
    out.append(
        f"baldur_django {env['baldur_django']} (window {env['baldur_window']}, rate threshold "
        f"{env['baldur_rate_threshold']:g}%, consecutive threshold {env['baldur_failure_threshold']}), "
        f"pybreaker {env['pybreaker']}, circuitbreaker {env['circuitbreaker']}; switch interval {env['switchinterval'] * 1e3:g} ms"
    )
    out.append(f"baldur state backend: {env['baldur_store']} (BALDUR_STATE_BACKEND); git {env['git']}")
    out.append(
        f"{settings.rounds} interleaved rounds x {settings.calls} calls (closed), {settings.reject_calls} (open), "
        f"{settings.async_calls} (async); {settings.thread_rounds} rounds x {settings.threads} threads x "
        f"{settings.per_thread} calls; took {elapsed:.0f} s"
    )
    out.append(f"clock of the closed/open/async loops: {env.get('clock', 'wall')} time (threads: wall time)")
    out.append("")
    out.append(
        "Median overhead per call over a bare call (lower is better); thread rows: calls/s (x bare, higher is better)"
    )
    rows = [["scenario", "bare", *CONTENDERS]]
    for result in results.values():
        bare = f"{result.bare / 1e6:.2f} M/s" if result.throughput else f"{result.bare:.0f} ns"
        rows.append([result.title, bare, *(_cell(result, name) for name in CONTENDERS)])
    out.append(_table(rows))

    out.append("")
    out.append("Details: median per call, and the p25..p75 spread of the paired per-round figure")
    rows = [["scenario / contender", "median", "over bare", "p25..p75"]]
    for result in results.values():
        for name, sample in [*result.samples.items(), *result.extra.items()]:
            if result.throughput:
                low, high = sample.spread()
                rows.append(
                    [
                        f"{result.key} / {name}",
                        f"{sample.median / 1e6:.3f} M/s",
                        f"{sample.overhead:.3f}x",
                        f"{low:.3f}..{high:.3f}x",
                    ]
                )
            else:
                low, high = sample.spread()
                rows.append(
                    [
                        f"{result.key} / {name}",
                        f"{sample.median:.0f} ns",
                        f"+{sample.overhead:.0f} ns",
                        f"{low:.0f}..{high:.0f} ns",
                    ]
                )
        for name, why in result.missing.items():
            rows.append([f"{result.key} / {name}", "n/a", why, ""])
    out.append(_table(rows))

    verdicts = evaluate(results)
    if verdicts:
        out.append("")
        out.append("Goals")
        for verdict in verdicts:
            ratio = (
                "ratio n/a" if verdict.ratio is None else f"ratio {verdict.ratio:.2f} (limit {verdict.goal.limit:g})"
            )
            out.append(f"  {verdict.status:<4}  {verdict.goal.text}: {ratio}")
    return "\n".join(out)


def to_json(results: dict[str, ScenarioResult], env: dict[str, Any], settings: BenchSettings) -> dict[str, Any]:
    """A JSON-ready dict of every figure and verdict (for comparing runs)."""
    scenarios = {}
    for key, result in results.items():
        scenarios[key] = {
            "title": result.title,
            "throughput": result.throughput,
            "bare": result.bare,
            "contenders": {
                name: {"median": s.median, "over_bare": s.overhead, "spread": s.spread()}
                for name, s in [*result.samples.items(), *result.extra.items()]
            },
            "missing": result.missing,
        }
    return {
        "environment": env,
        "settings": settings.__dict__,
        "scenarios": scenarios,
        "goals": [{"goal": v.goal.text, "ratio": v.ratio, "status": v.status} for v in evaluate(results)],
    }
