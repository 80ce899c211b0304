"""docs/emergency.md: names only real settings, commands, signals and log events; its links resolve."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from baldur_django import signals
from baldur_django.core.knobs import KNOBS

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = (DOCS / "emergency.md").read_text(encoding="utf-8")
PACKAGE = Path(signals.__file__).resolve().parent


def test_em_docs_name_only_real_settings():
    """EM-1..EM-5 docs: every BALDUR_* name on the page is a knob."""
    named = set(re.findall(r"BALDUR_[A-Z0-9_]+", PAGE))
    assert named and named <= set(KNOBS), sorted(named - set(KNOBS))


def test_em_docs_log_events_and_signal_exist_in_the_code():
    """EM-1: the log events and the signal the page names are the ones the code emits."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    for event in set(re.findall(r"`((?:emergency|circuit_breaker)\.[a-z_]+)`", PAGE)):
        assert f'"{event}' in source or f"'{event}" in source, event
    assert hasattr(signals, "emergency_level_changed")


def test_em_docs_links_resolve_and_python_is_valid():
    """Docs: relative links point at files that exist; python blocks parse."""
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", PAGE):
        if not target.startswith("http"):
            assert (DOCS / target).exists(), target
    for block in re.findall(r"```python\n(.*?)```", PAGE, flags=re.S):
        ast.parse(block)
    assert "(emergency.md)" in (DOCS / "index.md").read_text(encoding="utf-8")
