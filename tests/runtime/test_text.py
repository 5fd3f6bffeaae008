"""One line of terminal-safe text (runtime/text.py), and that it is the only such helper."""

from __future__ import annotations

import ast

import paths
import pytest

from a2a_tune.tuner.runtime.text import LIMIT, one_line


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


@pytest.mark.parametrize(
    "value, expected",
    [
        (ValueError("bad\n  value\tthere"), "ValueError: bad value there"),  # the whole message, folded
        (KeyError(), "KeyError"),  # no message: the type alone
        (OSError("   "), "OSError"),
        (Unprintable(), "Unprintable: <Unprintable that cannot be shown>"),
        ("  a\r\n b  ", "a b"),
        ("evil\x1b[31mred\x07", "evil\\x1b[31mred\\x07"),  # ESC, BEL: escaped, not sent
        ("abc\u202edef", "abc\\u202edef"),  # a bidirectional override
        ("\x85next\u2028line", "next line"),  # Unicode line breaks are whitespace
        ("naïve 名前 µs", "naïve 名前 µs"),  # printable non-ASCII stays
        (12, "12"),
        (None, "None"),
    ],
)
def test_one_line_folds_escapes_and_names_the_type(value, expected):
    assert one_line(value) == expected


def test_one_line_bounds_the_length_with_an_ellipsis():
    assert one_line("x" * 10_000) == "x" * (LIMIT - 1) + "…"
    assert len(one_line("y" * 50, 10)) == 10 and one_line("y" * 50, 10).endswith("…")
    assert one_line("short", 10) == "short"
    assert one_line("z" * 5000, None) == "z" * 5000  # no bound: names are never cut
    # The bound counts what is shown: escapes included, so the line stays bounded.
    assert len(one_line("\x1b" * 1000, 100)) == 100


def test_a_huge_integer_is_one_bounded_line_not_an_error():
    text = one_line(10**5000)  # beyond Python's int -> str digit limit
    assert "\n" not in text and len(text) <= LIMIT


def _folds_text(node: ast.AST) -> bool:
    """`" ".join(<x>.split())`: folding whitespace into one line by hand."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and isinstance(node.func.value, ast.Constant)
        and node.func.value.value == " "
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Call)
        and isinstance(node.args[0].func, ast.Attribute)
        and node.args[0].func.attr == "split"
        and not node.args[0].args
    )


def _escapes_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "isprintable"


def test_no_other_module_makes_its_own_one_line_text():
    """Every error or untrusted string shown in one line goes through text.one_line: no module
    in tuner/, kernels/ or db/ folds whitespace or escapes characters by hand."""
    own = paths.REPO / "tuner" / "runtime" / "text.py"
    found = []
    for folder in ("tuner", "kernels", "db"):
        for path in sorted((paths.REPO / folder).rglob("*.py")):
            if path == own or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if _folds_text(node) or _escapes_text(node):
                    found.append(f"{path.relative_to(paths.REPO)}:{node.lineno}")
    assert found == []
