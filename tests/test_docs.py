"""The documents say what works: README.md stays a short guide, no line of README.md or docs/ runs
over 200 characters, every `a2a-tune` command they show names a command and options that exist,
and the README's Python example runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import typer

from a2a_tune.tuner.cli import app
from tests.support.paths import REPO as ROOT

DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = [p for p in DOCS if p.exists()]
# `a2a-tune CMD ...` or `python -m a2a_tune.tuner.cli CMD ...` inside a code block or `code span`
INVOCATION = re.compile(r"(?:\ba2a-tune|-m a2a_tune\.tuner\.cli)\s+([^`|)#]*)")


def _code_lines(text: str) -> list[str]:
    """Lines of fenced code blocks, and the inline `code spans` of the other lines."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            if not line.lstrip().startswith("#"):  # a shell comment
                lines.append(line.split(" #")[0])
        else:
            lines.extend(re.findall(r"`([^`]+)`", line))
    joined, out = "", []
    for line in lines:  # shell continuations
        joined += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            out.append(joined)
            joined = ""
    return out


def _invocations(text: str) -> list[list[str]]:
    found = []
    for line in _code_lines(text):
        for match in INVOCATION.finditer(line):
            words = match.group(1).split()
            if words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
                found.append(words)
    return found


def _options(command) -> set[str]:
    names = set()
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names | {"--help"}


def test_readme_is_a_short_guide() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the reference belongs under docs/"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_line_runs_over_200_characters(path) -> None:
    long = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 200]
    assert not long, f"{path.name}: lines {long} run over 200 characters"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_shown_exists_with_its_options(path) -> None:
    root = typer.main.get_command(app)
    shown = _invocations(path.read_text())
    problems = []
    for words in shown:
        command, rest = root, words
        while hasattr(command, "commands") and rest and rest[0] in command.commands:
            command, rest = command.commands[rest[0]], rest[1:]
        if command is root:
            if rest[0].startswith("-") or rest[0] in {"COMMAND"}:
                continue
            problems.append(f"`a2a-tune {' '.join(words)}`: no command {rest[0]!r}")
            continue
        known = _options(command)
        for word in rest:
            option = word.split("=")[0].strip("'\"[](),;")
            if option.startswith("--") and option not in known and not option.endswith("..."):
                problems.append(f"`a2a-tune {' '.join(words)}`: {command.name} has no option {option}")
    assert not problems, "\n".join(problems)


def test_the_commands_are_found() -> None:
    """The scanner itself: the README's own commands are seen, and a made-up option is caught."""
    readme = _invocations((ROOT / "README.md").read_text())
    assert ["run"] in readme and any(w[:1] == ["lookup"] for w in readme)
    root = typer.main.get_command(app)
    assert "--no-such-option" not in _options(root.commands["lookup"])


def test_the_readme_python_example_runs(tmp_path) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README shows the Python lookup"
    env = {**os.environ, "A2A_TUNE_PROFILE_DIR": str(tmp_path), "A2A_TUNE_FINGERPRINT": "none.node1"}
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "allgather_reducescatter" in done.stdout  # no table here: the documented fallback


def test_benchmarks_speak_of_results_not_of_the_work_log() -> None:
    """Issue and device-call references belong to the archive (docs/benchmarks-archive.md)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    found = re.findall(r"\b(?:issue|call) \d+", text, re.I)
    assert not found, f"BENCHMARKS.md refers to the work log: {found}"
    assert text.index("## Headline") < text.index("## Method")
