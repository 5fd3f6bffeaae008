"""Hostile values of environment variables (issue 31.6): every variable a2a-tune reads is tried
with each. A1 MB value is fine in-process (os.environ); a child process gets at most 128 KiB per
variable from the kernel (MAX_ARG_STRLEN), so subprocess tests take `for_child`. NUL cannot be
in the environment; bytes that are not UTF-8 arrive as surrogate escapes."""

from __future__ import annotations

import os

HOSTILE = {
    "empty": "",
    "blank": " \t ",
    "1MB": "x" * 1_000_000,
    "newline": "a\nb",
    "ansi": "\x1b[31mred\x1b[0m\x07",
    "non-utf8": os.fsdecode(b"\xff\xfe"),
    "unknown-word": "bogus",
    "fifo": None,  # a named pipe (the `fifo` fixture)
    "dev-zero": "/dev/zero",
    "directory": None,  # a directory (tmp_path)
}
BLANK = ("empty", "blank")


def hostile(kind: str, fifo, directory) -> str:
    """The value `kind` names, the FIFO and directory ones from the test's fixtures."""
    return {"fifo": str(fifo), "directory": str(directory)}.get(kind, HOSTILE[kind])


def for_child(value: str) -> str:
    """`value` cut to what a child process can be given (128 KiB per variable)."""
    return value[:100_000]
