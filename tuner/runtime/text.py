"""One line of terminal-safe text: how every error and every untrusted string is shown.

:func:`one_line` is the one helper for "say it in one line": an exception becomes
``Type: message``, anything else its ``str()``; runs of whitespace (newlines included) become
one space, every other character that is not printable (ESC, BEL, C1 controls, bidirectional
overrides...) is shown as its escape (``\\x1b``), and text longer than ``limit`` is cut with
"…". Error messages, names read from a table or a store, paths and values from the
environment all go through it before they reach a terminal, a log line or a failure record.
Standard library only (the engines' start-up path imports it; so may ``db`` and ``kernels``).
"""

from __future__ import annotations

__all__ = ["LIMIT", "VALUE_LIMIT", "one_line", "quoted"]

#: Default bound on the characters of one line (a path or two and a reason fit).
LIMIT = 1000
#: Bound on a value a user gave, echoed in a message about it (a 100,000-character --preset).
VALUE_LIMIT = 80


def one_line(value, limit: int | None = LIMIT) -> str:
    """``value`` as one line of printable text of at most ``limit`` characters (None: no bound).

    An exception is ``Type: message`` (its whole message, folded), or ``Type`` alone when
    the message is empty. Never raises: a value whose ``str()`` fails is named by its type.
    """
    try:
        text = str(value)
    except Exception:  # a broken __str__, or an int beyond Python's digit limit
        text = f"<{type(value).__name__} that cannot be shown>"
    if isinstance(value, BaseException):
        text = f"{type(value).__name__}: {text}" if text.strip() else type(value).__name__
    s = " ".join(text.split())
    if not s.isprintable():
        s = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in s)
    if limit is not None and len(s) > limit:
        s = s[: max(limit - 1, 0)] + "…"
    return s


def quoted(value, limit: int = VALUE_LIMIT) -> str:
    """``repr(value)`` as one bounded line: how a message echoes what a user typed."""
    try:
        text = repr(value)
    except Exception:  # a huge int (beyond Python's digit limit) or a broken __repr__
        text = f"<{type(value).__name__}>"
    return one_line(text, limit)
