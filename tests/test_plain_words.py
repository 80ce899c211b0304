"""Plain words for the user: requirement ids (``CB-12``, ``ST-4``, ...) belong to the tests
and the docs' Behaviour reference page, never to the package's code, its ``help()`` or the
other docs pages; nothing points at a document the repository does not have ("issue 21",
"design habit 6", "section 0" of a requirements document); the 1,440-minute lifetime limit
is one named constant.

These read files and docstrings only: no site build (``tests/test_docs_site.py`` checks the
built site)."""

from __future__ import annotations

import ast
import importlib
import pydoc
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "baldur_django"
DOCS = ROOT / "docs"
#: The one page that maps ids to behaviour.
REFERENCE = DOCS / "behaviour-reference.md"

#: A requirement id as the tests write them.
ID = re.compile(r"\b(?:CFG|CB|FAC|RL|IN|OP|ST|EM|HC|RS|OT|Q)-\d+\b")
#: References only an insider can resolve.
REFERENCE_TO_ELSEWHERE = re.compile(
    r"\bissues?\s+#?\d+|\bdesign habits?\b|\bDESIGN\.md\b|\bREQUIREMENTS(?:\.md)?\b|\bsection (?:0|10)\b",
    re.IGNORECASE,
)
#: The package's text files a reader may open: code, Lua scripts, templates.
TEXT_SUFFIXES = {".py", ".lua", ".html", ".txt", ".md"}


def offenders(paths: list[Path], pattern: re.Pattern[str]) -> list[str]:
    """``path:line: text`` of every line of *paths* that *pattern* matches."""
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def package_files() -> list[Path]:
    files = sorted(
        p for p in PACKAGE.rglob("*") if p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts and p.is_file()
    )
    assert len(files) > 50
    return files


def docs_pages() -> list[Path]:
    """Every Markdown page of the site but the Behaviour reference, and the README."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts and "_vendor" not in p.parts)
    assert REFERENCE in pages and len(pages) > 10
    return [p for p in pages if p != REFERENCE] + [ROOT / "README.md"]


def test_package_code_names_no_requirement_id():
    """Comments, docstrings, messages, Lua scripts and templates say what a rule means, not its id."""
    assert not offenders(package_files(), ID), "\n".join(offenders(package_files(), ID))


def test_package_code_points_at_no_document_the_repository_lacks():
    """No "issue N", "design habit N", DESIGN.md, REQUIREMENTS or "section 0" in the package."""
    found = offenders(package_files(), REFERENCE_TO_ELSEWHERE)
    assert not found, "\n".join(found)


def test_docs_pages_name_no_requirement_id_outside_the_behaviour_reference():
    """The guides, the settings page, the changelog and the README explain behaviour in words;
    only the Behaviour reference maps ids to it."""
    found = offenders(docs_pages(), ID)
    assert not found, "\n".join(found)


def test_docs_pages_point_at_no_issue_or_insider_document():
    """No page of the site (the Behaviour reference included) nor the README names an issue
    number or a document the repository does not have."""
    found = offenders([*docs_pages(), REFERENCE], REFERENCE_TO_ELSEWHERE)
    assert not found, "\n".join(found)


def test_the_scans_catch_what_they_look_for(tmp_path):
    """The patterns above find the forms the package used to carry."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""Implements CB-1..CB-4."""\nx = 1  # EM-7\n# (issue 21)\n# design habit 6\n"""ST-2/CB-6: a round"""\n',
        encoding="utf-8",
    )
    assert len([line for line in probe.read_text().splitlines() if ID.search(line)]) == 3
    assert len([line for line in probe.read_text().splitlines() if REFERENCE_TO_ELSEWHERE.search(line)]) == 2


def public_modules() -> list[str]:
    """The modules the API reference documents (its ``::: module`` lines)."""
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    modules = re.findall(r"^::: ([\w.]+)$", page, flags=re.M)
    assert "baldur_django" in modules and len(modules) > 8
    return modules


def help_text(obj: object) -> str:
    """What ``help(obj)`` prints."""
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


def test_help_of_every_public_name_shows_no_requirement_id_or_insider_reference():
    """``help()`` of each name in ``baldur_django.__all__`` (classes with all their methods)
    shows no id and no reference to a document outside the repository."""
    import baldur_django

    bad = {}
    for name in baldur_django.__all__:
        obj = getattr(baldur_django, name)
        if isinstance(obj, str):  # __version__
            continue
        text = help_text(obj)
        found = sorted(
            {m.group(0) for m in ID.finditer(text)} | {m.group(0) for m in REFERENCE_TO_ELSEWHERE.finditer(text)}
        )
        if found:
            bad[name] = found
    assert not bad


@pytest.mark.parametrize("module", public_modules())
def test_help_of_every_public_module_shows_no_requirement_id_or_insider_reference(module):
    """``help()`` of each module the API reference documents, and the docstring of every
    public class and function in it and of every public method of those classes, shows no
    id and no reference to a document outside the repository."""
    mod = importlib.import_module(module)
    texts = {module: help_text(mod)}
    for name, obj in vars(mod).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        texts[f"{module}.{name}"] = obj.__doc__ or ""
        if isinstance(obj, type):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") or attr == "__init__":
                    texts[f"{module}.{name}.{attr}"] = getattr(member, "__doc__", None) or ""
    bad = {
        where: sorted(
            {m.group(0) for m in ID.finditer(text)} | {m.group(0) for m in REFERENCE_TO_ELSEWHERE.finditer(text)}
        )
        for where, text in texts.items()
    }
    assert not {where: found for where, found in bad.items() if found}


LIMIT = 1440


def literals_of_the_limit(path: Path) -> list[int]:
    """The lines where *path*'s code (not its docstrings or comments) writes the 1,440-minute limit:
    as a number, or inside a string that is not a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        value = node.value
        if (isinstance(value, (int, float)) and not isinstance(value, bool) and value == LIMIT) or (
            isinstance(value, str) and re.search(r"\b1[,_]?440\b", value)
        ):
            found.append(node.lineno)
    return found


def test_the_lifetime_limit_is_one_named_constant():
    """The 1,440-minute limit of a force's and an Emergency Mode level's lifetime is written
    once, as ``core.knobs.MAX_LIFETIME_MINUTES``; every check and message uses the name."""
    from baldur_django.core.knobs import MAX_LIFETIME_MINUTES

    assert MAX_LIFETIME_MINUTES == LIMIT
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in literals_of_the_limit(path)
    ]
    assert len(found) == 1 and found[0].startswith("baldur_django/core/knob_parsers.py:"), found


def test_the_limit_scan_finds_a_literal(tmp_path):
    """The scan above sees a number and a message, not a docstring."""
    probe = tmp_path / "probe.py"
    probe.write_text('"""At most 1440 minutes."""\nX = 1440\nY = f"at most 1440 minutes: {X}"\n', encoding="utf-8")
    assert literals_of_the_limit(probe) == [2, 3]
