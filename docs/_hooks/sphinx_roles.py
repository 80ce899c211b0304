"""MkDocs hook: show the package's Sphinx-style roles as plain code.

The docstrings name other objects the Sphinx way (``:class:`~baldur_django.core.breaker.CircuitBreaker```,
``:func:`protected```). mkdocstrings renders docstrings as Markdown, which would print the
role literally (``:class:CircuitBreaker``); this hook drops the role and, as Sphinx does
for a leading ``~``, keeps only the last dotted part of the name.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|const):<code>(~?)([^<]+)</code>")


def _plain(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace every rendered ``:role:`name``` by ``name`` in code font."""
    return ROLE.sub(_plain, html)
