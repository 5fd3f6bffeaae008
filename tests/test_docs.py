"""The documents say what works: README.md stays a short guide, no line of README.md or docs/ runs
over 200 characters, every `a2a-tune` command they show names a command and options that exist,
and the README's Python example runs."""

from __future__ import annotations

import json
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


def test_the_readme_python_example_prints_the_engines_literal_from_a_table_it_answers_from(tmp_path) -> None:
    """Issue 37: the example printed `choice.backend` (a2a-tune's name, not a value vLLM takes)
    for an EP size the shipped table does not hold (a fallback). It prints the literal vLLM
    takes, found exactly in the table it names."""
    from a2a_tune.tuner.runtime.lookup import lookup

    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README shows the Python lookup"
    env = {**os.environ, "A2A_TUNE_PROFILE_DIR": str(tmp_path), "A2A_TUNE_FINGERPRINT": "none.node1"}
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        literal, reason = done.stdout.splitlines()[:2]
        shipped = ROOT / "profiles" / "h200.nvl18x2.node1.json"
        ask = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, phase="decode", max_tokens=256, engine="vllm")
        choice = lookup(**ask, profile=shipped)
        assert choice.match == "exact" and reason == choice.reason and "fallback" not in reason
        assert literal == choice.engines["vllm"] and literal, done.stdout


# ------------------------------------------------------------- JSON keys as the commands print them

COMMANDS_MD = ROOT / "docs" / "commands.md"
SMALL = ["--device", "cpu", "--preset", "mixtral-8x7b", "--backend", "allgather_reducescatter"]
H200 = ROOT / "profiles" / "h200.nvl18x2.node1.json"


def _json_commands(tmp_path) -> dict:
    """Each documented `--json` command, as the test runs it (small, on CPU ranks)."""
    once = [*SMALL, "--tokens", "1", "--warmup", "0", "--iters", "1", "--no-progress"]
    return {
        "sweep --json": ["sweep", *once, "--db", str(tmp_path / "s.db")],
        "run --json": ["run", *once, "--db", str(tmp_path / "r.db"), "--out", str(tmp_path / "tables")],
        "run --dry-run --json": ["run", "--device", "cpu", "--dry-run", "--db", str(tmp_path / "d.db")],
        "evaluate --json": ["evaluate", "--profile", str(H200), "--table-points"],
        "check --json": ["check", *SMALL, "--token-scale", "0.01", "--no-progress"],
        "backends --json": ["backends", "--device", "cpu"],
        "presets --json": ["presets"],
    }


def _key_rows(path) -> dict:
    """The list items "- `CMD --json`: `key`, ...; each of `list`: `key`, ..." (continued on
    indented lines): command -> (its keys, {list: keys of each item})."""
    rows, current = {}, None
    for line in path.read_text().splitlines() + [""]:
        if current is not None and line.startswith("  "):
            current += " " + line.strip()
            continue
        if current is not None:
            name, rest = current.split(":", 1)
            parts = rest.split("; each of ")
            items = {}
            for part in parts[1:]:
                listed, keys = part.split(":", 1)
                items[listed.strip("` ")] = set(re.findall(r"`([^`]+)`", keys))
            rows[name.strip("-` ")] = (set(re.findall(r"`([^`]+)`", parts[0])), items)
            current = None
        if re.match(r"- `[a-z -]+--json`: ", line):
            current = line
    return rows


def test_every_json_key_list_the_docs_show_is_what_the_command_prints(tmp_path) -> None:
    """Issue 37: the README listed `backends --json` keys the command does not print, and the
    tests only checked that commands exist. Every key list of docs/commands.md is compared with
    the keys the command prints (the README links there and lists none of its own)."""
    rows = _key_rows(COMMANDS_MD)
    commands = _json_commands(tmp_path)
    assert set(rows) == set(commands), "a documented --json command this test does not run, or the reverse"
    assert not re.search(r"\|\s*`[a-z -]+--json`", (ROOT / "README.md").read_text()), (
        "key lists live in docs/commands.md"
    )
    problems = []
    for name, (keys, items) in rows.items():
        done = subprocess.run(
            [sys.executable, "-m", "a2a_tune.tuner.cli", *commands[name], "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "80"},
            cwd=tmp_path,
        )
        assert done.returncode == 0, f"{name}: {done.stderr}"
        data = json.loads(done.stdout)
        if set(data) != keys:
            problems.append(f"{name}: documented {sorted(keys)}, printed {sorted(data)}")
        for listed, item_keys in items.items():
            printed = set().union(*(set(x) for x in data[listed])) if data.get(listed) else set()
            if printed != item_keys:
                problems.append(f"{name} {listed}: documented {sorted(item_keys)}, printed {sorted(printed)}")
    assert not problems, "\n".join(problems)


def test_the_readme_names_exactly_the_commands_that_take_json() -> None:
    """Issue 37: "`--json` prints any command's result", but lookup, plot and report refuse it."""
    root = typer.main.get_command(app)
    takes = {name for name, c in root.commands.items() if not hasattr(c, "commands") and "--json" in _options(c)}
    text = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"`--json` prints the result as one JSON document on (.*?) \(", text)
    assert said, "the README says which commands take --json"
    named = set(re.findall(r"`([a-z-]+)`", said.group(1)))
    assert named == takes, f"README names {sorted(named)}; --json is taken by {sorted(takes)}"


def test_benchmarks_speak_of_results_not_of_the_work_log() -> None:
    """Issue and device-call references belong to the archive (docs/benchmarks-archive.md)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    found = re.findall(r"\b(?:issue|call) \d+", text, re.I)
    assert not found, f"BENCHMARKS.md refers to the work log: {found}"
    assert text.index("## Headline") < text.index("## Method")


# ------------------------------------------------------------- the worked example's outputs

README_TABLES = ROOT / "tests" / "fixtures" / "readme"  # the table and the output of the README's run
HOME_TABLES = "~/.local/share/a2a-tune/profiles"


def _worked_example() -> list[tuple[list[str], list[str]]]:
    """(command words, the lines shown after it) of the README's worked example, a line ending
    in a backslash joined with the next."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Worked example") : text.index("## Documentation")]
    shown: list = []
    for block in re.findall(r"```\n(.*?)```", section, re.S):
        lines: list[str] = []
        for line in block.splitlines():
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1].rstrip() + " " + line.strip()
            else:
                lines.append(line.rstrip())
        for line in lines:
            if line.startswith("$ a2a-tune "):
                shown.append((line[len("$ a2a-tune ") :].split(), []))
            else:
                shown[-1][1].append(line)
    return shown


def _in_order(expected: list[str], printed: list[str]) -> str | None:
    """Where `expected` (with `...` for lines left out) is not `printed`, in one line; None when it is."""
    at = 0
    for line in expected:
        if line == "...":
            continue
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            return f"not printed (in this order): {line!r}"
    return None


def test_the_worked_examples_outputs_are_what_the_commands_print(tmp_path) -> None:
    """Issue 37: the worked example's outputs had drifted from what the commands print. The run's
    block is compared with the output it recorded (tests/fixtures/readme/run.txt, with the table
    it wrote beside it); the others run here, on that table, and must print what is shown."""
    shown = _worked_example()
    assert [words[0] for words, _ in shown] == ["run", "show", "lookup", "lookup"]
    recorded = (README_TABLES / "run.txt").read_text().splitlines()
    assert recorded[0] == "$ a2a-tune " + " ".join(shown[0][0])
    problems = []
    if problem := _in_order(shown[0][1], [line.rstrip() for line in recorded[1:]]):
        problems.append(f"run: {problem}")
    env = {
        **os.environ,
        "A2A_TUNE_PROFILE_DIR": str(README_TABLES),
        "A2A_TUNE_FINGERPRINT": "cpu-x86_64.node1",
        "COLUMNS": "100",
    }
    for words, expected in shown[1:]:
        args = [w.replace(HOME_TABLES, str(README_TABLES)) for w in words]
        done = subprocess.run(
            [sys.executable, "-m", "a2a_tune.tuner.cli", *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        printed = [line.rstrip().replace(str(README_TABLES), HOME_TABLES) for line in done.stdout.splitlines()]
        printed += [line.rstrip() for line in done.stderr.splitlines()]
        if problem := _in_order(expected, printed):
            problems.append(f"{' '.join(words[:3])}: {problem}")
    assert not problems, "\n".join(problems)
