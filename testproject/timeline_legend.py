"""The legends and the note on time under the demo's picture (``testproject.timeline``)."""

from __future__ import annotations

import itertools
from typing import Any

from testproject import timeline_held


def legends(
    fig: Any,
    phases: list[dict[str, Any]],
    shown_states: list[str],
    shown_outcomes: set[str],
    any_unprotected: bool,
    any_command: bool,
) -> None:
    """The legends of the band and the bars, and the note on time, under the panels."""
    from matplotlib.patches import Patch

    from testproject.timeline import BAND_STATES, COMMAND, LEFT, NO_BREAKER, OUTCOMES, UNKNOWN_STATE

    height = fig.get_figheight()
    outcome_handles = [Patch(color=OUTCOMES[o][1], label=OUTCOMES[o][0]) for o in OUTCOMES if o in shown_outcomes]
    if any_command:
        outcome_handles.append(Patch(facecolor=COMMAND[1], edgecolor=COMMAND[2], hatch="..", label=COMMAND[0]))
    if any(p.get("held") for p in phases):
        outcome_handles += timeline_held.legend()
    rows = max(2, -(-len(outcome_handles) // 3))  # the bars' legend, 3 to a row, under the band's
    handles = [Patch(color=BAND_STATES[s][1], label=BAND_STATES[s][0]) for s in BAND_STATES if s in shown_states]
    handles += [Patch(color=UNKNOWN_STATE[1], label=UNKNOWN_STATE[0]) for s in shown_states if s not in BAND_STATES][:1]
    if any_unprotected:
        handles.append(Patch(facecolor=NO_BREAKER[1], edgecolor=NO_BREAKER[2], hatch="///", label=NO_BREAKER[0]))
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(LEFT - 0.008, (0.62 + 0.2 * rows) / height),
        ncol=4,
        frameon=False,
        fontsize=9,
        title="the band: the breaker's state",
        title_fontsize=9,
        alignment="left",
    )
    fig.legend(
        handles=outcome_handles,
        loc="lower left",
        bbox_to_anchor=(LEFT - 0.008, 0.38 / height),
        ncol=3,
        frameon=False,
        fontsize=9,
        title="the bars: what became of each request, by when it was sent",
        title_fontsize=9,
        alignment="left",
    )
    fig.text(LEFT, 0.1 / height, time_note(phases), fontsize=9, wrap=True, color="#333333")


def time_note(phases: list[dict[str, Any]]) -> str:
    """The note on time under the picture: the clock, and what the panels leave out (the
    start-up before the first phase, and the time between phases: none when each phase
    starts as the one before it ends, as the demo's do)."""
    gaps = [max(0.0, b["start"] - a["end"]) for a, b in itertools.pairwise(phases)]
    between = (
        f"; and {sum(gaps):.2f} s between phases (at most {max(gaps):.2f} s at once)"
        if gaps and round(sum(gaps), 2) > 0
        else "; nothing between phases (each starts as the one before ends)"
    )
    return (
        "Time: seconds since the demo started, as in the console's timestamps. Each panel is one phase, from its start "
        f"to its end; left out: the first {phases[0]['start']:.1f} s (starting the servers){between}."
    )
