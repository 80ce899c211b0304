"""Griffe extension: read the package's Sphinx-style roles as Markdown code.

The docstrings name other objects the Sphinx way (``:class:`~baldur_django.core.breaker.CircuitBreaker```,
``:func:`protected```). mkdocstrings parses docstrings as Google style and renders them as
Markdown, where a role would print literally and its colon would even split a ``Returns:``
line into a bogus name and description. Before any of that, this extension rewrites each
role as a code span and, as Sphinx does for a leading ``~``, keeps only the last dotted
part of the name.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """*text* with every Sphinx role replaced by a Markdown code span."""

    def code(match: re.Match[str]) -> str:
        tilde, name = match.groups()
        return f"`{name.rsplit('.', 1)[-1] if tilde else name}`"

    return ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring once the package is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
