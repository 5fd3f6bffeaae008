"""Standard output a program reads (issue 35 items 10-12): `--json` writes one document to stdout on
success, failure and interrupt, whatever ranks and imported modules print; report and plot
refuse a target that is not a regular file and write atomically."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_cli import a2a

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "profiles" / "h200.nvl18x2.node1.json"
NOISY = {"A2A_TUNE_BACKEND_MODULES": "noisy_backends"}


def _document(r: subprocess.CompletedProcess) -> dict:
    """The one JSON document on stdout (json.loads refuses anything before or after it)."""
    return json.loads(r.stdout)


def test_backends_json_is_one_document_when_a_backend_module_prints_on_import():
    r = a2a("backends", "--device", "cpu", "--json", env_extra=NOISY)
    assert r.returncode == 0, r.stderr
    assert {b["backend"] for b in _document(r)["backends"]} >= {"allgather_reducescatter"}
    assert "hello from print()" in r.stderr and "hello from fd 1" in r.stderr  # said, on stderr


@pytest.mark.slow
def test_sweep_json_is_one_document_when_every_rank_prints(tmp_path):
    db = tmp_path / "s.db"
    args = "sweep --device cpu --world 2 --preset mixtral-8x7b --tokens 1 --warmup 0 --iters 2 --no-progress"
    r = a2a(*args.split(), "--backend", "allgather_reducescatter", "--db", str(db), "--json", env_extra=NOISY)
    assert r.returncode == 0, r.stderr
    data = _document(r)
    assert (data["run"], data["status"], data["measured"]) == (1, "completed", 1)
    assert r.stderr.count("hello from fd 1") >= 3  # the command and both ranks imported it


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["lookup", "--ep-size", "2", "--preset", "mixtral-8x7b", "--hidden", "0", "--tokens", "1"], 2, "--hidden"),
        (["lookup", "--ep-size", "x", "--hidden", "8", "--topk", "1", "--experts", "2", "--tokens", "1"], 2, None),
        (["show", "--profile", "/nonexistent/table.json", "--json"], 2, "/nonexistent/table.json"),
        (["sweep", "--device", "cpu", "--tokens", "0", "--json"], 2, "tokens"),
        (["sweep", "--device", "cpu", "--world", "x", "--json"], 2, None),
        (["check", "--device", "cpu", "--backend", "no_such_backend", "--json"], 2, "no_such_backend"),
        (["evaluate", "--profile", "/nonexistent/t.json", "--table-points", "--json"], 2, "/nonexistent/t.json"),
        (["diff", "/nonexistent/a.json", "/nonexistent/b.json", "--json"], 2, "/nonexistent/a.json"),
    ],
)
def test_a_failing_json_command_prints_the_error_as_its_document(args, code, words):
    if args[0] == "lookup":
        args = [*args, "--format", "json"]
    r = a2a(*args)
    assert r.returncode == code, r.stderr
    data = _document(r)
    assert data["exit_code"] == code and data["error"]
    if words:
        assert words in data["error"] and words in r.stderr  # the same line a person reads


def _stored(db) -> int:
    try:
        with sqlite3.connect(db) as c:
            return c.execute("select count(*) from measurements").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_sweep_json_on_sigterm_prints_the_run_and_interrupted(tmp_path):
    db, gate = tmp_path / "term.db", tmp_path / "gate"
    gate.touch()
    env = {**os.environ, "A2A_TUNE_BACKEND_MODULES": "planted_backends", "A2A_TUNE_TEST_GATE": str(gate)}
    args = "sweep --device cpu --world 2 --preset mixtral-8x7b --tokens 1,2 --warmup 0 --iters 2 --no-progress"
    args += " --backend allgather_reducescatter --backend planted_gate --json"
    cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *args.split(), "--db", str(db)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while _stored(db) < 1 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, "the sweep should wait at the gate"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    data = json.loads(out)
    assert (data["run"], data["status"], data["signal"], data["exit_code"]) == (1, "interrupted", "SIGTERM", 143)
    assert "--resume" in data["error"]


@pytest.mark.parametrize("command", ["report", "plot"])
def test_report_and_plot_refuse_a_fifo_at_once_and_leave_no_partial_file(tmp_path, command):
    target = tmp_path / ("r.html" if command == "report" else "plots")
    if command == "report":
        os.mkfifo(target)
        args = ["--out", str(target)]
    else:
        pytest.importorskip("matplotlib")
        first = a2a("plot", "--profile", str(SHIPPED), "--out", str(tmp_path / "first"))
        assert first.returncode == 0, first.stderr
        target.mkdir()
        os.mkfifo(target / Path(first.stdout.split()[0]).name)  # one of the names it writes
        args = ["--out", str(target)]
    pytest.importorskip("matplotlib")
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", command, "--profile", str(SHIPPED), *args],
        capture_output=True,
        text=True,
        timeout=120,  # today: blocked forever on open()
    )
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "not a regular file" in line
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary left behind


def test_report_replaces_its_file_atomically_and_follows_a_symlink(tmp_path):
    from a2a_tune.tuner.views.model import write_output

    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    before = os.stat(real).st_ino
    write_output(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert os.stat(real).st_ino != before  # a new file renamed over the old one, not rewritten in place


def test_a_document_never_carries_infinity_or_nan():
    from typer.testing import CliRunner

    from a2a_tune.tuner.cli.common import app, emit_json, json_output

    @app.command("zz-test-nonfinite", hidden=True)
    @json_output(lambda o: True)
    def _nonfinite() -> None:
        emit_json({"a": float("inf"), "b": [float("nan"), 1.5], "c": {"d": -float("inf")}})

    try:
        r = CliRunner().invoke(app, ["zz-test-nonfinite"])
    finally:
        app.registered_commands.pop()
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the document")) == {
        "a": None,
        "b": [None, 1.5],
        "c": {"d": None},
    }
