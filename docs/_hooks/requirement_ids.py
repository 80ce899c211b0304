"""MkDocs hook: behaviour ids (``CB-12``, ``EM-7``) appear on the Behaviour reference page
only, and no page names an issue number; either fails the strict build.

The ids are the test suite's short names for the package's promises. The Behaviour
reference (``behaviour-reference.md``) is the one page that maps them to behaviour, each
defined on a ``- <a id="cb-12"></a>**CB-12** ...`` line (:func:`defined`, which the docs
tests read too). Every other page -- the guides, the settings page, the changelog and the
API reference generated from the docstrings -- explains behaviour in words, so after each
page is rendered this hook warns about any id in its text, and about an "issue 21" on any
page: a reader cannot resolve either.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

#: A behaviour id as the tests write it.
ID = re.compile(r"\b(CFG|CB|FAC|RL|IN|OP|ST|EM|HC|Q)-(\d+)\b")
#: A reference to an issue of the project's tracker, which the site's reader cannot open.
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
PAGE = "behaviour-reference.md"
DEFINITION = re.compile(r'^- <a id="((?:cfg|cb|fac|rl|in|op|st|em|hc|q)-\d+)"></a>\*\*[A-Z]+-\d+\*\* (.+)$')
#: Markup and comments: what remains between them is the text a reader sees.
TOKEN = re.compile(r"(<!--.*?-->|<[^>]+>)", re.S)

log = logging.getLogger("mkdocs.hooks.requirement_ids")


def defined(page: Path) -> dict[str, str]:
    """The ids *page* (the Behaviour reference's Markdown) defines, as written (``CB-12``),
    each with its one-line definition (Markdown stripped of its backticks)."""
    found = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        match = DEFINITION.match(line)
        if match:
            found[match.group(1).upper()] = match.group(2).replace("`", "").strip()
    return found


def shown(html: str) -> str:
    """The text of *html* a reader sees (tags and comments removed, code included)."""
    return "".join(part for part in TOKEN.split(html) if not part.startswith("<"))


def on_page_content(html: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    """Warn when a page other than the Behaviour reference shows an id, or any page an issue number."""
    where = page.file.src_uri
    text = shown(html)
    if where != PAGE:
        ids = sorted(
            {match.group(0) for match in ID.finditer(text)},
            key=lambda name: (name.split("-")[0], int(name.split("-")[1])),
        )
        if ids:
            log.warning(
                "%s: names %s; behaviour ids belong on the Behaviour reference (%s) only: say what the rule does instead",
                where,
                ", ".join(ids),
                PAGE,
            )
    issues = sorted({match.group(0) for match in ISSUE.finditer(text)})
    if issues:
        log.warning(
            "%s: names %s, which a reader of the site cannot look up: describe the change instead",
            where,
            ", ".join(issues),
        )
    return html
