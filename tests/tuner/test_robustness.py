"""Hostile and unlucky inputs (issue 17): the CLI's start-up path never hangs, resource limits
say so in one line, errors are one line without secrets, and read-only databases can be read.
(The runtime's own files, tables and probe: tests/runtime/; the sweep's one writer and its
ranks: tests/tuner/test_sweep_robustness.py and tests/db/test_lease.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest
from databases import store_with_a_completed_run
from read_only import run_in_read_only
from run_cli import a2a

from a2a_tune.tuner.runtime.lookup import FALLBACK_BACKEND, clear_cache

FIXTURES = paths.FIXTURES / "profiles"
FP = "test.fixture.node1"
SECRET_URL = "postgresql+psycopg2://u:secret@[::1:5432/x"


@pytest.fixture(autouse=True)
def _fresh_lookup():
    clear_cache()
    yield
    clear_cache()


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


# --------------------------------------------------------------------- start-up files


def test_the_cli_lookup_and_the_plugin_variable_survive_a_fifo(fifo, tmp_path):
    # --workload FIFO and --profile /dev/zero: the engine default, one warning, exit 0, promptly
    for args in (
        ["--workload", str(fifo), "--profile", str(FIXTURES / f"{FP}.json")],
        ["--tokens", "64", "--profile", "/dev/zero"],
    ):
        r = a2a("lookup", "--ep-size", "2", "--hidden", "7168", "--topk", "8", "--experts", "64", *args)
        assert r.returncode == 0 and r.stdout.strip() == FALLBACK_BACKEND, r.stderr
        assert "not a regular file" in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------- this machine's fingerprint


def test_the_probe_command_does_not_import_torch():
    code = (
        "import sys; from a2a_tune.tuner import cli; sys.argv = ['a2a-tune', 'probe', '--json']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'triton', 'a2a_tune.kernels') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "HEAVY []"
    assert '"fingerprint"' in r.stdout


# ---------------------------------------------------------------------- resource limits


def test_world_beyond_the_machine_is_refused_before_any_rank_starts(tmp_path):
    start = time.monotonic()
    r = a2a("sweep", "--device", "cpu", "--world", "1000", "--db", str(tmp_path / "w.db"), "--no-progress")
    assert r.returncode == 2
    line = one_error_line(r)
    assert "--world 1000 on cpu: this machine holds at most" in line and "core(s)" in line
    assert time.monotonic() - start < 60 and not (tmp_path / "w.db").exists()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"])
def test_commands_that_store_refuse_an_in_memory_database(url):
    r = a2a("sweep", "--device", "cpu", "--tokens", "1", "--db", url, "--no-progress")
    assert r.returncode == 2
    assert "is an in-memory database" in one_error_line(r)
    r = a2a("tune-knobs", "--backend", "nvlink_one_sided", "--preset", "mixtral-8x7b", "--tokens", "1", "--db", url)
    assert r.returncode == 2 and "is an in-memory database" in one_error_line(r)


def test_a_token_count_out_of_range_is_one_line():
    r = a2a("sweep", "--device", "cpu", "--tokens", "99999999999999999999", "--db", "x.db", "--no-progress")
    assert r.returncode == 2
    assert "--tokens: tokens per rank must be in 1..1048576, got 99999999999999999999" in one_error_line(r)


# ---------------------------------------------------------------------- one line each


def test_a_model_config_that_is_not_utf8_is_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"hidden_size": 4096, "name": "\xff\xfe"}')
    r = a2a("sweep", "--device", "cpu", "--model-config", str(bad), "--db", str(tmp_path / "c.db"))
    assert r.returncode == 2
    assert f"{bad}: not UTF-8 text" in one_error_line(r)
    r = a2a("sweep", "--device", "cpu", "--model-config", "/dev/zero", "--db", str(tmp_path / "c.db"))
    assert r.returncode == 2 and "not a regular file" in one_error_line(r)


def test_a_backend_module_raising_anything_is_one_line(tmp_path):
    (tmp_path / "broken_backends.py").write_text("raise ValueError('boom at import')\n")
    env = {
        "A2A_TUNE_BACKEND_MODULES": "broken_backends",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}",
    }
    r = a2a("backends", "--device", "cpu", env_extra=env)
    assert r.returncode == 2
    assert "cannot import 'broken_backends' (ValueError: boom at import)" in one_error_line(r)


def _hanging_module(tmp_path) -> dict:
    """An out-of-tree backend module that never finishes importing, and the environment that
    names it (each import bounded to 2 s)."""
    (tmp_path / "hangs_at_import.py").write_text("import time\n\ntime.sleep(3600)\n")
    return {
        "A2A_TUNE_BACKEND_MODULES": "hangs_at_import",
        "A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S": "2",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}",
    }


@pytest.mark.parametrize(
    "args",
    [
        ["backends", "--device", "cpu"],
        ["check", "--device", "cpu", "--world", "2", "--preset", "mixtral-8x7b"],
        ["sweep", "--device", "cpu", "--tokens", "1", "--no-progress"],
    ],
    ids=lambda a: a[0],
)
def test_a_backend_module_hanging_at_import_fails_in_one_line_within_the_bound(tmp_path, args):
    env = _hanging_module(tmp_path)
    if args[0] == "sweep":
        args = [*args, "--db", str(tmp_path / "s.db")]
    start = time.monotonic()
    r = a2a(*args, env_extra=env)
    assert time.monotonic() - start < 120  # the 2 s bound plus start-up on a loaded machine
    assert r.returncode == 2
    assert one_error_line(r) == (
        "error: A2A_TUNE_BACKEND_MODULES: importing 'hangs_at_import' did not finish within 2 s "
        "(A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S); what does it wait for at import?"
    )


def test_select_never_imports_the_backend_modules(tmp_path):
    """select writes a run's table with the engine names the sweep recorded for an
    out-of-tree backend, while that backend's module hangs at import."""
    from stored import measurement

    from a2a_tune.db import open_store

    db = tmp_path / "runs.db"
    mine = {"vllm_name": "nixl_ep", "sglang_name": None, "trtllm_name": None, "vllm_closest": None}
    with open_store(str(db)) as s:
        hw = s.get_or_create_hardware("cpu-test.node1", "0123456789abcdef", {"gpus": []})
        config = {"engine_names": [["allgather_reducescatter", {}], ["my_backend", {**mine, "engine_options": {}}]]}
        run = s.start_run(
            hw, device_type="cpu", world_size=2, versions={}, git_sha=None, config=config, config_hash="h"
        )
        for backend, us in (("allgather_reducescatter", 20.0), ("my_backend", 10.0)):
            s.add_measurement(run, measurement(backend=backend, median_us=us, p10_us=us, p90_us=us, knobs={}))
        s.finish_run(run, "completed")
    env = {**_hanging_module(tmp_path), "A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S": "600"}
    r = a2a("select", "--db", str(db), "--out", str(tmp_path / "out"), env_extra=env)
    assert r.returncode == 0, r.stderr
    (table,) = (tmp_path / "out").glob("*.json")
    profile = json.loads(table.read_text())
    assert profile["backends"]["my_backend"]["vllm_name"] == "nixl_ep"
    assert profile["backends"]["allgather_reducescatter"]["vllm_name"] == "allgather_reducescatter"  # today's


@pytest.mark.parametrize(
    "args",
    [
        ["show", "--db", SECRET_URL],
        ["select", "--db", SECRET_URL],
        ["diff", "--db", SECRET_URL, "--run", "1", "--run", "2"],
        ["report", "--db", SECRET_URL],
        ["db", "upgrade", "--db", SECRET_URL],
        ["sweep", "--device", "cpu", "--tokens", "1", "--no-progress", "--db", SECRET_URL],
    ],
    ids=lambda a: a[0] if a[0] != "db" else "db-upgrade",
)
def test_a_password_is_never_printed(args):
    r = a2a(*args)
    assert r.returncode != 0
    assert "secret" not in r.stdout + r.stderr, r.stderr
    assert "u:***@" in one_error_line(r)


def test_masking_covers_urls_that_do_not_parse():
    from a2a_tune.db import display_url, mask_secrets

    assert display_url(SECRET_URL) == "postgresql+psycopg2://u:***@[::1:5432/x"
    assert mask_secrets(f"cannot parse '{SECRET_URL}' or postgresql://a:p@ss@h/d") == (
        "cannot parse 'postgresql+psycopg2://u:***@[::1:5432/x' or postgresql://a:***@h/d"
    )


# ---------------------------------------------------------------- read-only databases


@pytest.mark.parametrize("command", ["show", "select", "report", "diff"])
def test_a_database_in_a_read_only_directory_is_read(command, tmp_path):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    db = shelf / "runs.db"
    store_with_a_completed_run(db)
    out = tmp_path / "out"
    out.mkdir()
    cli = [sys.executable, "-m", "a2a_tune.tuner.cli"]
    argv = {
        "show": [*cli, "show", "--db", str(db)],
        "select": [*cli, "select", "--db", str(db), "--out", str(out)],
        "report": [*cli, "report", "--db", str(db), "--out", str(out / "r.html")],
        "diff": [*cli, "diff", str(db), str(db)],
    }[command]
    before = sorted(p.name for p in shelf.iterdir())
    r = run_in_read_only(shelf, argv)
    assert r.returncode == 0, r.stderr
    assert "readonly" not in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in shelf.iterdir()) == before  # nothing created next to it


def _files(directory: Path) -> list[tuple[str, str]]:
    import hashlib

    return sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in directory.iterdir())


READERS = {
    "show": ["show"],
    "report": ["report", "--out", "{out}/r.html"],
    "plot": ["plot", "--out", "{out}"],
    "select": ["select", "--out", "{out}"],
}


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_reader_leaves_the_store_byte_for_byte_as_it_was(command, tmp_path):
    shelf, out = tmp_path / "shelf", tmp_path / "out"
    shelf.mkdir()
    out.mkdir()
    db = shelf / "runs.db"
    store_with_a_completed_run(db)
    before = _files(shelf)
    r = a2a(*[a.format(out=out) for a in READERS[command]], "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert _files(shelf) == before  # not a byte changed, no -wal or -shm left beside it
    assert list(out.iterdir()) or command == "show"  # it did read the run


@pytest.mark.parametrize("command", ["sweep", "show", "select"])
def test_refusing_a_store_of_a_newer_schema_leaves_it_as_it_was(command, tmp_path):
    import sqlite3

    db = tmp_path / "newer.db"
    store_with_a_completed_run(db)
    con = sqlite3.connect(db)  # a newer a2a-tune's store, in rollback-journal mode (a copied file)
    con.execute("UPDATE a2a_tune_alembic_version SET version_num = '0099_from_the_future'")
    con.commit()
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    before = _files(tmp_path)
    argv = {"sweep": ["sweep", "--device", "cpu", "--world", "2", "--tokens", "1", "--no-progress"]}.get(
        command, [command]
    )
    r = a2a(*argv, "--db", str(db), cwd=tmp_path)
    assert r.returncode in (1, 2) and "0099_from_the_future" in one_error_line(r)  # views: 2, bad input
    assert _files(tmp_path) == before


# ------------------------------------------------------------------------ first error


def _rank0_late_cause(ctx):
    if ctx.rank == 0:
        time.sleep(1.5)  # its report arrives after the peer's echo
        raise OSError(28, "No space left on device")
    raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242")


def _only_echoes(ctx):
    raise RuntimeError(f"rank {ctx.rank}: Connection reset by peer")


def test_run_ranks_reports_the_cause_before_its_echoes():
    from a2a_tune.tuner.launch import RankFailed, run_ranks

    with pytest.raises(RankFailed) as info:
        run_ranks(_rank0_late_cause, 2, "cpu")
    assert str(info.value) == "rank 0: OSError: [Errno 28] No space left on device"
    with pytest.raises(RankFailed, match="Connection reset by peer"):  # nothing better said: the echo
        run_ranks(_only_echoes, 2, "cpu")
