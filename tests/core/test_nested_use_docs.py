"""CB-19: the user guide describes nested use of one breaker as the code does it.

states-and-triggers.md once said a call nested inside a HALF_OPEN trial through the same
breaker was refused with ``half_open_full``; the rule is one call, one outcome: the outer
call asks and records, the inner one runs through.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "states-and-triggers.md"
TITLE = "## Calling a protected function through the same breaker"


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(TITLE)
    end = text.find("\n## ", start + len(TITLE))
    return text[start : end if end != -1 else len(text)]


def test_cb19_nested_use_section_states_one_call_one_outcome():
    """CB-19: the section says the outer call records one outcome and the inner call runs
    through (never refused, no second slot, nothing recorded), and no longer describes the
    old refusal of the inner call."""
    prose = " ".join(section().split())
    assert "half_open_full" not in prose
    assert "refused with" not in prose
    for claim in (
        "counts one outcome for the whole: the outer call's",
        "The nested call records nothing itself",
        "only the final outcome of the retry sequence",
        "it is not refused and takes no slot of its own",
        "a trial never closes the breaker on a fallback's value",
    ):
        assert claim in prose, claim


def test_cb19_nested_use_section_names_no_requirement_id():
    """CB-19: the guide's prose carries no requirement ids."""
    assert not re.search(r"\b(CB|FAC|RL|IN|OP|CFG|ST|EM|HC)-[0-9]+", section())
