"""The time each request was held, over a phase's bars in the demo's picture.

``testproject.timeline`` calls :func:`draw` for a phase marked ``"held": True`` (the
outbound-stage phases): each request sent in the phase is a dot at (when it was sent, how
many seconds the shop held it), on a right-hand axis of seconds shared by every such
panel, coloured as its outcome in the bars; the phase's ``"deadline"`` (seconds, or None)
is a dashed line. A request to another view of the same worker (``"probe"``) is a
diamond, so its wait behind the doomed calls stands out.
"""

from __future__ import annotations

from typing import Any

#: The dots' colour for an outcome the bars do not know.
OTHER = "#333333"
#: The held axis's top, seconds, at least (the same for every panel that shows it).
TOP = 7.0


def draw(fig: Any, bars: Any, number: int, phase: dict[str, Any], requests: list[dict[str, Any]]) -> Any:
    """Draw the held times of *phase*'s requests over *bars* (the phase's bars axes).

    Args:
        fig: the figure (for the shared axis of every held panel).
        bars: the phase's bars axes.
        number: the phase's number, from 1 (the new axes' label is ``held:<number>``).
        phase: the phase (``start``, ``end``, optional ``deadline`` in seconds).
        requests: every request of the run (``t``, ``outcome``, ``held`` seconds, ``probe``).

    Returns:
        The new axes.
    """
    from testproject.timeline import OUTCOMES

    held = bars.twinx()
    held.set_label(f"held:{number}")
    mine = [r for r in requests if "held" in r and phase["start"] <= r["t"] <= phase["end"]]
    top = max([TOP] + [r["held"] * 1.15 for r in mine])
    for probe, marker in ((False, "o"), (True, "D")):
        chosen = [r for r in mine if bool(r.get("probe")) is probe]
        if chosen:
            held.scatter(
                [r["t"] for r in chosen],
                [r["held"] for r in chosen],
                s=16,
                marker=marker,
                c=[OUTCOMES.get(r["outcome"], ("", OTHER))[1] for r in chosen],
                edgecolors="#222222",
                linewidths=0.6,
                zorder=5,
            )
    if phase.get("deadline"):
        held.axhline(phase["deadline"], color="#8c6d62", linestyle="--", linewidth=1.0, zorder=4)
        held.text(phase["start"], phase["deadline"], " deadline", va="bottom", fontsize=7.5, color="#8c6d62")
    held.set_ylim(0, top)
    held.set_xlim(phase["start"], phase["end"])
    held.tick_params(labelsize=8)
    held.set_ylabel("held, s (dots)", fontsize=8.5)
    held.spines["top"].set_visible(False)
    return held


def legend() -> list[Any]:
    """The legend's entries for the dots (for the bars' legend)."""
    from matplotlib.lines import Line2D

    style = {"linestyle": "none", "markerfacecolor": "white", "markeredgecolor": "#222222"}
    return [
        Line2D([], [], marker="o", label="dot: seconds the shop held the request (right axis)", **style),
        Line2D([], [], marker="D", label="diamond: the same, for a request to another view", **style),
    ]
