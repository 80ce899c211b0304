"""The documentation site (mkdocs.yml): the strict build passes, and it is strict enough to
catch a broken link, a reference to a missing module and a malformed docstring (Q-3); the
site works offline: every diagram page loads the mermaid script from the site itself (which
``./dev docs`` fetches from the npm registry), no page loads anything from another host, the
diagrams render in a browser that can reach nothing else, and a page that would show a
diagram's source fails the strict build.

Each build runs ``mkdocs build --strict`` in a subprocess into a temporary directory, as
``./dev docs`` does into ``site/``."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

pytestmark = [pytest.mark.slow]

#: The public modules whose reference the site must carry, with one object each that the
#: page must show (an anchor id mkdocstrings gives the object).
PUBLIC = {
    "baldur_django": "baldur_django.protected",
    "baldur_django.middleware": "baldur_django.middleware.CircuitBreakerMiddleware",
    "baldur_django.signals": "baldur_django.signals.circuit_opened",
    "baldur_django.tasks": "baldur_django.tasks.recovery_sweep",
    "baldur_django.contrib.drf": "baldur_django.contrib.drf.BaldurThrottleMixin",
    "baldur_django.contrib.flask": "baldur_django.contrib.flask.BaldurFlask",
    "baldur_django.contrib.asgi": "baldur_django.contrib.asgi.BaldurASGIMiddleware",
    "baldur_django.contrib.slack": "baldur_django.contrib.slack.SlackNotifier",
}


def mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the docs import the package, never a project
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


HOOKS = DOCS / "_hooks"


def load_hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mermaid_offline = load_hook("mermaid_offline")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    mermaid_offline.fetch()  # as ./dev docs does first (once: docs/_vendor/ keeps it)
    out = tmp_path_factory.mktemp("site")
    done = mkdocs(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done


def test_q3_strict_build_passes_without_a_warning(site):
    """Q-3: ``mkdocs build --strict`` over docs/ and the docstrings succeeds with no warning."""
    _, done = site
    assert "WARNING" not in done.stderr, done.stderr
    assert "Documentation built" in done.stderr


def test_q3_every_docs_page_is_in_the_site(site):
    """Q-3: every Markdown page under docs/ is built (and listed in the nav: an omitted page
    would have warned)."""
    out, _ = site
    pages = sorted(p.relative_to(DOCS) for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)
    assert len(pages) >= 10
    for page in pages:
        built = out / ("index.html" if page.name == "index.md" else page.with_suffix("") / "index.html")
        assert built.exists(), f"{page} was not built"


def test_q3_api_reference_covers_the_public_modules(site):
    """Q-3: the API reference has a section for each public module and shows its objects,
    with the Sphinx roles of the docstrings rendered as plain code and the signals'
    ``#:`` comments as their descriptions."""
    out, _ = site
    html = (out / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for module, member in PUBLIC.items():
        assert f'id="{module}"' in html, module
        assert f'id="{member}"' in html, member
    assert not re.search(r":(class|func|meth|attr|data):", html)
    assert "A breaker went OPEN on its own" in html
    settings = (out / "settings" / "index.html").read_text(encoding="utf-8")
    assert "BALDUR_CB_FAILURE_THRESHOLD" in settings


PROBE_MODULE = '''
"""A module for the strictness probe."""


def documented(x: int) -> int:
    """Return *x*.

    Args:
        x: a number.
        y: a parameter this function does not have.
    """
    return x
'''


@pytest.mark.parametrize(
    "case, page, expected",
    [
        ("broken link", "# Probe\n\nSee [the missing page](missing.md).\n", "missing.md"),
        ("missing reference", "# Probe\n\n::: baldur_django.no_such_module\n", "baldur_django.no_such_module"),
        ("docstring warning", "# Probe\n\n::: docs_probe_module\n", "does not appear in the function signature"),
    ],
)
def test_q3_strict_build_fails_on(tmp_path, case, page, expected):
    """Q-3: the site's configuration (inherited as-is) turns a broken link, a reference to a
    module that does not exist and a docstring naming an unknown parameter into a failed build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(page, encoding="utf-8")
    (tmp_path / "docs_probe_module.py").write_text(PROBE_MODULE, encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        "nav: [index.md]\n"
        f"hooks: [{HOOKS / 'mermaid_offline.py'}]\n"
        "plugins:\n"
        "  mkdocstrings:\n"
        "    handlers:\n"
        "      python:\n"
        f"        paths: [{tmp_path}, {ROOT}]\n"
        "        options:\n"
        f"          extensions: [griffe_sphinx, {DOCS / '_hooks' / 'sphinx_roles.py'}]\n",
        encoding="utf-8",
    )
    done = mkdocs(config, tmp_path / "site")
    assert done.returncode != 0, f"{case}: the strict build passed\n{done.stderr}"
    assert expected in done.stderr, done.stderr


class Tags(HTMLParser):
    """The ``src`` of every script tag and the ``href`` of every link tag that fetches
    something (a stylesheet, an icon, a preload) of a page, in order, and how many mermaid
    diagrams it has."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.links: list[str] = []
        self.diagrams = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])
        rel = set((attrs.get("rel") or "").split())
        if tag == "link" and attrs.get("href") and rel & {"stylesheet", "preload", "modulepreload", "icon", "manifest"}:
            self.links.append(attrs["href"])
        if "mermaid" in (attrs.get("class") or "").split():
            self.diagrams += 1


def pages(out: Path) -> dict[Path, Tags]:
    found = {}
    for page in sorted(out.rglob("*.html")):
        tags = Tags()
        tags.feed(page.read_text(encoding="utf-8"))
        found[page] = tags
    return found


def test_offline_each_diagram_page_loads_the_mermaid_script_from_the_site(site):
    """Offline docs: the pages with a diagram (the architecture page has two) load the
    mermaid script by a relative link to a file that exists in the built site, before the
    theme's script (which would fetch it from a CDN if it found none)."""
    out, _ = site
    with_diagrams = {page: tags for page, tags in pages(out).items() if tags.diagrams}
    assert out / "architecture" / "index.html" in with_diagrams
    for page, tags in with_diagrams.items():
        local = [src for src in tags.scripts if src.endswith("mermaid.min.js")]
        assert len(local) == 1, f"{page}: {tags.scripts}"
        assert "//" not in local[0], local
        script = (page.parent / local[0]).resolve()
        assert script.is_relative_to(out.resolve()) and script.stat().st_size > 1_000_000, script
        theme = next(i for i, src in enumerate(tags.scripts) if "assets/javascripts/bundle." in src)
        assert tags.scripts.index(local[0]) < theme


def test_offline_no_page_loads_a_script_or_stylesheet_from_another_host(site):
    """Offline docs: no built page has a script or a link tag pointing at another host."""
    out, _ = site
    remote = {
        str(page.relative_to(out)): [url for url in tags.scripts + tags.links if urlsplit(url).netloc]
        for page, tags in pages(out).items()
    }
    assert not {page: urls for page, urls in remote.items() if urls}


CHROMIUM = os.environ.get("BALDUR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BALDUR_CHROMEDRIVER", "/usr/bin/chromedriver")


def start_browser(profile: str):
    """A headless Chromium that resolves no host but 127.0.0.1, or (None, reason)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return None, f"{CHROMIUM} or {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except Exception as exc:
        return None, f"headless Chromium did not start: {type(exc).__name__}: {exc}"
    driver.set_page_load_timeout(30)
    return driver, ""


@pytest.mark.browser
def test_offline_diagrams_render_in_a_browser_that_reaches_no_other_host(site):
    """Offline docs: served from loopback to a headless Chromium that can resolve no other
    host, the architecture page draws its diagrams (an SVG in each diagram block) instead of
    showing their source."""
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.conftest import need_server

    out, _ = site

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = tempfile.mkdtemp(prefix="baldur-docs-chromium-")
    driver, problem = start_browser(profile)
    try:
        need_server("headless Chromium", driver is not None, problem)
        driver.set_window_size(1280, 1000)  # a laptop's width: the diagrams must read there
        driver.get(urljoin(f"http://127.0.0.1:{server.server_port}/", "architecture/"))
        # the theme swaps each diagram's source block for a drawing in a closed shadow root
        drawn = (
            "return [...document.querySelectorAll('.mermaid')].map(b =>"
            " b.tagName + ':' + b.textContent.trim().length + ':' + (b.getBoundingClientRect().height > 100))"
        )
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(drawn) == ["DIV:0:true"] * 2)
        shown = driver.execute_script("return document.querySelector('article').innerText")
        assert "flowchart" not in shown and "-->" not in shown
        assert driver.execute_script("return typeof mermaid") == "object"
        # the layers diagram is drawn tall and narrow enough to keep its text at reading size: a
        # wide one is scaled down to the column's width, and came out about 260 px tall with
        # labels of a few pixels
        heights = driver.execute_script(
            "return [...document.querySelectorAll('.mermaid')].map(b => b.getBoundingClientRect().height)"
        )
        assert heights[0] > 900, heights
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "case, vendor, expected",
    [
        ("no local script", False, "is missing from the docs"),
        ("mermaid block drawn as code", True, "rendered as code"),
        ("a script from a CDN", True, "from another host"),
    ],
)
def test_offline_strict_build_fails_when_a_diagram_would_show_its_source(tmp_path, case, vendor, expected):
    """Offline docs: the strict build fails on a page with a diagram when the local mermaid
    script is missing, when a mermaid block is rendered as highlighted code, and when a page
    loads a script from another host."""
    docs = tmp_path / "docs"
    docs.mkdir()
    page = "# Probe\n\n```mermaid\nflowchart LR\n  a --> b\n```\n"
    if case == "mermaid block drawn as code":  # what a mermaid fence without its fence config gives
        page += '\n<pre><code class="language-mermaid">flowchart LR\n  a --> b</code></pre>\n'
    if case == "a script from a CDN":
        page += '\n<script src="https://cdn.example.invalid/mermaid.min.js"></script>\n'
    (docs / "index.md").write_text(page, encoding="utf-8")
    if vendor:
        mermaid_offline.fetch()
        (docs / "_vendor").mkdir()
        for name in ("mermaid.min.js", "VERSION"):
            (docs / "_vendor" / name).symlink_to(DOCS / "_vendor" / name)
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        "nav: [index.md]\n"
        f"hooks: [{HOOKS / 'mermaid_offline.py'}]\n"
        "plugins:\n"
        "  mkdocstrings:\n"
        "    handlers:\n"
        "      python:\n"
        f"        paths: [{ROOT}]\n"
        "        options:\n"
        f"          extensions: [griffe_sphinx, {HOOKS / 'sphinx_roles.py'}]\n",
        encoding="utf-8",
    )
    done = mkdocs(config, tmp_path / "site")
    assert done.returncode != 0, f"{case}: the strict build passed\n{done.stderr}"
    assert expected in done.stderr, done.stderr


requirement_ids = load_hook("requirement_ids")
TESTS = ROOT / "tests"
PACKAGE = ROOT / "baldur_django"
RANGE = re.compile(r"\b([A-Z]+)-(\d+)\s*(?:\.\.|\u2013)\s*(?:\1-)?(\d+)\b")
#: Ids the other work of this release adds (predicates, nesting, the transition table,
#: pluggable stores, the shared inbound policy, the HTTP adapters and health).
NEW_IDS = {"CB-18", "CB-19", "CB-20", "ST-6", "IN-7"} | {f"HC-{n}" for n in range(1, 7)}
#: Test files that write made-up ids on purpose (probes of the checks).
PROBES = {TESTS / "test_docs_site.py", TESTS / "test_plain_words.py"}


def ids_in(text: str) -> set[str]:
    """Every behaviour id *text* names, ranges (``CB-15..CB-17``) expanded."""
    found = {m.group(0) for m in requirement_ids.ID.finditer(text)}
    for prefix, low, high in RANGE.findall(text):
        if requirement_ids.ID.fullmatch(f"{prefix}-{low}") and int(high) > int(low):
            found |= {f"{prefix}-{n}" for n in range(int(low), int(high) + 1)}
    return found


def used_ids() -> dict[str, set[str]]:
    """Where each behaviour id is named: the tests (their names and docstrings), the package
    and the Markdown pages (which should name none but the Behaviour reference)."""
    where: dict[str, set[str]] = {}
    sources = (
        [p for p in sorted(TESTS.rglob("*.py")) if p not in PROBES]
        + sorted(PACKAGE.rglob("*.py"))
        + [p for p in sorted(DOCS.rglob("*.md")) if "_vendor" not in p.parts]
        + [ROOT / "README.md"]
    )
    for path in sources:
        for name in ids_in(path.read_text(encoding="utf-8")):
            where.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return where


def test_q3_every_behaviour_id_the_tests_name_is_defined():
    """Q-3: each id the tests name (CB-12, EM-7, the ends and the inside of a range like
    CB-15..CB-17) has its one-line definition on the Behaviour reference page, and so have
    the ids this release's other work adds."""
    defined = requirement_ids.defined(DOCS / "behaviour-reference.md")
    used = used_ids()
    assert len({name for name, paths in used.items() if any(p.startswith("tests/") for p in paths)}) > 60
    missing = {name: sorted(paths) for name, paths in used.items() if name not in defined}
    assert not missing, f"ids without a definition on docs/behaviour-reference.md: {missing}"
    assert set(defined) >= NEW_IDS, sorted(NEW_IDS - set(defined))
    assert all(len(text) > 30 for text in defined.values())


def test_q3_nothing_points_at_a_requirements_document_the_repository_lacks():
    """Q-3: no docstring or page sends the reader to a "REQUIREMENTS" document (the
    repository has none): the public names are on the Behaviour reference page."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted(PACKAGE.rglob("*.py")) + sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
        if re.search(r"REQUIREMENTS(?:\.md)?\b", path.read_text(encoding="utf-8"))
    ]
    assert not offenders


def test_q3_built_site_shows_ids_only_on_the_behaviour_reference(site):
    """Q-3: no built page but the Behaviour reference shows a behaviour id (the API
    reference generated from the docstrings included), no page shows an issue number, and
    the Behaviour reference has an anchor for every id it defines and is in the nav."""
    out, _ = site
    reference = out / "behaviour-reference" / "index.html"
    shown = {page: requirement_ids.shown(page.read_text(encoding="utf-8")) for page in sorted(out.rglob("*.html"))}
    assert reference in shown and out / "reference" / "api" / "index.html" in shown
    with_ids = {
        str(page.relative_to(out)): sorted({m.group(0) for m in requirement_ids.ID.finditer(text)})
        for page, text in shown.items()
        if page != reference and requirement_ids.ID.search(text)
    }
    assert not with_ids
    with_issues = {str(page.relative_to(out)) for page, text in shown.items() if requirement_ids.ISSUE.search(text)}
    assert not with_issues
    html = reference.read_text(encoding="utf-8")
    defined = requirement_ids.defined(DOCS / "behaviour-reference.md")
    assert len(defined) > 60
    assert all(f'id="{name.lower()}"' in html for name in defined)
    assert "Behaviour reference" in (out / "index.html").read_text(encoding="utf-8")  # the nav


@pytest.mark.parametrize(
    "case, page, expected",
    [
        ("an id on a guide", "# Probe\n\nImplements CB-6.\n", "index.md: names CB-6; behaviour ids belong"),
        ("an id in a heading", "# Probe (CB-6)\n\nText.\n", "index.md: names CB-6; behaviour ids belong"),
        ("an issue number", "# Probe\n\nAs issue 21 asked.\n", "index.md: names issue 21, which a reader"),
    ],
)
def test_q3_strict_build_fails_on_an_id_outside_the_behaviour_reference(tmp_path, case, page, expected):
    """Q-3: a page other than the Behaviour reference that shows an id (in its text or a
    heading), or a page naming an issue number, fails the strict build, naming what it shows;
    the Behaviour reference itself may show ids."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(page, encoding="utf-8")
    (docs / "behaviour-reference.md").write_text(
        '# Ids\n\n- <a id="cb-6"></a>**CB-6** Half-open admits a few trial calls per round.\n', encoding="utf-8"
    )
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        "nav: [index.md, behaviour-reference.md]\n"
        f"hooks: [{HOOKS / 'requirement_ids.py'}]\n"
        "plugins:\n"
        "  mkdocstrings:\n"
        "    handlers:\n"
        "      python:\n"
        f"        paths: [{ROOT}]\n"
        "        options:\n"
        f"          extensions: [griffe_sphinx, {HOOKS / 'sphinx_roles.py'}]\n",
        encoding="utf-8",
    )
    done = mkdocs(config, tmp_path / "site")
    assert done.returncode != 0, f"{case}: the strict build passed\n{done.stderr}"
    assert expected in done.stderr, done.stderr
    assert "behaviour-reference.md: names" not in done.stderr


def test_offline_build_without_the_script_shows_a_note_instead_of_the_diagram(tmp_path, monkeypatch):
    """Offline docs: when the mermaid script could not be fetched, ./dev docs builds the site
    anyway with BALDUR_DOCS_NO_DIAGRAMS set: the strict build passes and each diagram is replaced
    by a note, never shown as its source."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Probe\n\n```mermaid\nflowchart LR\n  alpha --> beta\n```\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        "nav: [index.md]\n"
        f"hooks: [{HOOKS / 'mermaid_offline.py'}]\n"
        "plugins:\n"
        "  mkdocstrings:\n"
        "    handlers:\n"
        "      python:\n"
        f"        paths: [{ROOT}]\n"
        "        options:\n"
        f"          extensions: [griffe_sphinx, {HOOKS / 'sphinx_roles.py'}]\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("BALDUR_DOCS_NO_DIAGRAMS", "1")
    done = mkdocs(config, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "This diagram is not shown" in html
    assert "alpha --&gt; beta" not in html and "alpha --> beta" not in html


def test_fetch_gives_up_with_a_clear_message_when_npm_hangs(tmp_path, monkeypatch, capsys):
    """Offline docs: the fetch says what it fetches before it starts, and a registry that never
    answers ends in a RuntimeError naming the timeout, not an endless silent wait."""
    fake = tmp_path / "bin"
    fake.mkdir()
    npm = fake / "npm"
    npm.write_text("#!/bin/sh\nexec sleep 600\n")  # a registry that never answers
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setattr(mermaid_offline, "FETCH_TIMEOUT", 1.0)
    with pytest.raises(RuntimeError, match=r"within 1 s"):
        mermaid_offline.fetch(tmp_path / "docs")
    assert "fetching mermaid" in capsys.readouterr().err
