"""The demo's picture (``testproject.timeline.draw``) on made-up data, without servers:
the band is drawn from the BAND_STATES table alone, the bars from OUTCOMES."""

from __future__ import annotations

from collections import Counter

import pytest

from testproject import timeline

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


def test_call_outs_never_cover_each_other(tmp_path):
    """Call-outs close in time are stacked: every note is drawn (one text each) and no two
    frames overlap, however many fall on the same few seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(15, 9), dpi=100)
    ax = fig.add_subplot()
    ax.set_xlim(0, 20)
    notes = [
        {"t": t, "text": f"note {i}:\na call-out\nof three lines"}
        for i, t in enumerate((1.0, 1.5, 2.0, 2.2, 9.0, 19.5, 19.8))
    ]
    try:
        boxes = timeline.place_callouts(ax, notes, 20, fig.canvas.get_renderer())
        assert len(boxes) == len(notes)
        assert sorted(text.get_text() for text in ax.texts) == sorted(n["text"] for n in notes)
        for i, first in enumerate(boxes):
            for second in boxes[i + 1 :]:
                assert not first.overlaps(second), (first, second)
        axes_top = ax.get_window_extent().y1
        assert all(box.y1 <= axes_top + 6 for box in boxes)  # none pushed above the panel
        assert boxes[4].y1 == pytest.approx(boxes[0].y1)  # a lone note stays at the top
    finally:
        plt.close(fig)
