"""The outbound stages of the status rows, as lines of text for the status command and
pages (the row's ``stages`` section, :func:`~baldur_django.core.stages.figures.stage_section`)."""

from __future__ import annotations

from typing import Any

__all__ = ["stage_lines", "stage_table"]


def stage_lines(section: dict[str, Any]) -> list[tuple[str, str]]:
    """*section* (a row's ``stages``: :func:`~baldur_django.core.stages.figures.stage_section`) as ``(stage, figures)`` lines of text, for the
    status command and pages: one per stage that is on, then the refusals by reason
    (``refused``: ``none`` when there were none)."""
    rows: list[tuple[str, str]] = []
    if section["deadline"] is not None:
        rows.append(("deadline", f"{section['deadline']:g}s per call"))
    gate = section["retry_after_gate"]
    if gate is not None:
        state = f"closed {gate['remaining']:.1f}s more" if gate["remaining"] > 0 else "open"
        rows.append(("retry_after_gate", f"{state} ({gate['scope']})"))
    bulkhead = section["bulkhead"]
    if bulkhead is not None:
        waiting = "" if bulkhead["waiting"] is None else f", {bulkhead['waiting']} waiting"
        rows.append(
            (
                "bulkhead",
                f"{bulkhead['in_flight']}/{bulkhead['limit']} in flight{waiting}, "
                f"max_wait {bulkhead['max_wait']:g}s ({bulkhead['scope']})",
            )
        )
    budget = section["retry_budget"]
    if budget is not None:
        left = "-" if budget["left"] is None else f"{budget['left']:.1f}"
        rows.append(
            (
                "retry_budget",
                f"{left} retries left, ratio {budget['ratio']:g} + {budget['min_per_second']:g}/s, "
                f"{budget['exhausted']} refused ({budget['scope']})",
            )
        )
    throttle = section["adaptive_throttling"]
    if throttle is not None:
        rows.append(
            (
                "adaptive_throttling",
                f"p(refuse) {throttle['probability']:.3f}, {throttle['requests']} requests / "
                f"{throttle['accepts']} accepts in {throttle['window']:g}s, k {throttle['k']:g}",
            )
        )
    refused = ", ".join(f"{reason} {n}" for reason, n in section["refused"].items() if n)
    rows.append(("refused", refused or "none"))
    return rows


def stage_table(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(service, stage, figures)`` for every row with a ``stages`` section, in the rows'
    order (none for rows without one: a breaker without stages adds nothing)."""
    return [
        (row["service"], stage, text) for row in rows if row.get("stages") for stage, text in stage_lines(row["stages"])
    ]
