"""MkDocs hook: every behaviour id the site shows (``CB-12``, ``EM-7``) links to its line
on the Behaviour reference page, and an id that page does not define fails the strict build.

The ids come from the docstrings (through the API reference) and the guides. After each
page is rendered, every id in its text (outside links, headings and code blocks) becomes a
link to ``behaviour-reference.md#cb-12``; so do the docstrings' "section 0" (the public
names, on the same page) and "section 10" (the settings page). The defined ids are the
``- <a id="cb-12"></a>**CB-12** ...`` lines of that page (:func:`defined`), which the docs
tests read too; each link's tooltip is the id's one-line definition.
"""

from __future__ import annotations

import logging
import re
from html import escape
from pathlib import Path
from typing import Any

from mkdocs.utils import get_relative_url

#: A behaviour id as the docs and docstrings write it.
ID = re.compile(r"\b(CFG|CB|FAC|RL|IN|OP|ST|EM|HC|Q)-(\d+)\b")
#: "section 0" / "section 10" of the contract the docstrings sometimes name.
SECTION = re.compile(r"\bsection (0|10)\b")
PAGE = "behaviour-reference.md"
DEFINITION = re.compile(r'^- <a id="((?:cfg|cb|fac|rl|in|op|st|em|hc|q)-\d+)"></a>\*\*[A-Z]+-\d+\*\* (.+)$')
SKIP = {"a", "pre", "script", "style", "h1", "h2", "h3", "h4", "h5", "h6", "textarea"}
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


def link(html: str, targets: dict[str, str], known: dict[str, str], where: str) -> str:
    """*html* with each id and contract section in its text turned into a link: ids to
    ``targets["ids"]`` (with the definition as the tooltip), "section 0" to
    ``targets["section 0"]``, "section 10" to ``targets["section 10"]``; warns about ids
    that *known* lacks."""
    out = []
    skipping: list[str] = []
    for part in TOKEN.split(html):
        if part.startswith("<"):
            match = re.match(r"<(/?)([a-zA-Z0-9]+)", part)
            if match:
                closing, tag = match.group(1), match.group(2).lower()
                if tag in SKIP and not part.endswith("/>"):
                    if closing:
                        if tag in skipping:
                            del skipping[len(skipping) - 1 - skipping[::-1].index(tag)]
                    else:
                        skipping.append(tag)
            out.append(part)
            continue
        if skipping:
            out.append(part)
            continue

        def to_id(match: re.Match[str]) -> str:
            name = match.group(0)
            if name not in known:
                log.warning("%s: names %s, which the Behaviour reference (%s) does not define", where, name, PAGE)
                return name
            tip = escape(f"{name}: {known[name]}", quote=True)
            return f'<a class="behaviour-id" href="{targets["ids"]}#{name.lower()}" title="{tip}">{name}</a>'

        def to_section(match: re.Match[str]) -> str:
            return f'<a href="{targets[match.group(0)]}">{match.group(0)}</a>'

        out.append(SECTION.sub(to_section, ID.sub(to_id, part)))
    return "".join(out)


def on_page_content(html: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    """Link the ids of one rendered page to the Behaviour reference."""
    reference = files.get_file_from_path(PAGE)
    where = page.file.src_uri
    if reference is None:
        if ID.search(html):
            log.warning("%s: shows behaviour ids but the site has no %s to define them", where, PAGE)
        return html
    if where == PAGE:
        return html
    base = get_relative_url(reference.url, page.url)
    settings = files.get_file_from_path("settings.md")
    targets = {
        "ids": base,
        "section 0": f"{base}#public-names",
        "section 10": get_relative_url(settings.url, page.url) if settings is not None else base,
    }
    return link(html, targets, defined(Path(reference.abs_src_path)), where)
