"""Tables, goal verdicts and JSON output for the benchmark results."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scenarios import (
    APROTECT_KNOB_ROW,
    APROTECT_ROW,
    CIRCUIT_BREAKER,
    CIRCUITBREAKER,
    CONTENDERS,
    PROTECT_KNOB_ROW,
    PROTECT_KNOBS3_ROW,
    PROTECT_KNOBS5_ROW,
    PROTECT_ROW,
    PROTECTED,
    PYBREAKER,
    RESPONSE_ROW,
    RETRY_ROW,
    BenchSettings,
    ScenarioResult,
)
from .stage_rows import STAGE_GOALS

__all__ = ["Goal", "GOALS", "Verdict", "evaluate", "evaluate_runs", "format_report", "to_json"]


@dataclass(frozen=True)
class Goal:
    """``subject / reference`` in *scenario* must be <= *limit* (or >= when higher is better).

    A goal whose *reference* is ``None`` is absolute: the subject's own figure (in the
    scenario's unit, e.g. bytes) must be <= *limit*.
    """

    text: str
    scenario: str
    subject: str
    reference: str | None
    limit: float
    higher_is_better: bool = False


# The call-style goals. The call styles (protect/aprotect, retry) are compared with
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
    # The knob-count rows ("decorator" is ``protected``, as for the call-style rows).
    Goal(
        "protect(name, fn, retry=False, failure_threshold=5, recovery_timeout=3600) overhead <= 1.5 x protected's",
        "closed",
        PROTECT_KNOBS3_ROW,
        PROTECTED,
        1.5,
    ),
    Goal(
        "protect(name, fn, five knobs) overhead <= 1.5 x protected's",
        "closed",
        PROTECT_KNOBS5_ROW,
        PROTECTED,
        1.5,
    ),
    Goal(
        "flat in the knobs: protect(name, fn, five knobs) overhead <= 1.2 x protect(name, fn, one knob)'s",
        "closed",
        PROTECT_KNOBS5_ROW,
        PROTECT_KNOB_ROW,
        1.2,
    ),
    Goal(
        "creating a breaker and its first call <= 2 x pybreaker's",
        "create",
        CIRCUIT_BREAKER,
        PYBREAKER,
        2.0,
    ),
    Goal("memory per breaker, default config (window of 100) <= 2048 bytes", "memory", CIRCUIT_BREAKER, None, 2048),
    *(Goal(text, "stages", row, reference, limit) for text, row, reference, limit in STAGE_GOALS),
)


@dataclass(frozen=True)
class Verdict:
    """One goal's outcome: ``status`` is ``PASS``, ``MISS`` or ``N/A`` (not measured or
    the reference figure is not positive, so no ratio can be formed).

    ``ratio`` decides: with several runs it is the median of ``ratios``, the figure of
    each run (``None`` where that run could not form it)."""

    goal: Goal
    ratio: float | None
    status: str
    ratios: tuple[float | None, ...] = ()


def _ratio(goal: Goal, result: ScenarioResult) -> float | None:
    subject = result.value(goal.subject)
    if goal.reference is None:
        return subject
    reference = result.value(goal.reference)
    if subject is None or reference is None or reference <= 0:
        return None
    return subject / reference


def _verdict(goal: Goal, ratios: list[float | None]) -> Verdict:
    known = [r for r in ratios if r is not None]
    if not known:
        return Verdict(goal, None, "N/A", tuple(ratios))
    ratio = statistics.median(known)
    ok = ratio >= goal.limit if goal.higher_is_better else ratio <= goal.limit
    return Verdict(goal, ratio, "PASS" if ok else "MISS", tuple(ratios))


def evaluate(results: dict[str, ScenarioResult]) -> list[Verdict]:
    """The verdict of every goal whose scenario is in *results* (one run)."""
    return evaluate_runs([results])


def evaluate_runs(runs: Sequence[dict[str, ScenarioResult]]) -> list[Verdict]:
    """The verdict of every goal whose scenario is in the first run, decided by the median
    of its ratio over *runs* (each a separate interleaved run of the same scenarios)."""
    verdicts = []
    for goal in GOALS:
        if not runs or goal.scenario not in runs[0]:
            continue
        verdicts.append(
            _verdict(goal, [_ratio(goal, run[goal.scenario]) if goal.scenario in run else None for run in runs])
        )
    return verdicts


def _figure(goal: Goal, value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f} B" if goal.reference is None else f"{value:.2f}"


def _cell(result: ScenarioResult, name: str) -> str:
    if name in result.missing:
        return "n/a"
    value = result.value(name)
    if value is None:
        return "-"
    if result.throughput:
        sample = result.samples[name]
        return f"{value / 1e6:.2f} M/s ({sample.overhead:.2f}x)"
    if result.unit != "ns":
        return f"{value:.0f} {result.unit}"
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


def _runs(results: dict[str, ScenarioResult] | Sequence[dict[str, ScenarioResult]]) -> list[dict[str, ScenarioResult]]:
    return [results] if isinstance(results, dict) else list(results)


def _details(result: ScenarioResult) -> list[list[str]]:
    rows = []
    for name, sample in [*result.samples.items(), *result.extra.items()]:
        low, high = sample.spread()
        if result.throughput:
            rows.append(
                [
                    f"{result.key} / {name}",
                    f"{sample.median / 1e6:.3f} M/s",
                    f"{sample.overhead:.3f}x",
                    f"{low:.3f}..{high:.3f}x",
                ]
            )
        elif result.unit != "ns":
            rows.append([f"{result.key} / {name}", f"{sample.median:.0f} {result.unit}", "", ""])
        else:
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
    return rows


def format_report(
    results: dict[str, ScenarioResult] | Sequence[dict[str, ScenarioResult]],
    env: dict[str, Any],
    settings: BenchSettings,
    elapsed: float,
) -> str:
    """The human-readable report: environment, headline table and details of each run, and
    the goal verdicts (with several runs: every run's ratio, the median deciding)."""
    runs = _runs(results)
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
        f"{len(runs)} run(s), each of {settings.rounds} interleaved rounds x {settings.calls} calls (closed), "
        f"{settings.reject_calls} (open), {settings.async_calls} (async); {settings.thread_rounds} rounds x "
        f"{settings.threads} threads x {settings.per_thread} calls; {settings.create_rounds} rounds x "
        f"{settings.create_calls} new breakers (create); {settings.memory_breakers} breakers traced (memory); "
        f"took {elapsed:.0f} s"
    )
    out.append(f"clock of the closed/open/async/create loops: {env.get('clock', 'wall')} time (threads: wall time)")
    if "loadavg_end" in env:
        out.append(f"load average at the end: {env['loadavg_end'][0]:.2f}")
    for index, run in enumerate(runs, 1):
        out.append("")
        head = f"Run {index} of {len(runs)}: m" if len(runs) > 1 else "M"
        out.append(
            f"{head}edian overhead per call over a bare call (lower is better); thread rows: calls/s "
            "(x bare, higher is better); memory: bytes per breaker"
        )
        rows = [["scenario", "bare", *CONTENDERS]]
        for result in run.values():
            if result.throughput:
                bare = f"{result.bare / 1e6:.2f} M/s"
            elif result.unit != "ns":
                bare = "-"
            else:
                bare = f"{result.bare:.0f} ns"
            rows.append([result.title, bare, *(_cell(result, name) for name in CONTENDERS)])
        out.append(_table(rows))
        out.append("")
        out.append("Details: median per call, and the p25..p75 spread of the paired per-round figure")
        rows = [["scenario / contender", "median", "over bare", "p25..p75"]]
        for result in run.values():
            rows.extend(_details(result))
        out.append(_table(rows))

    verdicts = evaluate_runs(runs)
    if verdicts:
        out.append("")
        out.append(
            "Goals"
            + (f" (the median of {len(runs)} runs decides; each run's figure in brackets)" if len(runs) > 1 else "")
        )
        for verdict in verdicts:
            goal = verdict.goal
            limit = f"{goal.limit:g} B" if goal.reference is None else f"{goal.limit:g}"
            label = "value" if goal.reference is None else "ratio"
            if verdict.ratio is None:
                figure = f"{label} n/a"
            else:
                figure = f"{label} {_figure(goal, verdict.ratio)} (limit {limit})"
            if len(runs) > 1:
                figure += " [" + ", ".join(_figure(goal, r) for r in verdict.ratios) + "]"
            out.append(f"  {verdict.status:<4}  {goal.text}: {figure}")
    return "\n".join(out)


def _run_json(results: dict[str, ScenarioResult]) -> dict[str, Any]:
    scenarios = {}
    for key, result in results.items():
        scenarios[key] = {
            "title": result.title,
            "throughput": result.throughput,
            "unit": result.unit,
            "bare": result.bare,
            "contenders": {
                name: {"median": s.median, "over_bare": s.overhead, "spread": s.spread()}
                for name, s in [*result.samples.items(), *result.extra.items()]
            },
            "missing": result.missing,
        }
    return scenarios


def to_json(
    results: dict[str, ScenarioResult] | Sequence[dict[str, ScenarioResult]],
    env: dict[str, Any],
    settings: BenchSettings,
) -> dict[str, Any]:
    """A JSON-ready dict of every figure and verdict (for comparing runs). ``scenarios`` is
    the first run's; ``runs`` holds every run's; each goal lists every run's ratio."""
    runs = _runs(results)
    return {
        "environment": env,
        "settings": settings.__dict__,
        "scenarios": _run_json(runs[0]) if runs else {},
        "runs": [_run_json(run) for run in runs],
        "goals": [
            {"goal": v.goal.text, "ratio": v.ratio, "status": v.status, "ratios": list(v.ratios)}
            for v in evaluate_runs(runs)
        ],
    }
