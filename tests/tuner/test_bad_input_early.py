"""Bad input refused before any rank starts, exit 2, in one line that shows it as typed (issue 30):
a database driver that is not installed, an in-memory URL, `a2a-tune db` alone."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from a2a_tune.db import StoreError, check_url
from a2a_tune.tuner.cli import app

SMALL = ("--device", "cpu", "--preset", "mixtral-8x7b", "--tokens", "1", "--no-progress")


def invoke(*args):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_database_driver_that_is_not_installed_is_refused_up_front(monkeypatch, command):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    r = invoke(command, *SMALL, "--db", "postgresql://tuner:s3cret@db.example/a2a")
    assert r.exit_code == 2, r.output
    assert "driver (psycopg) is not installed" in r.output and "a2a-tune[postgres]" in r.output
    assert "s3cret" not in r.output and "sweeping" not in r.output  # no rank started
    assert len(r.output.strip().splitlines()) == 1


def test_the_driver_check_passes_when_the_driver_imports():
    assert check_url("sqlite:///runs.db", persistent=True) == "sqlite:///runs.db"
    with pytest.raises(StoreError, match="not a valid database URL"):
        check_url("postgresql://:::/", persistent=True)


def test_an_in_memory_url_is_refused_and_shown_as_typed():
    r = invoke("sweep", *SMALL, "--db", "sqlite:///:memory:")
    assert r.exit_code == 2, r.output
    assert "sqlite:///:memory: is an in-memory database" in r.output and "%3A" not in r.output


def test_db_alone_lists_its_subcommands():
    r = invoke("db")
    assert r.exit_code == 2
    assert "upgrade" in r.output and "Commands" in r.output


@pytest.mark.parametrize("kind", ["directory", "garbage", "no folder"])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_db_path_that_cannot_hold_a_store_is_refused_before_the_ranks_start(tmp_path, monkeypatch, command, kind):
    """Issue 37: a directory or a garbage file as --db gave `StoreError ... unable to open database
    file` after 11 s of ranks, exit 1; `show` refuses the same path at once, exit 2."""
    import a2a_tune.tuner.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "sweep", lambda *a, **k: pytest.fail("the ranks started"))
    path = tmp_path / "store.db"
    if kind == "directory":
        path.mkdir()
    elif kind == "garbage":
        path.write_bytes(b"\x8f garbage, not a database" * 100)
    else:
        path = tmp_path / "missing" / "store.db"
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path / "tables"))
    r = invoke(command, *SMALL, "--db", str(path))
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert str(path) in r.output and "Traceback" not in r.output
    shown = invoke("show", "--db", str(path))  # the views say the same of it
    assert shown.exit_code == 2


def test_an_empty_or_missing_db_file_is_fine_for_a_store(tmp_path):
    from a2a_tune.tuner.cli.common import _unusable_sqlite_file

    (tmp_path / "empty.db").write_bytes(b"")
    assert _unusable_sqlite_file(f"sqlite:///{tmp_path / 'empty.db'}") is None
    assert _unusable_sqlite_file(f"sqlite:///{tmp_path / 'new.db'}") is None
    assert _unusable_sqlite_file("postgresql+psycopg://u@h/db") is None
