"""Every environment variable a2a-tune reads, given hostile values (issue 31.6): empty, blank,
1 MB, a newline, terminal escapes, bytes that are not UTF-8, an unknown word, a FIFO, /dev/zero, a
directory. A blank text value is the variable unset; what reaches a message is one escaped,
bounded line; nothing raises a traceback or blocks. The vLLM plugin's variables:
tests/runtime/test_vllm_plugin.py; the timeouts: tests/tuner/test_hostile_cli.py. The list of
variables is docs/commands.md's, which this file keeps complete."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_env import BLANK, HOSTILE, for_child, hostile
from paths import REPO
from run_cli import a2a

from a2a_tune.kernels.errors import KernelsError
from a2a_tune.kernels.registry import _import_bounded
from a2a_tune.tuner.runtime import fingerprint, profiles
from a2a_tune.tuner.runtime.environ import EnvError

UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def _safe(line: str, limit: int = 1000) -> bool:
    return not UNSAFE.search(line) and len(line) <= limit


@pytest.mark.parametrize("kind", BLANK)
@pytest.mark.parametrize(
    "name", ["A2A_TUNE_DB", "A2A_TUNE_PROFILE_DIR", "A2A_TUNE_FINGERPRINT", "A2A_TUNE_NVML_RECORDING"]
)
def test_a_blank_text_variable_is_the_variable_unset(name, kind, monkeypatch, caplog):
    """Never a database, table directory or recording named by spaces, nor a fingerprint ' '."""
    from a2a_tune.db.engine import DEFAULT_URL, resolve_url
    from a2a_tune.tuner.probe import recorded_source

    profiles.clear_cache()
    monkeypatch.setenv(name, HOSTILE[kind])
    if name == "A2A_TUNE_DB":
        assert resolve_url(None) == DEFAULT_URL
    elif name == "A2A_TUNE_PROFILE_DIR":
        assert profiles.table_dir() == Path(profiles.user_profile_dir())
    elif name == "A2A_TUNE_FINGERPRINT":
        found, problem = profiles.resolve_fingerprint(None)  # this machine's, probed
        assert problem is None and found
    else:
        assert recorded_source() is None and not caplog.records


def test_tables_are_written_where_the_lookup_searches(tmp_path, monkeypatch):
    """A blank first entry of $A2A_TUNE_PROFILE_DIR is skipped by both."""
    profiles.clear_cache()
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", f"  {os.pathsep}{tmp_path}")
    assert profiles.table_dir() == tmp_path
    assert profiles._search_dirs()[0] == str(tmp_path)


@pytest.mark.parametrize("value", ["", "   ", "relative/dir", "a\nb"])
def test_an_xdg_directory_that_is_not_absolute_is_ignored(value, monkeypatch):
    """The XDG spec: a relative path in XDG_DATA_HOME / XDG_CACHE_HOME is invalid, ignored."""
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setenv("XDG_DATA_HOME", value)
    monkeypatch.setenv("XDG_CACHE_HOME", value)
    assert profiles.user_profile_dir() == "/home/operator/.local/share/a2a-tune/profiles"
    assert fingerprint._cache_dir() == "/home/operator/.cache/a2a-tune"


@pytest.mark.parametrize("kind", [k for k in HOSTILE if k not in BLANK])
def test_a_backend_module_name_is_echoed_in_one_bounded_line(kind, fifo, tmp_path):
    """$A2A_TUNE_BACKEND_MODULES names modules; whatever it holds, the error is one short line."""
    with pytest.raises(KernelsError) as info:
        _import_bounded(hostile(kind, fifo, tmp_path), 10)
    assert _safe(str(info.value), 500), str(info.value)[:300]
    assert str(info.value).startswith("A2A_TUNE_BACKEND_MODULES: cannot import ")


@pytest.mark.parametrize("kind", [k for k in HOSTILE if k not in BLANK])
def test_an_nvml_recording_of_any_name_is_one_warning_and_the_live_probe(kind, fifo, tmp_path, caplog):
    """A recording that cannot be replayed: one escaped line; the fingerprint cache key stays one
    line of ASCII (it is written to a file and compared)."""
    from a2a_tune.tuner.probe import recorded_source

    caplog.set_level(logging.WARNING)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_NVML_RECORDING", hostile(kind, fifo, tmp_path))
        assert recorded_source() is None
        key = fingerprint._host_key()
    ((record,),) = [[r for r in caplog.records if "A2A_TUNE_NVML_RECORDING" in r.getMessage()]]
    assert _safe(record.getMessage()), record.getMessage()[:300]
    assert key is None or (key.isascii() and "\n" not in key)


def test_probe_with_a_recording_named_by_bytes_that_are_not_utf8_is_one_warning():
    env = {**os.environ, "COLUMNS": "200"}
    env = {k.encode(): v.encode("utf-8", "surrogateescape") for k, v in env.items()}
    env[b"A2A_TUNE_NVML_RECORDING"] = b"/nowhere/\xff\xfe.json"
    r = subprocess.run([sys.executable, "-m", "a2a_tune.tuner.cli", "probe"], env=env, capture_output=True, timeout=120)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 0 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert "A2A_TUNE_NVML_RECORDING='/nowhere/\\udcff\\udcfe.json' cannot be replayed" in line


@pytest.mark.parametrize(
    "env, zero",
    [
        ({}, True),
        ({"RANK": "abc"}, True),  # not a torchrun job without WORLD_SIZE: ignored, as the launcher ignores it
        ({"RANK": "1", "WORLD_SIZE": "2"}, False),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, False),  # srun's rank 1 is quiet too
        ({"RANK": "abc", "WORLD_SIZE": "2"}, EnvError),
        ({"RANK": "\x1b[2J" + "9" * 100_000, "WORLD_SIZE": "2"}, EnvError),
    ],
    ids=["unset", "rank-abc", "torchrun-1", "srun-1", "job-rank-abc", "job-rank-escapes"],
)
def test_which_process_reports_is_read_as_the_launcher_sets_it(env, zero, monkeypatch):
    from a2a_tune.tuner.launch import is_rank_zero

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if zero is EnvError:
        with pytest.raises(EnvError) as info:
            is_rank_zero()
        assert _safe(str(info.value), 300) and str(info.value).startswith("RANK=")
    else:
        assert is_rank_zero() is zero


def test_check_with_a_rank_that_is_no_integer_runs_not_a_traceback(tmp_path):
    r = a2a(
        *("check", "--backend", "allgather_reducescatter", "--device", "cpu", "--world", "2"),
        *("--preset", "mixtral-8x7b"),
        env_extra={"RANK": "abc"},
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("kind", ["blank", "1MB", "newline", "ansi", "non-utf8", "fifo", "dev-zero", "directory"])
@pytest.mark.parametrize("command", [["show"], ["db", "upgrade"]], ids=["show", "db-upgrade"])
def test_a_database_variable_of_any_value_is_one_line_or_the_default(command, kind, fifo, tmp_path):
    """$A2A_TUNE_DB: blank is the default store; anything else that is no store is one escaped
    line, exit 2 (a FIFO, a device or a directory is never opened as a database)."""
    value = for_child(hostile(kind, fifo, tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "A2A_TUNE_DB"}
    env.update(COLUMNS="200", A2A_TUNE_DB=value)
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        cwd=tmp_path,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert "Traceback" not in r.stderr and len(lines) == 1 and _safe(lines[0]), r.stderr[-2000:]
    assert r.returncode == 2, lines
    if kind == "blank":  # the default store, not a file named by spaces
        assert "a2a_tune.db" in lines[0] and not (tmp_path / HOSTILE["blank"]).exists()


@pytest.mark.parametrize("kind", ["1MB", "newline", "ansi", "fifo", "dev-zero"])
def test_run_refuses_a_table_directory_it_cannot_write_in_one_line_before_the_sweep(kind, fifo, tmp_path):
    """$A2A_TUNE_PROFILE_DIR's first entry is where `run` writes: a name too long, a FIFO or a
    device under it is one escaped line, exit 2, before any rank starts."""
    value = for_child(hostile(kind, fifo, tmp_path))
    if kind in ("newline", "ansi"):
        value = f"/dev/zero/{value}"  # under a device: no directory can be made there
    r = a2a(
        *("run", "--device", "cpu", "--world", "2", "--preset", "mixtral-8x7b", "--tokens", "1"),
        *("--db", str(tmp_path / "s.db")),
        env_extra={"A2A_TUNE_PROFILE_DIR": value},
        cwd=tmp_path,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert _safe(lines[0], 1100) and lines[0].startswith("error: no table could be written to "), lines[0][:300]
    assert not (tmp_path / "s.db").exists()  # no run was opened


def test_every_variable_read_is_in_the_documented_list():
    """docs/commands.md's list names every A2A_TUNE_* variable the code reads, and only those."""
    read = set()
    for folder in ("tuner", "kernels", "db"):
        for path in (REPO / folder).rglob("*.py"):
            read |= set(re.findall(r"\bA2A_TUNE_[A-Z0-9_]+\b", path.read_text()))
    written = {"A2A_TUNE_BACKEND", "A2A_TUNE_MATCH", "A2A_TUNE_SGLANG_ARGS", "A2A_TUNE_SGLANG_MOE_A2A_BACKEND"}
    written |= {"A2A_TUNE_VLLM_ALL2ALL_BACKEND"}  # lookup --format env writes these; none is read
    text = (REPO / "docs" / "commands.md").read_text()
    section = text[text.index("## Environment variables") :]
    listed = set(re.findall(r"^\| `(A2A_TUNE_[A-Z0-9_]+)`", section, re.M))
    assert listed == read - written


@pytest.mark.parametrize(
    "value",
    ["²", "-1", "0", "abc", "9" * 5000, "\x1b[2J", " "],
    ids=["superscript", "-1", "0", "abc", "5000-digits", "ansi", "blank"],
)
def test_ranks_per_host_from_the_launcher_is_an_integer_or_ignored(value, monkeypatch):
    """LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE that is no positive integer counts every rank as
    local ("²" is a digit to str.isdigit, yet no int)."""
    from a2a_tune.tuner.plans import _local_ranks

    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
    assert _local_ranks(8) == 8
