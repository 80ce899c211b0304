"""Breaker names: which strings may name a breaker, and how any name is shown in a line.

A name is any non-empty string of at most :data:`MAX_NAME_LENGTH` characters without
control characters and without whitespace at either end. Control characters are the
Unicode categories Cc (newline, carriage return, tab, NUL, DEL, ...), Cf (invisible
format characters such as zero-width spaces and direction overrides), Zl and Zp (the
line and paragraph separators): each of them can make a name look like another one, or
start a new line in a log. Lone surrogates (what undecodable bytes of an environment
variable become under a C locale) are not refused; they are shown escaped. A space at
either end would make ``"upstream "`` look like ``"upstream"``.

Names already held by a shared store may predate these rules; :func:`show_name` renders
any name so that it stays on one line and odd characters are visible.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from .errors import ConfigError

__all__ = ["MAX_NAME_LENGTH", "name_problem", "check_name", "show_name"]

#: The longest breaker name accepted, in characters.
MAX_NAME_LENGTH = 1000

_REFUSED = frozenset({"Cc", "Cf", "Zl", "Zp"})
_SHOWN = 60  # characters of a refused name quoted in an error message


def name_problem(name: Any) -> str | None:
    """Why *name* cannot name a breaker, in a few words, or None when it can.

    Args:
        name: the candidate (any object).

    Returns:
        str | None: e.g. ``"contains a control character (U+000A at position 8)"``.
    """
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "must not be empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long, at most {MAX_NAME_LENGTH} are allowed"
    if not name.isprintable():
        for index, char in enumerate(name):
            if unicodedata.category(char) in _REFUSED:
                return f"contains a control character (U+{ord(char):04X} at position {index})"
    if name != name.strip():
        return "starts or ends with whitespace, so it would look like another name"
    return None


def check_name(name: Any, what: str = "breaker name") -> str:
    """Return *name* when it can name a breaker; raise otherwise.

    Args:
        name: the candidate.
        what: how messages call it (``"breaker name"``, ``"service"``, a setting's name).

    Returns:
        str: *name*, unchanged.

    Raises:
        ConfigError: *name* is not a string, empty, longer than :data:`MAX_NAME_LENGTH`
            characters, contains a control character, or starts or ends with whitespace;
            the message says which (and quotes at most the first 60 characters).
    """
    # the common case in one expression: a printable str of an allowed length that
    # strip() leaves unchanged (it then returns the very same object); anything else is
    # judged in full by name_problem(), which also accepts what this test cannot
    if type(name) is str and 0 < len(name) <= MAX_NAME_LENGTH and name.isprintable() and name.strip() is name:
        return name
    problem = name_problem(name)
    if problem is not None:
        raise ConfigError(f"{what} {show_name(name, limit=_SHOWN)}: {problem}")
    return name  # type: ignore[no-any-return]  # name_problem() found a str


def show_name(name: Any, limit: int | None = None) -> str:
    """*name* as it can be put into one line of text (a log line, a table, a chat message).

    A plain name is returned as it is; any other (control or invisible characters,
    whitespace at an end, an empty string, not a string) is shown as its Python ``repr``,
    quoted and with every such character escaped (``'upstream\\n'``), so that no name can
    start another line or pass for a different one. None reads ``None``.

    Args:
        name: the name (any object).
        limit: show at most this many characters of the name, then ``...`` and its length;
            None shows it whole.

    Returns:
        str: the text to show.
    """
    if name is None:
        return "None"
    if not isinstance(name, str):
        return repr(name)
    if limit is not None and len(name) > limit:
        return f"{name[:limit]!r}... ({len(name)} characters)"
    if name and name.isprintable() and name == name.strip():
        return name
    return repr(name)
