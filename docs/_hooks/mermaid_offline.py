"""MkDocs hook: the site's diagrams render offline, and a page that would show a diagram's
source fails the strict build.

The theme turns each ```` ```mermaid ```` block into a diagram with the mermaid script,
which it would otherwise download from a CDN when the page opens (offline, the reader sees
the diagram's source). This hook serves the script from the built site instead:

* ``python docs/_hooks/mermaid_offline.py`` (run by ``./dev docs``) fetches the pinned
  mermaid release from the npm registry (``npm pack``) and keeps its one-file browser build
  in ``docs/_vendor/`` (git-ignored; fetched again only when :data:`VERSION` changes). The
  build copies it into the site like any other file under ``docs/``.
* On each built page with a diagram, the hook adds a ``<script>`` for that local copy
  before the theme's own script, so the theme finds the library loaded and fetches nothing.

When the script cannot be had (no network, no npm cache), ``./dev docs`` still builds the
site, without diagrams: it sets ``BALDUR_DOCS_NO_DIAGRAMS=1`` and the hook puts a short note
in place of each diagram. Otherwise it warns (which fails ``mkdocs build --strict``) when a
page has a diagram and the local script is missing, when a ``mermaid`` block was rendered as highlighted code (its source
would show), and when a page loads a script or a stylesheet from another host.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.utils import get_relative_url

#: The mermaid release served with the site (the theme's diagrams are written for 11.x).
VERSION = "11.17.2"
#: Where the script lives, relative to the docs directory (and so to the built site).
SCRIPT = "_vendor/mermaid.min.js"
DOCS = Path(__file__).resolve().parents[1]
#: Seconds ``npm pack`` may take before the fetch gives up (``BALDUR_DOCS_FETCH_TIMEOUT``).
FETCH_TIMEOUT = float(os.environ.get("BALDUR_DOCS_FETCH_TIMEOUT", "60"))
#: Set (to anything but empty or 0) by ``./dev docs`` when the script could not be fetched.
NO_DIAGRAMS = "BALDUR_DOCS_NO_DIAGRAMS"
NOTE = (
    '<p class="admonition note">This diagram is not shown: the site was built without the mermaid '
    "script (it could not be fetched). Run <code>./dev docs</code> with access to the npm registry "
    "to build it with diagrams.</p>"
)
#: A whole diagram block as the theme renders it.
DIAGRAM_BLOCK = re.compile(r'<(pre|div)\b[^>]*\bclass="mermaid"[^>]*>.*?</\1>', re.S)

log = logging.getLogger("mkdocs.hooks.mermaid_offline")

DIAGRAM = re.compile(r'<(?:pre|div)\b[^>]*\bclass="mermaid"')
AS_CODE = re.compile(r'class="[^"]*\blanguage-mermaid\b')
THEME_SCRIPT = re.compile(r'<script\b[^>]*\bsrc="[^"]*assets/javascripts/bundle\.[^"]*"')
REMOTE = re.compile(r'<(script|link)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]+)"[^>]*>')
#: Link tags that make the browser fetch something (a canonical or alternate link does not).
FETCHING = re.compile(r'\brel="[^"]*\b(?:stylesheet|preload|modulepreload|icon|manifest)\b')


def fetched(docs_dir: Path = DOCS) -> Path | None:
    """The local mermaid script under *docs_dir* when it is there at :data:`VERSION`, else None."""
    script = docs_dir / SCRIPT
    stamp = script.with_name("VERSION")
    if script.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == VERSION:
        return script
    return None


def fetch(docs_dir: Path = DOCS) -> Path:
    """Fetch mermaid :data:`VERSION` from the npm registry into ``docs_dir/_vendor/``, unless
    it is there already; returns the script's path.

    Raises:
        RuntimeError: npm is missing, or the package could not be fetched or lacks the script.
    """
    have = fetched(docs_dir)
    if have is not None:
        return have
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: it fetches the mermaid script the docs serve (apt-get install npm)")
    script = docs_dir / SCRIPT
    print(
        f"docs: fetching mermaid {VERSION} (the diagrams' script) with npm, once; giving up after "
        f"{FETCH_TIMEOUT:g} s (BALDUR_DOCS_FETCH_TIMEOUT)...",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="baldur-mermaid-") as tmp:
        try:
            done = subprocess.run(
                [npm, "pack", f"mermaid@{VERSION}", "--json", "--pack-destination", tmp],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=FETCH_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"npm did not fetch mermaid@{VERSION} within {FETCH_TIMEOUT:g} s (no network or registry?)"
            ) from None
        if done.returncode != 0:
            raise RuntimeError(f"npm pack mermaid@{VERSION} failed:\n{done.stderr[-2000:]}")
        tarball = Path(tmp) / json.loads(done.stdout)[0]["filename"]
        with tarfile.open(tarball) as archive:
            member = archive.extractfile("package/dist/mermaid.min.js")
            if member is None:
                raise RuntimeError(f"mermaid@{VERSION} has no dist/mermaid.min.js")
            body = member.read()
    script.parent.mkdir(parents=True, exist_ok=True)
    partial = script.with_suffix(".part")
    partial.write_bytes(body)
    partial.replace(script)
    script.with_name("VERSION").write_text(VERSION + "\n", encoding="utf-8")
    return script


def on_post_page(output: str, page: Any, config: Any, **kwargs: Any) -> str:
    """Check the built page; on a page with a diagram, load the local mermaid script first."""
    where = page.file.src_uri
    for match in REMOTE.finditer(output):
        tag, url = match.groups()
        if tag == "link" and not FETCHING.search(match.group(0)):
            continue
        log.warning("%s: loads a %s from another host (%s); the site must work offline", where, tag, url)
    if AS_CODE.search(output):
        log.warning("%s: a mermaid block was rendered as code, so its source would show instead of the diagram", where)
    if not DIAGRAM.search(output):
        return output
    if os.environ.get(NO_DIAGRAMS, "") not in ("", "0"):
        return DIAGRAM_BLOCK.sub(NOTE, output)
    if fetched(Path(config["docs_dir"])) is None:
        log.warning(
            "%s: has a diagram but %s (mermaid %s) is missing from the docs, so the diagram's source would show "
            "offline; run ./dev docs (it fetches the script from the npm registry)",
            where,
            SCRIPT,
            VERSION,
        )
        return output
    tag = f'<script src="{get_relative_url(SCRIPT, page.url)}"></script>'
    theme = THEME_SCRIPT.search(output)
    if theme is None:
        log.warning("%s: the theme's script tag was not found; the local mermaid script is not loaded", where)
        return output
    return output[: theme.start()] + tag + output[theme.start() :]


if __name__ == "__main__":
    try:
        path = fetch()
    except RuntimeError as exc:
        sys.exit(f"docs: {exc}")
    print(f"docs: mermaid {VERSION} at {path.relative_to(DOCS.parent)}", file=sys.stderr)
