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


SWEEP = ["sweep", "--device", "cpu", "--world", "2", "--preset", "mixtral-8x7b", "--tokens", "1", "--no-progress"]


@pytest.mark.parametrize(
    "name", ["A2A_TUNE_COLLECTIVE_TIMEOUT_S", "A2A_TUNE_RENDEZVOUS_TIMEOUT_S", "A2A_TUNE_BACKEND_CALL_TIMEOUT_S"]
)
@pytest.mark.parametrize("value", ["abc", "nan", "-5", "1e300"])
def test_a_timeout_variable_out_of_range_is_one_line_before_any_rank_starts(tmp_path, name, value):
    from a2a_tune.tuner.runtime.environ import EnvError, env_seconds

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        with pytest.raises(EnvError, match=f"^{name}=.*more than 0 and at most"):
            env_seconds(name, 1.0)
    if value != "nan":
        return  # one spawned command per variable (CI time)
    db = tmp_path / "s.db"
    r = a2a(*SWEEP, "--db", str(db), env_extra={name: value})
    assert r.returncode == 2, r.stdout + r.stderr
    assert name in _one_line(r)
    assert not db.exists()  # nothing started


def test_launch_reads_the_timeouts_where_they_are_used(monkeypatch):
    from a2a_tune.tuner import launch
    from a2a_tune.tuner.runtime.environ import EnvError

    monkeypatch.setenv("A2A_TUNE_COLLECTIVE_TIMEOUT_S", "")
    assert launch.collective_timeout().total_seconds() == 300
    monkeypatch.setenv("A2A_TUNE_COLLECTIVE_TIMEOUT_S", "-5")
    with pytest.raises(EnvError, match="A2A_TUNE_COLLECTIVE_TIMEOUT_S='-5'"):
        launch.run_ranks(print, 2, "cpu")  # before any rank starts


LOOKUP = ["lookup", "--ep-size", "2", "--hidden", "4096", "--topk", "6", "--experts", "64", "--tokens", "64"]


def test_an_invalid_workspace_budget_never_makes_lookup_env_print_nothing():
    from bad_tables import FIXTURE

    env = {"A2A_TUNE_MAX_WORKSPACE_MIB": "lots"}
    r = a2a(*LOOKUP, "--profile", str(FIXTURE), "--format", "env", env_extra=env)
    assert r.returncode == 0, r.stderr
    assert "export" in r.stdout or "=" in r.stdout
    assert "A2A_TUNE_MAX_WORKSPACE_MIB" in r.stderr and "no workspace budget applied" in r.stderr
    r = a2a(*LOOKUP, "--profile", str(FIXTURE), "--format", "name", env_extra=env)
    assert r.returncode == 2 and "A2A_TUNE_MAX_WORKSPACE_MIB" in _one_line(r)


@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_case_timeout_must_be_finite_and_positive(tmp_path, value):
    from a2a_tune.tuner.plans import PlanError, check_seconds

    with pytest.raises(PlanError, match="--case-timeout must be a number of seconds more than 0"):
        check_seconds(float(value), "--case-timeout")
    if value != "nan":
        return  # one spawned command (CI time)
    db = tmp_path / "s.db"
    r = a2a(*SWEEP, "--db", str(db), "--case-timeout", value)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--case-timeout must be" in _one_line(r) and not db.exists()


def test_check_timeout_inf_is_refused():
    r = a2a("check", "--device", "cpu", "--timeout", "inf", "--backend", "nccl_all2allv")
    assert r.returncode == 2 and "--timeout must be" in _one_line(r)


def test_an_option_value_is_echoed_bounded(tmp_path):
    r = a2a(*SWEEP[:-5], "--preset", "x" * 100_000, "--tokens", "1", "--db", str(tmp_path / "s.db"))
    assert r.returncode == 2
    line = _one_line(r)
    assert "unknown model preset" in line and len(line) < 2000


def test_probe_prints_a_host_name_through_the_one_escaping_function():
    import io

    from rich.console import Console

    from a2a_tune.tuner.probe import cpu_topology, render_summary

    topo = cpu_topology(hostname="evil\x1b]0;owned\x07\x1b[2Jhost", machine="x86_64")
    buffer = io.StringIO()
    Console(file=buffer, width=200, force_terminal=False).print(render_summary(topo))
    text = buffer.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "evil\\x1b]0;owned\\x07\\x1b[2Jhost" in text


def test_run_out_to_a_read_only_directory_is_refused_before_the_sweep(tmp_path):
    import sys

    from read_only import run_in_read_only

    out = tmp_path / "tables"
    out.mkdir()
    db = tmp_path / "s.db"
    argv = [sys.executable, "-m", "a2a_tune.tuner.cli", "run", *SWEEP[1:], "--db", str(db), "--out", str(out / "sub")]
    r = run_in_read_only(out, argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no table could be written" in _one_line(r) and str(out) in r.stderr
    assert not db.exists()  # refused before the sweep
