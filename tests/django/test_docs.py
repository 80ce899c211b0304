"""The core docs stay true to the code: every knob documented with its real default (CFG-1), no
unknown BALDUR_ names, working links and examples."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import baldur_django
from baldur_django import signals
from baldur_django.checks import KNOB_IDS, Codes
from baldur_django.core.knobs import KNOBS
from baldur_django.core.states import CircuitState, Trigger

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OWN_DOCS = ["index.md", "quickstart.md", "states-and-triggers.md", "settings.md"]

ROW = re.compile(r"^\|\s*`(BALDUR_[A-Z0-9_]+)`\s*\|\s*`([^`]*)`\s*\|(.*)\|\s*$")
NAME = re.compile(r"BALDUR_[A-Z0-9_]*\*?")


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def documented_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in read("settings.md").splitlines():
        match = ROW.match(line)
        if match:
            rows.append((match.group(1), match.group(2), match.group(3)))
    return rows


def parse_default(text: str):
    """Read a default as written in docs/settings.md."""
    if text == "unset":
        return None
    if text.startswith("<system temp dir>/"):
        return os.path.join(tempfile.gettempdir(), text.split("/", 1)[1])
    return ast.literal_eval(text)


def same_default(documented, actual) -> bool:
    if isinstance(actual, (set, frozenset)):
        return (
            isinstance(documented, list)
            and sorted(documented) == sorted(actual)
            and len(set(documented)) == len(documented)
        )
    return type(documented) is type(actual) and documented == actual


def test_cfg1_settings_md_documents_every_knob_exactly_once():
    """CFG-1: docs/settings.md has one table row per knob in KNOBS, and nothing else in that shape."""
    names = [name for name, _, _ in documented_rows()]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"documented twice: {duplicates}"
    missing = sorted(set(KNOBS) - set(names))
    unknown = sorted(set(names) - set(KNOBS))
    assert not missing, f"knobs missing from docs/settings.md: {missing}"
    assert not unknown, f"rows for settings that do not exist: {unknown}"


@pytest.mark.parametrize("name, default_text, rest", documented_rows(), ids=[row[0] for row in documented_rows()])
def test_cfg1_settings_md_shows_the_actual_default(name, default_text, rest):
    """CFG-1: each documented default equals the default in the KNOBS table (type included: 5 is not 5.0)."""
    documented = parse_default(default_text)
    actual = KNOBS[name].default
    assert same_default(documented, actual), f"{name}: docs say {default_text!r}, KNOBS has {actual!r}"
    cells = [c.strip() for c in rest.split("|")]
    assert len(cells) == 2 and all(cells), f"{name}: the row needs an 'accepts' and a 'meaning' cell"


def test_cfg1_default_parser_rejects_wrong_defaults():
    """CFG-1: the comparison above is strict enough to catch a wrong or mistyped default."""
    assert not same_default(parse_default("5.0"), 5)
    assert not same_default(parse_default("[500, 502]"), frozenset({500, 502, 503, 504}))
    assert not same_default(parse_default('"WARNING"'), "INFO")
    assert not same_default(parse_default("0"), False)
    assert same_default(parse_default("unset"), None)


@pytest.mark.parametrize("doc", OWN_DOCS)
def test_cfg1_docs_name_no_unknown_setting(doc):
    """CFG-1: every BALDUR_ name in the docs is a real knob (a trailing * must prefix at least one knob)."""
    bad = []
    for found in set(NAME.findall(read(doc))):
        if found.endswith("*"):
            if not any(k.startswith(found[:-1]) for k in KNOBS):
                bad.append(found)
        elif found not in KNOBS:
            bad.append(found)
    assert not bad, f"{doc} names unknown settings: {sorted(bad)}"


def test_cfg3_settings_md_check_ids_exist():
    """CFG-3: the check ids named in docs/settings.md are ids the checks really emit, and all are named."""
    text = read("settings.md")
    named = set(re.findall(r"baldur\.[EW]\d{3}", text))
    from baldur_django.stage_checks import StageCodes

    real = set(KNOB_IDS.values()) | {v for k, v in [*vars(Codes).items(), *vars(StageCodes).items()] if k.isupper()}
    assert named <= real, sorted(named - real)
    for code in ("E002", "E003", "E004", "E006", "E090", "W002", "W003", "W004", "W005"):
        assert f"baldur.{code}" in text
    assert f"`{min(KNOB_IDS.values())}` to `{max(KNOB_IDS.values())}`" in text


@pytest.mark.parametrize("doc", OWN_DOCS)
def test_docs_relative_links_resolve(doc):
    """Docs: every relative link in the core docs points at a file that exists."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(doc))
    broken = [link for link in links if "://" not in link and not (DOCS / link).exists()]
    assert not broken, f"{doc}: broken links {broken}"


def python_blocks(doc: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", read(doc), flags=re.S)


@pytest.mark.parametrize("doc", OWN_DOCS)
def test_docs_python_examples_are_valid_python(doc):
    """Docs: every ```python block parses (top-level await allowed for the async examples)."""
    for block in python_blocks(doc):
        compile(block, doc, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_docs_index_api_names_exist():
    """Section 0: every `baldur.X` named in index.md is exported by the package."""
    names = set(re.findall(r"\bbaldur\.([A-Za-z_]+)", read("index.md")))
    assert names, "index.md should show the public API"
    missing = sorted(n for n in names if not hasattr(baldur_django, n))
    assert not missing, missing


def test_docs_quickstart_names_real_signals_and_states_doc_names_every_trigger():
    """CB-14/CB-13: the quickstart's signal names exist; states-and-triggers.md lists every state and trigger."""
    quick = read("quickstart.md")
    for name in signals.__all__:
        if name != "bridge":
            assert f"`{name}`" in quick, name
            assert hasattr(signals, name)
    states = read("states-and-triggers.md")
    for state in CircuitState:
        assert f"`CircuitState.{state.name}`" in states and f'`"{state.value}"`' in states
    for trigger in (v for k, v in vars(Trigger).items() if k.isupper()):
        assert f"| `{trigger}` |" in states, trigger


def test_cfg1_quickstart_plain_python_example_runs_with_its_environment():
    """CFG-1: the quickstart's plain-Python example runs without Django, configured by its own env exports."""
    quick = read("quickstart.md")
    bash = next(b for b in re.findall(r"```bash\n(.*?)```", quick, flags=re.S) if "export BALDUR_" in b)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE" and k not in KNOBS}
    exported = {}
    for line in bash.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            key, _, value = words[1].partition("=")
            exported[key] = value
    assert set(exported) <= set(KNOBS) and len(exported) >= 3
    env.update(exported, PYTHONPATH=str(ROOT))
    script = next(b for b in python_blocks("quickstart.md") if b.startswith("# worker.py"))
    script += (
        "\nimport sys\nfrom baldur_django.core.config import settings\n"
        f"assert all(settings.source(n) == 'env' for n in {sorted(exported)!r})\n"
        "assert baldur.get_breaker('payments').config.failure_threshold == 2\n"
        "assert 'django' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "'service': 'payments'" in done.stdout


def test_cfg1_settings_md_lists_every_per_call_key_with_its_setting():
    """CFG-1: the table of per-call / BALDUR_SERVICES keys in docs/settings.md is the one derived
    from the knob rows (CB-15..CB-17 keys included)."""
    from baldur_django.core.knobs import OVERRIDE_KEYS

    pairs = dict(re.findall(r"^\|\s*`([a-z_]+)`\s*\|\s*`(BALDUR_[A-Z_]+)`\s*\|\s*$", read("settings.md"), flags=re.M))
    assert pairs == OVERRIDE_KEYS


def test_cfg3_settings_md_reserved_section_lists_exactly_the_reserved_knobs():
    """CFG-3: the "Reserved" section of docs/settings.md names exactly the knobs marked reserved
    (whose setting draws warning baldur.W006), and no reserved knob is documented elsewhere."""
    from baldur_django.core.knobs import RESERVED

    text = read("settings.md")
    reserved_part = text[text.index("## Reserved") :]
    rows = [line for line in reserved_part.splitlines() if ROW.match(line)]
    assert sorted(ROW.match(line).group(1) for line in rows) == sorted(RESERVED)
    assert "baldur.W006" in reserved_part


# --- install lines: what the README and the quickstart tell a new user to install

INSTALL_PAGES = {"README.md": ROOT / "README.md", "quickstart.md": DOCS / "quickstart.md"}
PIP = re.compile(r"pip install (-e )?(['\"])(.+?)\2")


def pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def install_lines(text: str) -> list[tuple[bool, str]]:
    """``(editable, requirement)`` of each ``pip install "..."`` the page shows."""
    return [(bool(editable), requirement) for editable, _, requirement in PIP.findall(text)]


def named_extras(text: str) -> set[str]:
    """The extras the page's install lines name."""
    from packaging.requirements import Requirement

    extras: set[str] = set()
    for editable, line in install_lines(text):
        extras |= Requirement(("baldur-django" + line[1:]) if editable else line).extras
    return extras


def imported_roots(text: str) -> set[str]:
    """The top-level modules the page's ```python blocks import."""
    roots = set()
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("page", sorted(INSTALL_PAGES))
def test_install_lines_give_the_checkout_and_git_forms_with_real_extras(page):
    """Install: the page gives a line that works today from a clone (``pip install -e
    ".[...]"``) and the direct git form (``baldur-django[...] @ git+https://...``, with an
    address that reads as a placeholder), says the PyPI form is not published yet, and
    names only extras pyproject.toml defines, for the project pyproject.toml names."""
    from packaging.requirements import Requirement

    text = INSTALL_PAGES[page].read_text(encoding="utf-8")
    project = pyproject()["project"]
    lines = install_lines(text)
    editable = [line for is_editable, line in lines if is_editable]
    assert any(line.startswith(".[") for line in editable), lines
    direct = [Requirement(line) for is_editable, line in lines if not is_editable and " @ " in line]
    assert direct, lines
    for requirement in direct:
        assert requirement.name == project["name"]
        assert requirement.url.startswith("git+https://") and "example." in requirement.url
    assert "not on PyPI yet" in text
    defined = set(project["optional-dependencies"])
    assert named_extras(text) and named_extras(text) <= defined, named_extras(text) - defined


@pytest.mark.parametrize("page", sorted(INSTALL_PAGES))
def test_install_examples_import_only_what_the_named_extras_install(page):
    """Install: every module the page's Python examples import is the standard library,
    baldur_django itself, or installed by an extra the page's install lines name (found
    through the installed distributions' top-level packages)."""
    from importlib.metadata import packages_distributions

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = INSTALL_PAGES[page].read_text(encoding="utf-8")
    extras = pyproject()["project"]["optional-dependencies"]
    installed_by = {canonicalize_name(Requirement(spec).name) for extra in named_extras(text) for spec in extras[extra]}
    distributions = packages_distributions()
    roots = imported_roots(text)
    assert roots, "the page has no import to check"
    outside = sorted(
        root
        for root in roots - set(sys.stdlib_module_names) - {"baldur_django"}
        if not {canonicalize_name(d) for d in distributions.get(root, [])} & installed_by
    )
    assert not outside, f"{page} imports {outside} but its install lines name only {sorted(named_extras(text))}"
