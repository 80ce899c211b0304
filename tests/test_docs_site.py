"""The documentation site (mkdocs.yml): the strict build passes, and it is strict enough to
catch a broken link, a reference to a missing module and a malformed docstring (Q-3).

Each build runs ``mkdocs build --strict`` in a subprocess into a temporary directory, as
``./dev docs`` does into ``site/``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
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
