"""Command-line checks of issue 31: files checked before the work, one-line messages at 80
columns, options checked for meaning, variables checked where read."""

from __future__ import annotations

import pytest
from run_cli import a2a

KNOBS = {"A2A_TUNE_BACKEND_MODULES": "knob_backends"}
TUNE = ["tune-knobs", "--backend", "knobbed_sleepy", "--preset", "mixtral-8x7b", "--device", "cpu", "--tokens", "1"]


def _one_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["missing", "nested", "fifo"])
def test_tune_knobs_checks_its_profile_before_the_search(tmp_path, fifo, kind):
    path = {"missing": tmp_path / "none.json", "nested": tmp_path / "deep.json", "fifo": fifo}[kind]
    if kind == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    db = f"sqlite:///{tmp_path / 's.db'}"
    r = a2a(*TUNE, "--profile", str(path), "--db", db, env_extra=KNOBS)
    assert r.returncode == 2, r.stdout + r.stderr
    line = _one_line(r)
    assert str(path) in line
    assert "searching" not in r.stdout  # refused before the search began
    assert {"missing": "No such file", "nested": "nested too deeply", "fifo": "a FIFO"}[kind] in line


def test_db_upgrade_says_what_it_did_in_one_line_at_80_columns(tmp_path):
    db = tmp_path / ("a-long-directory-name-" * 4) / "store.db"
    db.parent.mkdir()
    from a2a_tune.db import open_store

    with open_store(str(db)):
        pass
    r = a2a("db", "upgrade", "--db", str(db), env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.strip()]
    assert "is at the current schema" in line and str(db) in line
