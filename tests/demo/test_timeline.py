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
    states = [{"t": 0.0, "state": "closed"}, {"t": 4.5, "state": "open"}, {"t": 7.0, "state": "half_open"},
              {"t": 8.0, "state": "forced_open"}, {"t": 10.0, "state": "frozen"}]
    requests = [{"t": i * 0.25, "outcome": "paid" if i < 16 else "failed" if i < 20 else "rejected"} for i in range(50)]
    path = timeline.draw(tmp_path / "t.png", {"phases": PHASES, "states": states, "requests": requests,
                                              "notes": [{"t": 4.6, "text": "opens"}], "title": "t", "subtitle": "s"})
    assert path.read_bytes()[:4] == b"\x89PNG"
    found = colours(path)
    for state in ("closed", "open", "half_open", "forced_open", "frozen"):
        assert found[rgb(timeline.BAND_STATES[state][1])] > 200, state
    assert found[rgb(timeline.BAND_STATES["forced_closed"][1])] == 0  # not in the data, not drawn
    for outcome in ("paid", "failed", "rejected"):
        assert found[rgb(timeline.OUTCOMES[outcome][1])] > 200, outcome


def test_a_state_missing_from_the_table_is_drawn_grey(tmp_path):
    """A state the table does not know yet is drawn in the 'state unknown' grey, not dropped."""
    path = timeline.draw(tmp_path / "t.png", {"phases": PHASES, "states": [{"t": 0.0, "state": "melted"}], "requests": []})
    assert colours(path)[rgb(timeline.UNKNOWN_STATE[1])] > 1000


def test_no_phase_is_a_clear_error(tmp_path):
    """Without a phase there is no time axis: ValueError, and no file is written."""
    with pytest.raises(ValueError, match="at least one phase"):
        timeline.draw(tmp_path / "t.png", {"phases": [], "states": [], "requests": []})
    assert not (tmp_path / "t.png").exists()
