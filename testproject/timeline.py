"""Draw the demo's run as one picture: ``demo-out/timeline.png``.

:func:`draw` takes plain data that ``testproject.demo`` records while it runs (no server
needed, so the drawing is testable on its own, and :func:`build` returns the matplotlib
figure for tests to inspect):

* ``phases``: ``[{"label": str, "title": str, "start": s, "end": s, "breaker": bool}, ...]``
  in order (``title``: the phase's name in words, drawn over its panel; ``breaker``: False
  for a phase whose requests go to a view without a breaker, which gets no state band;
  optional ``bands``: ``[{"name": str, "states": [...]}, ...]`` for a phase that uses
  other breakers than the shared one (the per-host phase: one breaker per carrier's host),
  drawn as one strip per breaker, named (the name's first word, or ``"host"``, is the
  host the breaker is for), in place of the shared breaker's band);
* ``states``: ``[{"t": s, "state": str, "note": str}, ...]``: from ``t`` on, the breaker's
  shared state is ``state`` (a key of :data:`BAND_STATES`); ``note`` (optional) is what
  made it move;
* ``requests``: ``[{"t": s, "outcome": str}, ...]``: when each request was sent and what
  became of it (a key of :data:`OUTCOMES`); in the per-host phase, each call the shop made
  to a carrier (``"host"`` names it), two per request to the shop, drawn as one bar per
  host side by side, so each bar still counts requests;
* a phase marked ``"held": True`` (the outbound-stage phases) also shows how long each
  request was held (its request's ``"held"``, seconds) as a dot over when it was sent, on
  a right-hand axis of seconds, with its ``"deadline"`` (seconds or None) as a dashed line
  (:mod:`testproject.timeline_held`);
* ``notes``: ``[{"t": s, "text": str}, ...]``: what to look at, marked in the panel of the
  phase they fall in and spelled out under it;
* ``commands``: ``[{"start": s, "end": s, "text": str}, ...]``: an operator's
  ``manage.py`` command running in another process (no request is sent meanwhile: this
  is what the quiet stretches inside a phase are);
* ``title`` and ``subtitle``.

Every time is in seconds since the demo started: the clock of the console's
``12.34s`` timestamps, so a line printed at 19.2 s sits at 19.2 s in the picture. Each
phase has its own panel, from when it started to when it ended, so a short phase is as
readable as a long one; what lies before the first phase (the start-up of the servers) or
between two phases is left out and said so under the picture (the demo's phases follow
each other: a phase ends once the demo has read its counters, and the next starts).

matplotlib draws off-screen (the Agg backend); it comes with the ``dev`` extra.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from testproject import timeline_held, timeline_legend

#: The states the band can show, in legend order: ``state -> (label, colour)``. The band
#: is drawn from this table alone, so a new state is one more line. ``frozen`` is an OPEN
#: breaker held by Emergency Mode's Level 3: the demo draws it from when the server
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
#: The band of a phase that uses no breaker: hatched, in no state's colour.
NO_BREAKER = ("no breaker in use (the view calls the service directly)", "#f4f4f4", "#9a9a9a")
#: The span of an operator's command in the bars.
COMMAND = ("an operator's manage.py command runs in another process (no request is sent)", "#eceff4", "#8792a2")

#: What became of a request, bottom to top in the stacked bars: ``outcome -> (label, colour)``.
OUTCOMES: dict[str, tuple[str, str]] = {
    "paid": ("reached the upstream: paid", "#2b8a9e"),
    "quoted": ("reached a carrier: quoted (the per-host phase)", "#7cc6d6"),
    "failed": ("reached the upstream: failed (503 or timeout)", "#e8743b"),
    "rejected": ("rejected fast by the breaker (fallback, upstream untouched)", "#9aa3b5"),
    "retry_after": ("refused fast: the provider's Retry-After (fallback, untouched)", "#b58fd1"),
    "bulkhead_full": ("refused fast: bulkhead full (fallback, untouched)", "#d9a441"),
    "deadline": ("refused: the request's deadline had passed", "#8c6d62"),
    "other_view": ("another view of the same worker: answered", "#9ccf8a"),
    "error": ("no answer", "#333333"),
}

#: Width of one bar, seconds.
BIN = 0.5
#: Phases per row of panels.
PER_ROW = 6
#: No panel is narrower than this share of its row's mean width ...
MIN_SHARE = 0.6
#: ... and no panel drawn as one strip per breaker narrower than this one (room for the names).
STRIPS_SHARE = 1.5
#: Where the panels start and end across the figure (its width's fractions), and the space
#: between two panels of a row (a share of a panel's mean width).
LEFT, RIGHT, WSPACE = 0.055, 0.99, 0.09
#: Heights in inches: the title and subtitle over the panels, the band, the bars, the gap
#: between these and the caption, from the caption's top to its text (the time axis's
#: labels), and the legends and the note on time under the panels.
HEADER_IN, BAND_IN, BARS_IN, SUB_GAP_IN, CAPTION_TOP_IN, FOOTER_IN = 1.2, 0.43, 2.35, 0.065, 0.24, 2.2


def segments(states: list[dict[str, Any]], end: float) -> list[tuple[float, float, str, str]]:
    """``(start, end, state, note)`` runs from the change points; empty runs dropped.

    Args:
        states: the change points, ``{"t": s, "state": str}``, in any order.
        end (float): where the last run stops, seconds.

    Returns:
        list of tuple: the runs in time order.
    """
    runs = []
    ordered = sorted(states, key=lambda s: s["t"])
    for i, point in enumerate(ordered):
        stop = ordered[i + 1]["t"] if i + 1 < len(ordered) else end
        start = max(0.0, point["t"])
        if stop > start:
            runs.append((start, stop, point["state"], point.get("note", "")))
    return runs


def phase_of(phases: list[dict[str, Any]], t: float) -> int:
    """Index of the phase *t* (seconds) falls in; between two phases, the one before; before
    the first, the first."""
    found = 0
    for i, phase in enumerate(phases):
        if phase["start"] <= t:
            found = i
    return found


def panels(fig: Any) -> dict[int, dict[str, Any]]:
    """The axes of a figure made by :func:`build`, by phase number (from 1) and part
    (``"band"``, ``"bars"``, ``"caption"``)."""
    found: dict[int, dict[str, Any]] = {}
    for ax in fig.axes:
        kind, _, number = ax.get_label().partition(":")
        if kind in ("band", "bars", "caption") and number.isdigit():
            found.setdefault(int(number), {})[kind] = ax
    return found


def _draw_runs(
    band: Any,
    renderer: Any,
    runs: list[tuple[float, float, str, str]],
    start: float,
    stop: float,
    y0: float,
    height: float,
    name: str,
    shown_states: list[str],
) -> None:
    """Draw the state *runs* inside ``[start, stop]`` as a strip of *band* from *y0* to
    ``y0 + height`` (axes units 0..1), each run labelled with its state where that fits,
    and note the states drawn in *shown_states*. A strip with a *name* (its breaker's)
    carries the name in its widest run, with the state where that fits, and at least the
    name's first word (the host) even where nothing fits."""
    shown = [(max(a, start), min(b, stop), state) for a, b, state, _ in runs if min(b, stop) > max(a, start)]
    widest = max(range(len(shown)), key=lambda i: shown[i][1] - shown[i][0], default=-1)
    for i, (lo, hi, state) in enumerate(shown):
        colour = BAND_STATES.get(state, UNKNOWN_STATE)[1]
        band.broken_barh([(lo, hi - lo)], (y0, height), facecolors=colour, edgecolor="white", linewidth=0.6)
        if state not in shown_states:
            shown_states.append(state)
        label_text = state.replace("forced_", "forced ").upper()
        span = band.transData.transform([(lo, 0), (hi, 0)])
        if name and i == widest:
            host = name.split(" ")[0]
            tries = [f"{name}: {label_text}", f"{host}: {label_text}", name, host]
        else:
            tries = [label_text, label_text.replace(" ", "\n")]
        for text in tries:  # the longest that fits inside
            label = band.text(
                (lo + hi) / 2,
                y0 + height / 2,
                text,
                ha="center",
                va="center",
                fontsize=8 if height == 1 else 7.5,
                color="white",
                fontweight="bold",
                linespacing=1.0,
            )
            if label.get_window_extent(renderer).width + 6 <= span[1][0] - span[0][0]:
                break
            if not (name and i == widest and text == tries[-1]):
                label.remove()


def _widths(phases: list[dict[str, Any]]) -> list[float]:
    durations = [max(p["end"] - p["start"], 1e-3) for p in phases]
    mean = sum(durations) / len(durations)
    # a phase drawn as one strip per breaker needs room for the breakers' names
    return [
        max(d, (STRIPS_SHARE if p.get("bands") else MIN_SHARE) * mean) for d, p in zip(durations, phases, strict=True)
    ]


def _panel_widths_px(fig: Any, row: list[dict[str, Any]], left: float, right: float) -> list[float]:
    """Width in pixels of each panel of *row*: it depends only on the figure's width."""
    from matplotlib.gridspec import GridSpec

    grid = GridSpec(1, len(row), left=left, right=right, width_ratios=_widths(row), wspace=WSPACE)
    _bottoms, _tops, lefts, rights = grid.get_grid_positions(fig)
    return [(r - lo) * fig.get_figwidth() * fig.dpi for lo, r in zip(lefts, rights, strict=True)]


def _text_height(fig: Any, renderer: Any, text: str, **style: Any) -> float:
    """Height in inches of *text* drawn in *style* (0 for no text)."""
    if not text:
        return 0.0
    probe = fig.text(0, 0, text, **style)
    height = float(probe.get_window_extent(renderer).height) / fig.dpi
    probe.remove()
    return height


def _title(number: int, phase: dict[str, Any], panel_px: float) -> str:
    return textwrap.fill(
        f"{number}. {phase.get('title') or phase['label'].replace(chr(10), ' ')}", max(10, int(panel_px / 7.6))
    )


def _extras(
    phases: list[dict[str, Any]], index: int, notes: list[dict[str, Any]], commands: list[dict[str, Any]]
) -> tuple[list[tuple[float, float, str]], list[tuple[str, dict[str, Any]]], list[str]]:
    """What a phase's panel marks over its bars and spells out under them: the operator's
    commands that ran in it (``(start, end, text)``), its notes by letter, and the caption's
    lines."""
    start, stop = phases[index]["start"], phases[index]["end"]
    spans, lines = [], []
    for command in commands:
        lo, hi = max(command["start"], start), min(command["end"], stop)
        if hi > lo:
            spans.append((lo, hi, command["text"]))
            lines.append(f"\u2591 {hi - lo:.1f} s: {command['text']}")
    mine = [n for n in notes if phase_of(phases, n["t"]) == index]
    marks = list(zip("abcdefgh", mine, strict=False))
    lines += [f"({letter}) " + note["text"].replace("\n", " ") for letter, note in marks]
    return spans, marks, lines


def _hosts(phase: dict[str, Any], requests: list[dict[str, Any]]) -> list[str]:
    """The hosts whose calls the phase's bars show side by side, in the order of its strips
    (a host no strip names comes after, by name); empty for a phase of plain requests."""
    named = [_strip_host(strip) for strip in phase.get("bands", [])]
    seen = sorted({r["host"] for r in requests if r.get("host") and phase["start"] <= r["t"] <= phase["end"]})
    return named + [h for h in seen if h not in named] if seen else []


def _draw_bars(
    bars: Any, counts: dict[tuple[int, int, str], Counter[str]], index: int, hosts: list[str], shown: set[str]
) -> None:
    """Stack the phase's requests by outcome per BIN seconds: one bar per bin, or one bar
    per host side by side where the phase's requests are calls to several hosts (each bar
    then counts the requests sent in the bin, as that host answered them)."""
    keys = hosts or [""]
    width = BIN * 0.86 / len(keys)
    for k, host in enumerate(keys):
        bins = sorted(b for (p, b, h) in counts if p == index and h == host)
        bottom = dict.fromkeys(bins, 0)
        for name, (_label, colour) in OUTCOMES.items():
            heights = [counts[(index, b, host)].get(name, 0) for b in bins]
            if not any(heights):
                continue
            shown.add(name)
            bars.bar(
                [b * BIN + k * width for b in bins],
                heights,
                width=width,
                bottom=[bottom[b] for b in bins],
                align="edge",
                color=colour,
                edgecolor="white",
                linewidth=0.4,
                zorder=2,
                gid=f"host:{host}" if host else None,
            )
            for b, h in zip(bins, heights, strict=True):
                bottom[b] += h


def _host_line(phase: dict[str, Any], hosts: list[str]) -> str:
    """The caption's line saying which bar of a pair is which host's."""
    names = {_strip_host(strip): strip["name"] for strip in phase.get("bands", [])}
    sides = ["left", "right"] if len(hosts) == 2 else [f"bar {i}" for i in range(1, len(hosts) + 1)]
    return f"{len(hosts)} bars per {BIN:g} s, one per host, each counting every request: " + ", ".join(
        f"{side} {names.get(host) or host}" for side, host in zip(sides, hosts, strict=True)
    )


def _strip_host(strip: dict[str, Any]) -> str:
    """The host a strip's breaker is for: its ``host``, or its name's first word."""
    return str(strip.get("host") or strip["name"].split(" ")[0])


def _layout(fig: Any, renderer: Any, rows: list[list[dict[str, Any]]], captions: list[list[str]]) -> list[Any]:
    """Size the figure and lay out one ``GridSpec`` per row of panels (band, bars, caption),
    each row as tall as its longest caption and its longest title, so no text runs into
    the row below or the legends."""
    from matplotlib.gridspec import GridSpec

    line = 10 / 72 * 1.25  # one line of a panel's title, inches
    heights = []
    titles = []
    for r, row in enumerate(rows):
        widths = _panel_widths_px(fig, row, LEFT, RIGHT)
        caption = max(_text_height(fig, renderer, text, fontsize=8.3, linespacing=1.25) for text in captions[r])
        heights.append(BAND_IN + BARS_IN + 2 * SUB_GAP_IN + CAPTION_TOP_IN + caption + 0.1)
        titles.append(max(_title(1, p, w).count("\n") + 1 for p, w in zip(row, widths, strict=True)) * line)
    header = HEADER_IN + titles[0]
    total = header + sum(heights) + sum(0.2 + t for t in titles[1:]) + FOOTER_IN
    fig.set_figheight(total)
    grids = []
    top = total - header
    for r, row in enumerate(rows):
        if r:
            top -= 0.2 + titles[r]
        inches = heights[r] - 2 * SUB_GAP_IN
        grids.append(
            GridSpec(
                3,
                len(row),
                figure=fig,
                left=LEFT,
                right=RIGHT,
                top=top / total,
                bottom=(top - heights[r]) / total,
                height_ratios=[BAND_IN, BARS_IN, inches - BAND_IN - BARS_IN],
                width_ratios=_widths(row),
                wspace=WSPACE,
                hspace=SUB_GAP_IN * 3 / inches,
            )
        )
        top -= heights[r]
    return grids


def build(data: dict[str, Any]) -> Any:
    """The timeline picture of one demo run as a matplotlib ``Figure`` (Agg, not shown).

    Args:
        data: the run, as described in this module's docstring.

    Returns:
        matplotlib.figure.Figure: one panel per phase; :func:`panels` finds its axes.

    Raises:
        ImportError: matplotlib is not installed (it is part of the ``dev`` extra).
        ValueError: *data* has no phase.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    from matplotlib.transforms import ScaledTranslation

    phases = data["phases"]
    if not phases:
        raise ValueError("the timeline needs at least one phase")
    rows = [phases[i : i + PER_ROW] for i in range(0, len(phases), PER_ROW)]
    end = max(p["end"] for p in phases)
    runs = segments(data.get("states", []), end)
    requests = data.get("requests", [])
    notes = sorted(data.get("notes", []), key=lambda n: n["t"])
    commands = data.get("commands", [])

    fig = plt.figure(figsize=(16, 12), dpi=100)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's: measures text as drawn
    # what goes under each panel, wrapped to its width: it sets the height of its row
    extras, captions = [], []
    for r, row in enumerate(rows):
        captions.append([])
        for c, px in enumerate(_panel_widths_px(fig, row, LEFT, RIGHT)):
            index = r * PER_ROW + c
            spans, marks, lines = _extras(phases, index, notes, commands)
            hosts = _hosts(phases[index], requests)
            if len(hosts) > 1:
                lines.insert(0, _host_line(phases[index], hosts))
            chars = max(12, int(px / 6.3))
            captions[r].append("\n".join(textwrap.fill(line, chars, subsequent_indent="    ") for line in lines))
            extras.append((spans, marks, hosts, px))
    grids = _layout(fig, renderer, rows, captions)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the figure's final size
    height = fig.get_figheight()
    fig.text(LEFT, 1 - 0.25 / height, data.get("title", "baldur_django demo"), va="top", fontsize=16)
    if data.get("subtitle"):
        fig.text(
            LEFT,
            1 - 0.6 / height,
            textwrap.fill(data["subtitle"], 175),
            va="top",
            fontsize=10,
            color="#333333",
            linespacing=1.3,
        )

    # requests per bin of BIN seconds on the demo's clock, by outcome (and by host where the
    # requests are calls to hosts); a request counts in the phase it was sent in
    counts: dict[tuple[int, int, str], Counter[str]] = {}
    for request in requests:
        t = request["t"]
        key = (phase_of(phases, t), math.floor(t / BIN), request.get("host", ""))
        counts.setdefault(key, Counter())[request["outcome"]] += 1
    peak = max((sum(c.values()) for c in counts.values()), default=1)

    shown_states: list[str] = []
    shown_outcomes: set[str] = set()
    any_command = any_unprotected = False
    first_bars = None
    for r, row in enumerate(rows):
        grid = grids[r]
        for c, phase in enumerate(row):
            number = r * PER_ROW + c + 1
            index = number - 1
            spans, marks, hosts, panel_px = extras[index]
            start, stop = phase["start"], phase["end"]
            band = fig.add_subplot(grid[0, c], label=f"band:{number}")
            bars = fig.add_subplot(grid[1, c], label=f"bars:{number}", sharey=first_bars)
            caption = fig.add_subplot(grid[2, c], label=f"caption:{number}")
            first_bars = first_bars or bars

            # --- the phase's name, in words, over its panel
            band.set_title(_title(number, phase, panel_px), fontsize=10, loc="left", pad=4)

            # --- the breaker's state as a band, only where a breaker is in use: the shared
            # breaker's, or one strip per breaker the phase names in "bands"
            band.set_xlim(start, stop)
            band.set_ylim(0, 1)
            strips = phase.get("bands")
            if strips:
                strip_height = 1 / len(strips)
                for i, strip in enumerate(strips):
                    y0 = 1 - (i + 1) * strip_height
                    _draw_runs(
                        band,
                        renderer,
                        segments(strip["states"], end),
                        start,
                        stop,
                        y0,
                        strip_height,
                        strip["name"],
                        shown_states,
                    )
            elif phase.get("breaker", True):
                _draw_runs(band, renderer, runs, start, stop, 0.0, 1.0, "", shown_states)
            else:
                any_unprotected = True
                _, face, edge = NO_BREAKER
                band.broken_barh(
                    [(start, stop - start)], (0, 1), facecolors=face, edgecolor=edge, hatch="///", linewidth=0.6
                )
                band.text(
                    (start + stop) / 2,
                    0.5,
                    "no breaker",
                    ha="center",
                    va="center",
                    fontsize=8.5,
                    color="#555555",
                    bbox={"facecolor": face, "edgecolor": "none", "pad": 1},
                )
            band.set_yticks([])
            band.tick_params(labelbottom=False, bottom=False)
            for side in ("top", "right", "left", "bottom"):
                band.spines[side].set_visible(False)

            # --- the requests, stacked by outcome, per BIN seconds
            bars.set_xlim(start, stop)
            _draw_bars(bars, counts, index, hosts if len(hosts) > 1 else [], shown_outcomes)
            if phase.get("held"):
                timeline_held.draw(fig, bars, number, phase, requests)
            for lo, hi, text in spans:
                any_command = True
                _, face, edge = COMMAND
                bars.axvspan(
                    lo,
                    hi,
                    facecolor=face,
                    edgecolor=edge,
                    hatch="..",
                    linewidth=0,
                    zorder=0,
                    label=f"command:{text}",
                )
            for letter, note in marks:
                bars.axvline(note["t"], color="#5d6878", linewidth=0.9, linestyle=":", zorder=3)
                bars.text(
                    note["t"],
                    0.97,
                    letter,
                    transform=bars.get_xaxis_transform(),
                    ha="center",
                    va="top",
                    fontsize=8.5,
                    fontweight="bold",
                    bbox={
                        "boxstyle": "circle,pad=0.15",
                        "facecolor": "white",
                        "edgecolor": "#5d6878",
                        "linewidth": 0.7,
                    },
                    zorder=4,
                )
            bars.xaxis.set_major_locator(MaxNLocator(nbins=max(2, int(panel_px / 70)), steps=[1, 2, 2.5, 5, 10]))
            bars.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g} s"))
            bars.tick_params(labelsize=8.5)
            bars.grid(axis="y", color="#e4e4e4", linewidth=0.8)
            bars.set_axisbelow(True)
            for side in ("top", "right"):
                bars.spines[side].set_visible(False)
            if c == 0:
                bars.set_ylabel(f"requests sent\nper {BIN:g} s", fontsize=9.5)
            else:
                bars.tick_params(labelleft=False)

            # --- under the panel: what to look at, from just under the time axis's labels
            caption.axis("off")
            caption.text(
                0,
                1,
                captions[r][c],
                transform=caption.transAxes + ScaledTranslation(0, -CAPTION_TOP_IN, fig.dpi_scale_trans),
                ha="left",
                va="top",
                fontsize=8.3,
                color="#333333",
                linespacing=1.25,
            )
    assert first_bars is not None
    first_bars.set_ylim(0, peak * 1.18 + 0.5)  # room for the note markers over the bars
    first_bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    timeline_legend.legends(fig, phases, shown_states, shown_outcomes, any_unprotected, any_command)
    return fig


def draw(path: Path, data: dict[str, Any]) -> Path:
    """Write the timeline picture of one demo run to *path* (PNG) and return *path*.

    Raises:
        ImportError: matplotlib is not installed (it is part of the ``dev`` extra).
        ValueError: *data* has no phase.
    """
    fig = build(data)  # first: it picks the Agg backend before pyplot loads
    import matplotlib.pyplot as plt

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
