"""Every command's output at 80 and 200 columns, on a terminal and piped into a log: each line
fits the width, no name is cut ("…") or split, and every backend name the wide output shows
appears whole in the narrow one (issue 30).

`show`, `diff` and `evaluate --table-points` run in this process on stored fixtures (the
consoles read COLUMNS and TTY_COMPATIBLE when they print); `check` renders stored rows of a
CPU check; `backends` lists this process's registry (its names, whatever they are, stay whole)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from paths import FIXTURES, REPO
from planted_slowdown import slowed
from rich.cells import cell_len
from rich.console import Console
from run_cli import a2a
from typer.testing import CliRunner

from a2a_tune.tuner.check import Row, render
from a2a_tune.tuner.cli import app

H200 = REPO / "profiles" / "h200.nvl18x2.node1.json"
SCHEMA3 = FIXTURES / "profiles" / "test.fixture.node1.json"
PAIR = FIXTURES / "diff" / "cpu_pair_a.json", FIXTURES / "diff" / "cpu_pair_b.json"
CHECK_ROWS = FIXTURES / "check" / "mixtral_cpu2.json"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
WAYS = [(80, False), (80, True), (200, False), (200, True)]  # (columns, on a terminal)
NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")  # a backend-like identifier: words joined by "_"


def names_of(*tables) -> set:
    """Every backend name the tables hold (their curves and failures)."""
    names = set()
    for path in tables:
        data = json.loads(path.read_text())
        for entry in data["entries"]:
            names |= set(entry["backends"]) | set(entry.get("failed") or {})
    return names


def check_lines(text: str, width: int, names) -> str:
    plain = ANSI.sub("", text)
    lines = plain.splitlines()
    assert lines, "no output"
    wide = [line for line in lines if cell_len(line) > width]
    assert not wide, f"{len(wide)} line(s) over {width} columns, e.g. {wide[0]!r}"
    assert "…" not in plain, next(line for line in lines if "…" in line)
    # a name split across lines leaves a fragment: an identifier that is a proper prefix of a name
    for token in set(NAME.findall(plain)):
        assert token in names or not any(n.startswith(token) for n in names), f"{token!r}: a cut name"
    return plain


def invoke(args, width: int, terminal: bool):
    env = {"COLUMNS": str(width), "TTY_COMPATIBLE": "1" if terminal else "0"}
    return CliRunner().invoke(app, list(args), env=env)


@pytest.mark.parametrize(("width", "terminal"), WAYS)
@pytest.mark.parametrize(
    "args",
    [
        ("show", "--profile", str(SCHEMA3)),
        ("show", "--profile", str(H200)),
        ("evaluate", "--profile", str(H200), "--table-points"),
        ("diff", *map(str, PAIR)),
        ("show", "--profile", str(FIXTURES / "readme" / "cpu-x86_64.node1.json")),  # nvfp4: "not measured: ..."
    ],
    ids=["show-schema3", "show-h200", "evaluate-table-points", "diff-cpu-pair", "show-cpu-nvfp4"],
)
def test_views_fit_and_keep_names_whole(args, width, terminal):
    names = names_of(*(Path(a) for a in args if a.endswith(".json")))
    r = invoke(args, width, terminal)
    assert r.exit_code in (0, 1), r.output
    plain = check_lines(r.stdout, width, names)
    wide = ANSI.sub("", invoke(args, 200, False).stdout)
    for name in names:  # what the wide output names, the narrow one names whole
        assert (name in plain) == (name in wide), name


@pytest.mark.parametrize(("width", "terminal"), WAYS)
def test_diff_of_a_planted_regression_fits(tmp_path, width, terminal):
    slow = slowed(H200, tmp_path / "slow.json", "nvlink_one_sided", 1.2)
    r = invoke(("diff", str(H200), str(slow)), width, terminal)
    assert r.exit_code == 1, r.output  # the regression is reported
    plain = check_lines(r.stdout, width, names_of(H200))
    assert "nvlink_one_sided" in plain and "FAIL (regressions)" in " ".join(plain.split())


@pytest.mark.parametrize(("width", "terminal"), WAYS)
def test_check_rows_fit(width, terminal):
    from io import StringIO

    rows = [Row(**r) for r in json.loads(CHECK_ROWS.read_text())]
    console = Console(file=StringIO(), width=width, force_terminal=terminal)
    render(rows, console, "each case ran on 2 cpu rank(s)")
    names = {r.backend for r in rows}
    plain = check_lines(console.file.getvalue(), width, names)
    for name in names:
        assert name in plain, name
    reasons = " ".join(plain.split())
    assert "implemented" in reasons and "fp8_e4m3" in reasons  # prose wraps at spaces: whole words


@pytest.mark.parametrize(("width", "terminal"), WAYS)
def test_backends_fits_and_names_every_engine(width, terminal):
    r = invoke(("backends", "--device", "cpu"), width, terminal)
    assert r.exit_code == 0, r.output
    listed = json.loads(invoke(("backends", "--device", "cpu", "--json"), 80, False).stdout)["backends"]
    names = {b["backend"] for b in listed} | {n for b in listed for n in b["engines"].values() if n}
    plain = check_lines(r.stdout, width, names)
    for name in names:
        assert name in plain, name
    assert "TensorRT-LLM" in plain and "NVLINK_ONE_SIDED" in plain


def test_a_healthy_table_gives_no_lookup_warning_per_point():
    """show --profile / evaluate --table-points: the lookup's fallback warning is for an engine
    starting up; here one line per engine says where the table leaves it its default (issue 30,
    issue 31 item 14)."""
    for args in (("show", "--profile", str(SCHEMA3)), ("evaluate", "--profile", str(SCHEMA3), "--table-points")):
        r = a2a(*args)  # a process of its own: the lookup warns once per process, on a logger
        assert r.returncode == 0 and r.stderr == "", r.stderr
        said = [line for line in r.stdout.splitlines() if "keeps its default" in line]
        assert len(said) == 1 and said[0].strip().startswith("SGLang: at 9 of 9 point(s)"), said


@pytest.mark.parametrize("width", [80, 200])
def test_the_progress_bar_keeps_its_count_and_eta(width):
    from io import StringIO

    from a2a_tune.tuner.progress import progress_bar

    bar = progress_bar(True, "sweep")
    task = bar.add_task("", total=60)
    bar.update(task, advance=8, description="qwen3-235b-a22b bf16 uniform T=64 allgather_reducescatter_padded")
    console = Console(file=StringIO(), width=width, force_terminal=True)
    console.print(bar.make_tasks_table(bar.tasks))
    plain = check_lines(console.file.getvalue(), width, {"allgather_reducescatter_padded"})
    assert "8/60" in plain and "-:--:--" in plain and "allgather_reducescatter_padded" in plain


def test_a_table_too_wide_for_any_layout_is_squeezed_not_looped():
    from io import StringIO

    from rich.table import Column

    from a2a_tune.tuner.console import fit

    console = Console(file=StringIO(), width=30)
    columns = [Column("a", no_wrap=True), Column("b", no_wrap=True), Column("c", no_wrap=True)]
    tables = fit(console, columns, [("x" * 20, "y" * 20, "z" * 20)], stack=(2, 1))
    assert [len(t.columns) for t in tables] == [2, 2]  # each keeps the key and one column of its own


QUICKSTART = FIXTURES / "diff" / "quickstart_a.json", FIXTURES / "diff" / "quickstart_b.json"


@pytest.mark.parametrize("terminal", [False, True])
def test_diff_of_two_quick_start_tables_keeps_its_prose_readable_at_80_columns(terminal):
    """Issue 37: two CPU tables of the Quick start (`a2a-tune run` on a 2-core machine, twice),
    diffed at 80 columns: the "in B" column beside two long backend names wrapped to two
    characters a line, 18 lines a row. Its words stay whole now, and the diff no longer than
    twice the one-line-a-row output at 200 columns."""
    r = invoke(("diff", *map(str, QUICKSTART)), 80, terminal)
    assert r.exit_code == 0, r.output
    plain = check_lines(r.stdout, 80, names_of(*QUICKSTART))
    words = set(re.findall(r"[A-Za-z()]+", plain))
    assert {"within", "noise", "overlap"} <= words and "(spreads" in plain
    assert not {"wi", "th", "no", "is"} & words, "prose split inside its words"
    wide = ANSI.sub("", invoke(("diff", *map(str, QUICKSTART)), 200, False).stdout).splitlines()
    assert len(plain.splitlines()) <= 2 * len(wide), (len(plain.splitlines()), len(wide))


@pytest.mark.parametrize("terminal", [False, True])
def test_the_sweeps_progress_bar_is_one_line_at_80_columns(terminal):
    """Issue 37: `T=256` wrapped onto a line of its own at 80 columns. The sweep's description of
    a point (EP size, model, payload, tokens; the routing when not uniform) fits beside the bar."""
    from io import StringIO

    from a2a_tune.tuner.progress import progress_bar
    from a2a_tune.tuner.shapes import presets

    longest = max(presets(), key=len)
    for description in (f"EP 64 {longest} fp8_e4m3 T=16384", f"EP 8 {longest} nvfp4 skewed T=256"):
        bar = progress_bar(True, "sweep")
        task = bar.add_task("", total=1440)
        bar.update(task, advance=800, description=description)
        console = Console(file=StringIO(), width=80, force_terminal=terminal)
        console.print(bar.make_tasks_table(bar.tasks))
        lines = ANSI.sub("", console.file.getvalue()).rstrip("\n").splitlines()
        assert len(lines) == 1 and cell_len(lines[0]) <= 80, lines
