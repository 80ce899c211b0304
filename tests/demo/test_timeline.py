"""The demo's picture (``testproject.timeline``) on made-up data, without servers: the band
is drawn from the BAND_STATES table alone, the bars from OUTCOMES; the picture and the
console share one clock; no band where no breaker is in use; every phase has a panel of its
own, named in words and wide enough to read; the quiet spans inside a phase are explained.

The checks read the data the picture is drawn from and the figure's matplotlib axes, not
its pixels (except where the colour table itself is the subject)."""

from __future__ import annotations

import argparse
import io
import math
import re
import time
from collections import Counter

import pytest
from matplotlib.colors import to_hex

from testproject import demo, timeline

PHASES = [
    {"label": "healthy", "title": "healthy traffic", "start": 0.0, "end": 4.0},
    {"label": "upstream\nfails", "title": "upstream fails", "start": 4.0, "end": 9.0},
    {"label": "emergency", "title": "Emergency Mode", "start": 9.0, "end": 14.0},
]


def colours(path) -> Counter:
    from PIL import Image

    with Image.open(path) as image:
        return Counter({colour: count for count, colour in image.convert("RGB").getcolors(maxcolors=1 << 24)})


def rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))


def test_every_state_of_the_table_is_drawn_in_its_colour_frozen_included(tmp_path):
    """Each state named in the data gets its BAND_STATES colour in the band, so a state that
    lands later (Emergency Mode's ``frozen``) needs only its line in the table; the bars
    take the OUTCOMES colours."""
    states = [
        {"t": 0.0, "state": "closed"},
        {"t": 4.5, "state": "open"},
        {"t": 7.0, "state": "half_open"},
        {"t": 8.0, "state": "forced_open"},
        {"t": 10.0, "state": "frozen"},
    ]
    requests = [{"t": i * 0.25, "outcome": "paid" if i < 16 else "failed" if i < 20 else "rejected"} for i in range(50)]
    path = timeline.draw(
        tmp_path / "t.png",
        {
            "phases": PHASES,
            "states": states,
            "requests": requests,
            "notes": [{"t": 4.6, "text": "opens"}],
            "title": "t",
            "subtitle": "s",
        },
    )
    assert path.read_bytes()[:4] == b"\x89PNG"
    found = colours(path)
    for state in ("closed", "open", "half_open", "forced_open", "frozen"):
        assert found[rgb(timeline.BAND_STATES[state][1])] > 200, state
    assert found[rgb(timeline.BAND_STATES["forced_closed"][1])] == 0  # not in the data, not drawn
    for outcome in ("paid", "failed", "rejected"):
        assert found[rgb(timeline.OUTCOMES[outcome][1])] > 200, outcome


def test_a_state_missing_from_the_table_is_drawn_grey(tmp_path):
    """A state the table does not know yet is drawn in the 'state unknown' grey, not dropped."""
    path = timeline.draw(
        tmp_path / "t.png", {"phases": PHASES, "states": [{"t": 0.0, "state": "melted"}], "requests": []}
    )
    assert colours(path)[rgb(timeline.UNKNOWN_STATE[1])] > 1000


def test_no_phase_is_a_clear_error(tmp_path):
    """Without a phase there is no time axis: ValueError, and no file is written."""
    with pytest.raises(ValueError, match="at least one phase"):
        timeline.draw(tmp_path / "t.png", {"phases": [], "states": [], "requests": []})
    assert not (tmp_path / "t.png").exists()


@pytest.fixture
def figures():
    """Build figures with :func:`timeline.build`; closes them afterwards."""
    import matplotlib.pyplot as plt

    made = []

    def build(data):
        fig = timeline.build(data)
        made.append(fig)
        return fig

    yield build
    for fig in made:
        plt.close(fig)


def band_runs(ax) -> list[tuple[float, float, str]]:
    """``(start, end, colour)`` of every filled run drawn in a band axes."""
    runs = []
    for collection in ax.collections:
        colour = to_hex(collection.get_facecolor()[0])
        for path in collection.get_paths():
            xs = path.vertices[:, 0]
            runs.append((round(float(xs.min()), 3), round(float(xs.max()), 3), colour))
    return sorted(runs)


STATE_COLOURS = {colour for _label, colour in timeline.BAND_STATES.values()} | {timeline.UNKNOWN_STATE[1]}


def recorded_demo(tmp_path, first_phase_at: float = 7.0):
    """A :class:`testproject.demo.Demo` that "ran" without servers: the fifteen short phases
    one after the other from *first_phase_at* seconds (the servers' start-up before), each
    1.2 s long but the fleet's (0.8 s), and a console that writes to a buffer."""
    console = io.StringIO()
    run = demo.Demo(argparse.Namespace(out_dir=tmp_path, short=True), demo.Display(False, False, console))
    run.plans = demo.plans(short=True)
    run.results = []
    at = first_phase_at
    for plan in run.plans:
        length = 0.8 if plan.fleet else 1.2
        run.results.append(demo.PhaseResult(plan.key, plan.title, started=at, ended=at + length))
        at += length + 0.05
    run.config = {"failure_threshold": 3, "recovery_timeout": 2.0, "half_open_max_calls": 2}
    run.transitions, run.band_marks, run.commands = [], [], []
    run.requests = [
        {"t": r.started + 0.1 * i, "server": "A", "outcome": "paid"} for r in run.results for i in range(1, 8)
    ]
    return run, console


def test_one_clock_for_the_console_and_the_picture(tmp_path, figures):
    """The picture's time axis is the console's clock, with the same origin (the demo's
    start, not the first request): a force the console prints at 19.20 s starts the band's
    forced OPEN run at 19.2 s, inside the operator phase's panel, though phase 1 began 7 s
    after the demo did."""
    run, console = recorded_demo(tmp_path, first_phase_at=7.0)
    forced_phase = run.results[[p.key for p in run.plans].index("operator_forced")]
    now = time.time()
    run.t0, run.wall0 = time.monotonic() - 19.2, now - 19.2  # the demo started 19.2 s ago
    forced_phase.started, forced_phase.ended = 18.9, 20.0
    entry = {
        "service": "payments",
        "from": "closed",
        "to": "open",
        "trigger": "baldur_force open, another process",
        "at": now,
        "server": "operator",
        "band": "forced_open",
    }
    run.on_transition(entry)
    run.transitions = [entry]
    printed = re.search(r"([\d.]+)s\s+breaker payments: CLOSED -> OPEN", console.getvalue())
    assert printed, console.getvalue()
    shown = float(printed.group(1))
    assert shown == pytest.approx(19.2, abs=0.02)

    data = run.timeline_data()
    assert data["phases"][0]["start"] == pytest.approx(7.0)  # not moved to 0
    forced = [s for s in data["states"] if s["state"] == "forced_open"]
    assert len(forced) == 1 and forced[0]["t"] == pytest.approx(shown, abs=0.006)

    fig = figures(data)
    number = [p["key"] for p in data["phases"]].index("operator_forced") + 1
    band = timeline.panels(fig)[number]["band"]
    assert band.get_xlim() == pytest.approx((18.9, 20.0))
    purple = timeline.BAND_STATES["forced_open"][1]
    starts = [start for start, _end, colour in band_runs(band) if colour == purple]
    assert starts == [pytest.approx(shown, abs=0.006)]


def test_no_state_band_where_no_breaker_is_in_use(tmp_path, figures):
    """The unprotected hang phase calls the service without a breaker: the demo marks it so,
    and its band shows no state at all (only the hatched "no breaker" mark, in no state's
    colour), even though the breaker sat HALF_OPEN all through it; the phases around it
    still draw their states."""
    run, _ = recorded_demo(tmp_path)
    data = run.timeline_data()
    keys = [p["key"] for p in data["phases"]]
    assert [p["key"] for p in data["phases"] if not p["breaker"]] == ["hang_unprotected"]
    unprotected = data["phases"][keys.index("hang_unprotected")]
    data["states"].append({"t": unprotected["start"] - 0.5, "state": "half_open"})  # HALF_OPEN throughout

    panels = timeline.panels(figures(data))
    colours = {colour for _s, _e, colour in band_runs(panels[keys.index("hang_unprotected") + 1]["band"])}
    assert colours and not colours & STATE_COLOURS, colours
    assert colours == {timeline.NO_BREAKER[1]}
    before = band_runs(panels[keys.index("hang_protected") + 1]["band"])
    after = band_runs(panels[keys.index("fleet") + 1]["band"])
    assert {c for _s, _e, c in before} == {timeline.BAND_STATES["closed"][1], timeline.BAND_STATES["half_open"][1]}
    assert {c for _s, _e, c in after} == {timeline.BAND_STATES["half_open"][1]}


def test_every_phase_has_a_readable_panel_named_in_words(tmp_path, figures):
    """Each of the fifteen phases gets its own panel (band and bars) spanning exactly the phase,
    titled with its number and its name in words; the title fits its panel; and no panel
    is a sliver, the fleet's 0.8 s of a 12 s run included (each at least 8 % of the figure's
    width, at least half the mean)."""
    run, _ = recorded_demo(tmp_path)
    data = run.timeline_data()
    fig = figures(data)
    renderer = fig.canvas.get_renderer()
    panels = timeline.panels(fig)
    assert sorted(panels) == list(range(1, 16))
    widths = []
    for number, phase in enumerate(data["phases"], 1):
        band, bars = panels[number]["band"], panels[number]["bars"]
        assert bars.get_xlim() == pytest.approx((phase["start"], phase["end"]))
        title = band.get_title(loc="left")
        assert " ".join(title.split()) == f"{number}. {phase['title']}"
        assert re.search(r"[a-z]{4,}", phase["title"])  # words, not a number
        assert band.title.get_window_extent(renderer).width <= band.get_window_extent(renderer).width + 1
        widths.append(bars.get_position().width)
    assert min(widths) >= 0.08
    fleet = [p["key"] for p in data["phases"]].index("fleet")
    row = widths[fleet - fleet % timeline.PER_ROW :][: timeline.PER_ROW]
    assert widths[fleet] >= 0.5 * sum(row) / len(row)  # the fleet's


def test_quiet_spans_and_gaps_are_explained(tmp_path, figures):
    """An operator's command running in another process (no request is sent meanwhile) is
    drawn as a span over its phase's bars, named under the panel and in the legend; what
    lies outside the panels (the servers' start-up, the moments between phases) is said
    under the picture with its length."""
    run, _ = recorded_demo(tmp_path, first_phase_at=7.0)
    forced = run.results[[p.key for p in run.plans].index("operator_forced")]
    run.commands = [
        {"start": forced.started + 0.1, "end": forced.started + 0.9, "text": "manage.py baldur_force open payments"}
    ]
    data = run.timeline_data()
    assert data["commands"] == run.commands  # the console's clock here too
    fig = figures(data)
    number = [p["key"] for p in data["phases"]].index("operator_forced") + 1
    panel = timeline.panels(fig)[number]
    spans = [p for p in panel["bars"].patches if p.get_label().startswith("command:")]
    assert len(spans) == 1
    x0 = spans[0].get_path().transformed(spans[0].get_patch_transform()).vertices[:, 0].min()
    assert x0 == pytest.approx(forced.started + 0.1)
    caption = " ".join(t.get_text() for t in panel["caption"].texts)
    assert "0.8 s: manage.py baldur_force open payments" in " ".join(caption.split())
    legend_texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert timeline.COMMAND[0] in legend_texts
    footer = " ".join(t.get_text() for t in fig.texts)
    assert "first 7.0 s" in footer and "0.70 s between phases (at most 0.05 s at once)" in footer


def test_the_note_on_time_says_nothing_lies_between_phases_that_follow_each_other(tmp_path, figures):
    """The demo's phases follow each other (a phase ends once the demo has read its
    counters, and the next starts): the note under the picture says nothing is left out
    between them, not "at most 0.00 s between two phases"."""
    run, _ = recorded_demo(tmp_path, first_phase_at=7.0)
    for before, after in zip(run.results, run.results[1:], strict=False):
        after.started = before.ended
    footer = " ".join(" ".join(t.get_text() for t in figures(run.timeline_data()).texts).split())
    assert "first 7.0 s (starting the servers)" in footer
    assert "0.00 s" not in footer
    assert "nothing between phases" in footer


def test_hc1_the_per_host_phase_draws_one_named_strip_per_host_breaker(tmp_path, figures):
    """HC-1: the per-host phase uses the carriers' breakers, not the shared ``payments``
    one: its band is one strip per host breaker, named after the host, each in its own
    states (the failing host CLOSED then OPEN, the healthy host CLOSED throughout), and the
    shared breaker's state (HALF_OPEN here) is not drawn there; the carriers' quotes are
    bars of their own colour."""
    run, _ = recorded_demo(tmp_path)
    keys = [p.key for p in run.plans]
    phase = run.results[keys.index("per_host")]
    opened_at = phase.started + 0.4
    phase.per_host = {
        "failing": "parcelpost",
        "healthy": "swiftship",
        "breakers": {"parcelpost": "127.0.0.1:8766", "swiftship": "127.0.0.1:8767"},
        "transitions": {
            "parcelpost": [{"from": "closed", "to": "open", "trigger": "consecutive_failures", "t": opened_at}],
            "swiftship": [],
        },
        "failing_counted_when_open": 5,
        "failing_counted_while_open": 0,
        "calls": {"parcelpost": {"quoted": 0}, "swiftship": {"quoted": 7}},
    }
    run.requests = [r for r in run.requests if not phase.started <= r["t"] <= phase.ended]
    run.requests += [{"t": phase.started + 0.1 * i, "host": "127.0.0.1:8767", "outcome": "quoted"} for i in range(1, 8)]
    data = run.timeline_data()
    data["states"].append({"t": phase.started - 0.5, "state": "half_open"})  # payments, all through it
    shown = data["phases"][keys.index("per_host")]
    assert shown["breaker"] is True and [b["name"] for b in shown["bands"]] == [
        "127.0.0.1:8766 (parcelpost)",
        "127.0.0.1:8767 (swiftship)",
    ]
    assert any("only the 127.0.0.1:8766 breaker opens" in n["text"] for n in data["notes"])

    fig = figures(data)
    band = timeline.panels(fig)[keys.index("per_host") + 1]["band"]
    green, red = timeline.BAND_STATES["closed"][1], timeline.BAND_STATES["open"][1]
    strips: dict[float, list[tuple[float, float, str]]] = {}
    for collection in band.collections:
        for path in collection.get_paths():
            ys, xs = path.vertices[:, 1], path.vertices[:, 0]
            strip = strips.setdefault(round(float(ys.min()), 3), [])
            strip.append((round(float(xs.min()), 3), round(float(xs.max()), 3), to_hex(collection.get_facecolor()[0])))
    assert sorted(strips) == [0.0, 0.5]  # two strips, the failing host's on top
    top, bottom = sorted(strips[0.5]), sorted(strips[0.0])
    assert [c for _s, _e, c in top] == [green, red] and top[1][0] == pytest.approx(opened_at, abs=0.001)
    assert [c for _s, _e, c in bottom] == [green]
    assert timeline.BAND_STATES["half_open"][1] not in {c for _s, _e, c in top + bottom}
    labels = [t.get_text() for t in band.texts]
    assert labels and all(label.split(": ")[-1] in {"CLOSED", "OPEN"} for label in labels)
    bars = timeline.panels(fig)[keys.index("per_host") + 1]["bars"]
    assert {to_hex(p.get_facecolor()) for p in bars.patches} == {timeline.OUTCOMES["quoted"][1]}


def long_captions(run):
    """Give phase 7 (the step-down) five commands and the per-host phase its long note, so
    both captions span many lines in their panels."""
    keys = [p.key for p in run.plans]
    step_down = run.results[keys.index("emergency_step_down")]
    run.commands = [
        {"start": step_down.started + 0.05 * i, "end": step_down.started + 0.05 * i + 0.04, "text": text}
        for i, text in enumerate(
            [
                "manage.py baldur_emergency step-down",
                "manage.py baldur_emergency set 0",
                "manage.py baldur_emergency set 0 --reason 'all clear, the upstream is back'",
                "manage.py baldur_status --json",
                "manage.py baldur_force clear payments --reason 'the on-call engineer checked the upstream'",
            ]
        )
    ]
    per_host = run.results[keys.index("per_host")]
    per_host.per_host = {
        "failing": "parcelpost",
        "healthy": "swiftship",
        "breakers": {"parcelpost": "127.0.0.1:37161", "swiftship": "127.0.0.1:42321"},
        "transitions": {
            "parcelpost": [{"from": "closed", "to": "open", "trigger": "x", "t": per_host.started + 0.3}],
            "swiftship": [],
        },
        "failing_counted_when_open": 5,
        "failing_counted_while_open": 0,
        "calls": {"parcelpost": {"quoted": 0}, "swiftship": {"quoted": 20}},
    }
    return keys


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_captions_stay_clear_of_the_legends_and_the_panels_below(tmp_path, figures):
    """Every caption under a panel (the step-down phase's five commands, the per-host
    phase's long note) ends above the legends and the footer (not only beside them), and
    above the next row's panels: the caption row is as tall as its longest caption."""
    run, _ = recorded_demo(tmp_path)
    long_captions(run)
    fig = figures(run.timeline_data())
    renderer = fig.canvas.get_renderer()
    panels = timeline.panels(fig)
    below = [legend.get_window_extent(renderer) for legend in fig.legends]
    below += [text.get_window_extent(renderer) for text in fig.texts if text.get_text().startswith("Time:")]
    assert len(below) == 3
    for number, parts in panels.items():
        for text in parts["caption"].texts:
            if not text.get_text():
                continue
            box = text.get_window_extent(renderer)
            assert box.y0 > max(other.y1 for other in below), (number, text.get_text())
            for other_number, other in panels.items():
                if other_number > number:
                    for axes in (other["band"], other["bars"]):
                        title = axes.title.get_window_extent(renderer)
                        assert not overlaps(box, axes.get_window_extent(renderer)), (number, other_number)
                        assert not title.width or not overlaps(box, title), (number, other_number)


def test_hc1_per_host_bars_count_requests_one_bar_per_host_named_in_the_caption(tmp_path, figures):
    """HC-1: in the per-host phase each request to the shop makes a call to each carrier;
    the bars count requests, as the axis says: one bar per host side by side, each as high
    as the requests sent in its 0.5 s (not two calls per request stacked into one bar), the
    left bar the failing host's; the caption names which bar is which host."""
    run, _ = recorded_demo(tmp_path)
    keys = long_captions(run)
    phase = run.results[keys.index("per_host")]
    hosts = phase.per_host["breakers"]
    run.requests = [r for r in run.requests if not phase.started <= r["t"] <= phase.ended]
    sent = [phase.started + 0.01 + 0.1 * i for i in range(10)]
    for i, t in enumerate(sent):
        bad = "failed" if i < 5 else "rejected"
        run.requests.append({"t": t, "server": "A", "host": hosts["parcelpost"], "outcome": bad})
        run.requests.append({"t": t, "server": "A", "host": hosts["swiftship"], "outcome": "quoted"})
    fig = figures(run.timeline_data())
    panel = timeline.panels(fig)[keys.index("per_host") + 1]
    first = timeline.panels(fig)[1]["bars"]
    assert first.get_ylabel() == "requests sent\nper 0.5 s"
    per_bin = Counter(math.floor(t / timeline.BIN) for t in sent)
    stacks: dict[tuple[str, int], float] = {}
    lefts: dict[str, float] = {}
    for patch in panel["bars"].patches:
        host = (patch.get_gid() or "").removeprefix("host:")
        assert host in hosts.values(), patch.get_gid()
        b = math.floor((patch.get_x() + 1e-9) / timeline.BIN)
        stacks[(host, b)] = stacks.get((host, b), 0) + patch.get_height()
        lefts[host] = min(lefts.get(host, math.inf), patch.get_x() - b * timeline.BIN)
        assert patch.get_width() <= timeline.BIN / 2
    assert stacks == {(host, b): n for host in hosts.values() for b, n in per_bin.items()}
    assert lefts[hosts["parcelpost"]] < lefts[hosts["swiftship"]]
    caption = " ".join(" ".join(t.get_text() for t in panel["caption"].texts).split())
    assert "left 127.0.0.1:37161 (parcelpost), right 127.0.0.1:42321 (swiftship)" in caption


def test_hc1_each_host_strip_is_named_with_its_host_however_narrow(tmp_path, figures):
    """HC-1: each of the per-host phase's strips carries its breaker's name, the host
    (``127.0.0.1:PORT``), even in a phase far shorter than the others, where the name with
    the state does not fit in a run."""
    run, _ = recorded_demo(tmp_path)
    keys = long_captions(run)
    phase = run.results[keys.index("per_host")]
    phase.ended = phase.started + 0.3
    phase.per_host["transitions"]["parcelpost"][0]["t"] = phase.started + 0.1
    fig = figures(run.timeline_data())
    band = timeline.panels(fig)[keys.index("per_host") + 1]["band"]
    texts = [t.get_text() for t in band.texts]
    for host in phase.per_host["breakers"].values():
        assert any(host in text for text in texts), texts


def test_a_held_phase_shows_each_requests_time_held_and_its_deadline(tmp_path, figures):
    """Issue 28 item 10: an outbound-stage phase ("held": True) draws, over its bars, one dot
    per request at (when it was sent, seconds held) on a right-hand axis, a diamond for a
    request to another view, and its deadline as a dashed line; the new outcomes take their
    colours in the bars; a phase without "held" gets no such axis."""
    data = {
        "phases": [
            {"key": "a", "label": "plain", "title": "plain phase", "start": 0.0, "end": 2.0, "breaker": True},
            {
                "key": "b",
                "label": "held",
                "title": "held phase",
                "start": 2.0,
                "end": 4.0,
                "breaker": True,
                "held": True,
                "deadline": 1.0,
                "bands": [
                    {"name": "rates breaker, shop A", "host": "shop A", "states": [{"t": 2.0, "state": "closed"}]}
                ],
            },
        ],
        "states": [{"t": 0.0, "state": "closed"}],
        "requests": [{"t": 0.5, "outcome": "paid"}]
        + [{"t": 2.1, "outcome": "failed", "held": 4.5}]
        + [{"t": 2.2 + 0.1 * i, "outcome": "retry_after", "held": 0.01} for i in range(3)]
        + [
            {"t": 2.6, "outcome": "bulkhead_full", "held": 0.02},
            {"t": 2.7, "outcome": "other_view", "held": 2.5, "probe": True},
        ],
    }
    fig = figures(data)
    held = [ax for ax in fig.axes if ax.get_label().startswith("held:")]
    assert [ax.get_label() for ax in held] == ["held:2"]
    offsets = [tuple(round(float(v), 3) for v in point) for c in held[0].collections for point in c.get_offsets()]
    assert sorted(offsets) == sorted([(2.1, 4.5), (2.2, 0.01), (2.3, 0.01), (2.4, 0.01), (2.6, 0.02), (2.7, 2.5)])
    markers = [len(c.get_offsets()) for c in held[0].collections]
    assert markers == [5, 1]  # dots, then the other view's diamond
    assert [line.get_ydata()[0] for line in held[0].lines] == [1.0]  # the deadline
    colours = {to_hex(p.get_facecolor()) for p in timeline.panels(fig)[2]["bars"].patches}
    for outcome in ("failed", "retry_after", "bulkhead_full", "other_view"):
        assert timeline.OUTCOMES[outcome][1] in colours, outcome
