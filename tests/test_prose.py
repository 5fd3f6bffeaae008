"""Prose where it lasts (docs/architecture.md, "Module notes"): a module's docstring says what the
module is for and what it guarantees in at most 25 lines, and formatting is left to the formatter
but for a few ``# fmt: skip`` markers, each with its reason."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("a2a_tune", "tuner", "kernels", "db", "bench", "scripts", "tests")
MAX_DOCSTRING_LINES = 25
MAX_FMT_SKIPS = 10
# a marker and, after it, its reason: ``# fmt: skip  # one figure per row ...``
FMT_SKIP = re.compile(r"#\s*fmt:\s*skip\b(?P<rest>.*)$")


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def docstring_lines(source: str) -> int:
    """How many lines the module docstring of `source` spans (0: none)."""
    body = ast.parse(source).body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def fmt_skips(source: str) -> list[tuple[int, str]]:
    """(line, reason) of every ``# fmt: skip`` comment in `source` ("" where none is given)."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        m = FMT_SKIP.match(tok.string) if tok.type == tokenize.COMMENT else None
        if m:
            found.append((tok.start[0], m.group("rest").strip().lstrip("#").strip()))
    return found


def test_module_docstrings_are_at_most_25_lines():
    files = sources()
    assert len(files) > 100
    long = [f"{p.relative_to(ROOT)}: {n}" for p in files if (n := docstring_lines(p.read_text())) > MAX_DOCSTRING_LINES]
    assert long == [], (
        f"module docstrings over {MAX_DOCSTRING_LINES} lines (design notes: docs/architecture.md): {long}"
    )


def test_few_fmt_skip_markers_each_with_its_reason():
    markers = [(p.relative_to(ROOT), n, why) for p in sources() for n, why in fmt_skips(p.read_text())]
    assert len(markers) <= MAX_FMT_SKIPS, f"{len(markers)} `# fmt: skip` markers: {markers}"
    unexplained = [f"{p}:{n}" for p, n, why in markers if not why]
    assert unexplained == [], f"`# fmt: skip` without its reason (`# fmt: skip  # why`): {unexplained}"


def test_the_checks_find_what_they_look_for():
    long = '"""One.\n' + "\n" * 24 + '"""\nx = 1\n'
    assert docstring_lines(long) == 26 and docstring_lines("x = 1\n") == 0
    assert docstring_lines('"""Short."""\n') == 1
    planted = "a = (1,  2)  # fmt: skip\nb = (1,  2)  # fmt: skip  # a table\nc = 1  # fmt:skip # why\n"
    assert fmt_skips(planted) == [(1, ""), (2, "a table"), (3, "why")]
