"""Draw the demo's run as one picture: ``demo-out/timeline.png``.

:func:`draw` takes plain data that ``testproject.demo`` records while it runs (no server
needed, so the drawing is testable on its own):

* ``phases``: ``[{"label": str, "title": str, "start": s, "end": s}, ...]`` in order
  (``label``: the short name drawn over the phase, ``title``: the name in the key);
* ``states``: ``[{"t": s, "state": str, "note": str}, ...]``: from ``t`` on, the breaker's
  shared state is ``state`` (a key of :data:`BAND_STATES`); ``note`` (optional) is what
  made it move;
* ``requests``: ``[{"t": s, "outcome": str}, ...]``: when each request was sent and what
  became of it (a key of :data:`OUTCOMES`);
* ``notes``: ``[{"t": s, "text": str}, ...]``: call-outs above the bars;
* ``title`` and ``subtitle``.

Times are seconds from the start of the first phase. matplotlib draws off-screen (the Agg
backend); it comes with the ``dev`` extra.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

#: The states the band can show, in legend order: ``state -> (label, colour)``. The band
#: is drawn from this table alone, so a new state is one more line. ``frozen`` is an OPEN
#: breaker held by Emergency Mode's Level 3 (EM-2): the demo draws it from when the server
#: sees Level 3 until it sees the step-down.
BAND_STATES: dict[str, tuple[str, str]] = {
    "closed": ("CLOSED: calls go through", "#40a060"),
    "open": ("OPEN: calls rejected fast", "#d23c3c"),
    "half_open": ("HALF_OPEN: lets a few trial calls through", "#f2b632"),
    "forced_open": ("forced OPEN by an operator", "#7b3fa0"),
    "forced_closed": ("forced CLOSED by an operator", "#2f7fbf"),
    "frozen": ("FROZEN: held OPEN by Emergency Level 3", "#4a5a8c"),
}
UNKNOWN_STATE = ("state unknown", "#bbbbbb")

#: What became of a request, bottom to top in the stacked bars: ``outcome -> (label, colour)``.
OUTCOMES: dict[str, tuple[str, str]] = {
    "paid": ("reached the upstream: paid", "#2b8a9e"),
    "failed": ("reached the upstream: failed (503 or timeout)", "#e8743b"),
    "rejected": ("rejected fast by the breaker (fallback, upstream untouched)", "#9aa3b5"),
    "error": ("no answer", "#333333"),
}


def _segments(states: list[dict[str, Any]], end: float) -> list[tuple[float, float, str, str]]:
    """``(start, end, state, note)`` runs from the change points; empty runs dropped."""
    runs = []
    ordered = sorted(states, key=lambda s: s["t"])
    for i, point in enumerate(ordered):
        stop = ordered[i + 1]["t"] if i + 1 < len(ordered) else end
        start = max(0.0, point["t"])
        if stop > start:
            runs.append((start, stop, point["state"], point.get("note", "")))
    return runs


def place_callouts(ax: Any, notes: list[dict[str, Any]], seconds: float, renderer: Any) -> list[Any]:
    """Draw each note (``{"t": s, "text": str}``, in time order) as a framed call-out at
    second ``t`` of *ax*, with a dotted line down to the time axis.

    Each call-out goes as high as it can without covering one placed before it: it is
    measured with *renderer* and, while it would cover some, moved just under the lowest
    of those. Heights are fractions of the panel, so scaling the bars afterwards moves
    nothing.

    Args:
        ax: the matplotlib Axes of the bars, its x limits already set (seconds).
        notes: the call-outs, in time order.
        seconds (float): the length of the time axis, seconds (notes near its ends are
            aligned inwards).
        renderer: the figure canvas's renderer, to measure the text.

    Returns:
        list of matplotlib ``Bbox``: each call-out's frame in display pixels, in order.
    """
    from matplotlib.transforms import blended_transform_factory

    over = blended_transform_factory(ax.transData, ax.transAxes)  # x: seconds, y: 0..1 of the panel
    to_axes = ax.transAxes.inverted()
    placed: list[Any] = []
    for note in notes:
        align = "left" if note["t"] < 0.08 * seconds else "right" if note["t"] > 0.9 * seconds else "center"
        y = 0.975
        for attempt in range(len(notes) + 1):
            callout = ax.text(
                note["t"],
                y,
                note["text"],
                transform=over,
                ha=align,
                va="top",
                fontsize=8.3,
                zorder=3,
                bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "#8792a2", "linewidth": 0.7},
            )
            box = callout.get_window_extent(renderer).padded(5)  # the text plus its rounded frame
            clash = [other for other in placed if other.overlaps(box)]
            if not clash or attempt == len(notes):
                break
            callout.remove()  # go just under the lowest call-out it would cover
            y = to_axes.transform((0, min(other.y0 for other in clash) - 7))[1]
        placed.append(box)
        ax.plot([note["t"], note["t"]], [0, y], transform=over, color="#5d6878", linewidth=0.9, linestyle=":", zorder=1)
    return placed


def draw(path: Path, data: dict[str, Any]) -> Path:
    """Write the timeline picture of one demo run to *path* (PNG) and return *path*.

    Raises:
        ImportError: matplotlib is not installed (it is part of the ``dev`` extra).
        ValueError: *data* has no phase.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    phases = data["phases"]
    if not phases:
        raise ValueError("the timeline needs at least one phase")
    end = max(p["end"] for p in phases)
    seconds = max(1, math.ceil(end))

    # the key under the picture: every phase's full title, as many lines as it takes; the
    # legends and the panels move up by the lines beyond two
    key = ["phases:"]
    for i, phase in enumerate(phases, 1):
        item = f"{i} {phase.get('title') or phase['label'].replace(chr(10), ' ')}"
        if len(key[-1]) + len(item) > 200:
            key.append("")
        key[-1] += "    " + item
    lift = 0.021 * max(0, len(key) - 2)

    fig = plt.figure(figsize=(15, 9), dpi=100)
    left = 0.075
    grid = fig.add_gridspec(
        3, 1, height_ratios=[0.95, 0.5, 3.4], hspace=0.08, left=left, right=0.985, top=0.85, bottom=0.25 + lift
    )
    ax_phase = fig.add_subplot(grid[0])
    ax_band = fig.add_subplot(grid[1], sharex=ax_phase)
    ax_bars = fig.add_subplot(grid[2], sharex=ax_phase)
    ax_bars.set_xlim(0, seconds)  # shared by the three panels; fixed first, the labels are measured against it
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's: measures text as it will be drawn
    fig.text(left, 0.975, data.get("title", "baldur_django demo"), ha="left", va="top", fontsize=16, fontweight="bold")
    if data.get("subtitle"):
        fig.text(
            left,
            0.935,
            textwrap.fill(data["subtitle"], 150),
            ha="left",
            va="top",
            fontsize=10.5,
            color="#333333",
            linespacing=1.35,
        )

    # --- phases: numbered boxes across the top (the name too where it fits), faint
    # separators through every panel, and a key with every phase's full title below
    width_px = fig.get_figwidth() * fig.dpi * (0.985 - left)
    for i, phase in enumerate(phases, 1):
        start, stop = phase["start"], phase["end"]
        shade = "#eef1f6" if i % 2 else "#dde3ec"
        ax_phase.axvspan(start, stop, color=shade)
        room = (stop - start) / seconds * width_px  # pixels across this phase
        widest = max(len(line) for line in phase["label"].split("\n"))
        text = f"{i}\n{phase['label']}" if room > widest * 6.2 + 6 else str(i)
        ax_phase.text(
            (start + stop) / 2,
            0.5,
            text,
            ha="center",
            va="center",
            fontsize=8.6,
            linespacing=1.15,
            fontweight="bold" if text == str(i) else "normal",
        )
        for ax in (ax_band, ax_bars):
            ax.axvline(start, color="#8792a2", linewidth=0.8, linestyle=(0, (3, 3)), zorder=0)
    ax_phase.set_ylim(0, 1)
    ax_phase.set_yticks([])
    ax_phase.set_ylabel("phase", fontsize=10)
    ax_phase.tick_params(labelbottom=False, bottom=False)
    for side in ("top", "right", "left", "bottom"):
        ax_phase.spines[side].set_visible(False)

    # --- the breaker's state as a coloured band
    shown_states = []
    for start, stop, state, _ in _segments(data.get("states", []), end):
        _label, colour = BAND_STATES.get(state, UNKNOWN_STATE)
        ax_band.broken_barh([(start, stop - start)], (0, 1), facecolors=colour, edgecolor="white", linewidth=0.6)
        if state not in shown_states:
            shown_states.append(state)
        name = state.replace("forced_", "forced ").upper()
        run = ax_band.transData.transform([(start, 0), (stop, 0)])
        for text in (name, name.replace(" ", "\n")) if stop - start > 0.5 else ():  # its name, where it fits inside
            label_text = ax_band.text(
                (start + stop) / 2,
                0.5,
                text,
                ha="center",
                va="center",
                fontsize=8.5,
                color="white",
                fontweight="bold",
                linespacing=1.0,
            )
            if label_text.get_window_extent(renderer).width + 8 <= run[1][0] - run[0][0]:
                break
            label_text.remove()
    ax_band.set_ylim(0, 1)
    ax_band.set_yticks([])
    ax_band.set_ylabel("breaker\nstate", fontsize=10)
    ax_band.tick_params(labelbottom=False, bottom=False)
    for side in ("top", "right", "left"):
        ax_band.spines[side].set_visible(False)

    # --- requests per second, stacked by outcome
    counts: dict[str, Counter[int]] = {name: Counter() for name in OUTCOMES}
    for request in data.get("requests", []):
        second = int(max(0.0, request["t"]))
        counts.setdefault(request["outcome"], Counter())[second] += 1
    lefts = list(range(seconds))
    bottom = [0] * seconds
    shown_outcomes = []
    for name, (_label, colour) in OUTCOMES.items():
        heights = [counts.get(name, Counter()).get(s, 0) for s in lefts]
        if not any(heights):
            continue
        shown_outcomes.append(name)
        ax_bars.bar(
            lefts, heights, width=0.86, bottom=bottom, align="edge", color=colour, edgecolor="white", linewidth=0.4
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=False)]
    peak = max(bottom) if any(bottom) else 1
    ax_bars.set_ylabel("requests sent per second", fontsize=10)
    ax_bars.set_xlabel("seconds since the first request", fontsize=10)
    ax_bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_bars.grid(axis="y", color="#e4e4e4", linewidth=0.8)
    ax_bars.set_axisbelow(True)
    for side in ("top", "right"):
        ax_bars.spines[side].set_visible(False)

    # --- call-outs: what to look at, over the bars; the bars are then scaled to stay under
    # the lowest call-out
    notes = sorted(data.get("notes", []), key=lambda n: n["t"])
    boxes = place_callouts(ax_bars, notes, seconds, renderer)
    to_axes = ax_bars.transAxes.inverted()
    lowest = min((to_axes.transform((0, box.y0))[1] for box in boxes), default=1.0)
    ax_bars.set_ylim(0, peak / max(0.3, lowest - 0.03) if notes else peak * 1.1 + 1)

    # --- legends under the picture: the band's states, then the bars' outcomes
    state_handles = [
        Patch(color=BAND_STATES.get(s, UNKNOWN_STATE)[1], label=BAND_STATES.get(s, UNKNOWN_STATE)[0])
        for s in BAND_STATES
        if s in shown_states
    ]
    state_handles += [
        Patch(color=UNKNOWN_STATE[1], label=UNKNOWN_STATE[0]) for s in shown_states if s not in BAND_STATES
    ][:1]
    outcome_handles = [Patch(color=OUTCOMES[o][1], label=OUTCOMES[o][0]) for o in shown_outcomes]
    fig.legend(
        handles=state_handles,
        loc="lower left",
        bbox_to_anchor=(left - 0.01, 0.115 + lift),
        ncol=min(5, max(1, len(state_handles))),
        frameon=False,
        fontsize=9.5,
        title="breaker state (the band)",
        title_fontsize=9.5,
        alignment="left",
    )
    fig.legend(
        handles=outcome_handles,
        loc="lower left",
        bbox_to_anchor=(left - 0.01, 0.05 + lift),
        ncol=min(4, max(1, len(outcome_handles))),
        frameon=False,
        fontsize=9.5,
        title="what became of each request (the bars, by the second it was sent)",
        title_fontsize=9.5,
        alignment="left",
    )
    fig.text(
        left,
        0.018,
        "\n".join(line.strip() for line in key),
        ha="left",
        va="bottom",
        fontsize=9.5,
        color="#333333",
        linespacing=1.35,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
