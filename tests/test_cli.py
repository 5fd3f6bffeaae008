"""The command line as a user runs it: real subprocesses, real exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def a2a(*args: str, env_extra: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """`a2a-tune run` on 2 CPU ranks, small: the README's main job in miniature."""
    root = tmp_path_factory.mktemp("cli")
    env = {"XDG_DATA_HOME": str(root / "xdg")}
    r = a2a(
        "run", "--device", "cpu", "--world", "2", "--preset", "mixtral-8x7b", "--tokens", "1,8,32",
        "--warmup", "1", "--iters", "3", "--db", str(root / "t.db"), "--no-progress", env_extra=env, cwd=root,
    )  # fmt: skip
    return root, env, r


def test_run_writes_a_table_the_lookup_finds_by_fingerprint(finished_run):
    root, env, r = finished_run
    assert r.returncode == 0, r.stderr
    assert "6 measured" in r.stdout and "(completed)" in r.stdout
    table = root / "xdg" / "a2a-tune" / "profiles" / "cpu-x86_64.node1.json"
    if not table.exists():  # another architecture: find the one file written
        (table,) = (root / "xdg" / "a2a-tune" / "profiles").glob("cpu-*.json")
    profile = json.loads(table.read_text())
    assert profile["schema"] == 1 and profile["entries"][0]["tokens"] == [1, 8, 32]

    look = a2a("lookup", "--ep-size", "2", "--hidden", "4096", "--topk", "2", "--experts", "8", "--tokens", "16", env_extra=env)
    assert look.returncode == 0, look.stderr
    assert look.stdout.strip() in {"allgather_reducescatter", "nccl_all2allv"}
    assert look.stderr.startswith("exact:")

    as_json = json.loads(
        a2a("lookup", "--ep-size", "2", "--hidden", "4096", "--topk", "2", "--experts", "8", "--tokens", "16",
            "--format", "json", env_extra=env).stdout  # fmt: skip
    )
    assert as_json["match"] == "exact" and set(as_json["expected_us"]) == {"allgather_reducescatter", "nccl_all2allv"}


def test_vllm_format_only_prints_a_literal_vllm_accepts(finished_run):
    root, env, _ = finished_run
    r = a2a("lookup", "--ep-size", "2", "--hidden", "4096", "--topk", "2", "--experts", "8", "--tokens", "8",
            "--format", "vllm", env_extra=env)  # fmt: skip
    assert r.returncode == 0
    assert r.stdout.strip() == "--all2all-backend allgather_reducescatter"  # nccl_all2allv has no vLLM literal


def test_select_again_from_the_database(finished_run, tmp_path):
    root, env, _ = finished_run
    r = a2a("select", "--db", str(root / "t.db"), "--out", str(tmp_path), env_extra=env)
    assert r.returncode == 0, r.stderr
    assert len(list(tmp_path.glob("cpu-*.json"))) == 1


def test_resume_of_a_completed_plan_measures_again_into_a_new_run(finished_run):
    root, env, _ = finished_run
    r = a2a("sweep", "--device", "cpu", "--preset", "mixtral-8x7b", "--tokens", "1", "--iters", "2", "--warmup", "0",
            "--backend", "nccl_all2allv", "--db", str(root / "t.db"), "--no-progress", env_extra=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "run 2 (completed)" in r.stdout and "1 measured" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("sweep", "--device", "cpu", "--preset", "llama"), "unknown model preset 'llama'"),
        (("sweep", "--device", "cpu", "--backend", "deepep"), "unknown backend 'deepep'"),
        (("sweep", "--device", "cpu", "--tokens", "1,x"), "--tokens must be comma-separated integers"),
        (("sweep", "--device", "cpu", "--world", "1"), "--world must be at least 2"),
        (("sweep", "--device", "cpu", "--dtype", "int3"), "unknown --dtype 'int3'"),
        (("lookup", "--ep-size", "2", "--hidden", "1", "--topk", "1", "--experts", "2", "--tokens", "1", "--format", "x"),
         "--format must be"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = a2a(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_corrupt_database_is_one_line(tmp_path):
    db = tmp_path / "bad.db"
    db.write_bytes(b"this is not a database" * 100)
    r = a2a("select", "--db", str(db))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_select_on_an_empty_database_says_what_to_do(tmp_path):
    r = a2a("select", "--db", str(tmp_path / "empty.db"))
    assert r.returncode == 1 and "run `a2a-tune sweep` first" in r.stderr


def test_lookup_with_a_garbled_table_falls_back_with_one_warning(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": 1, "entries": [')
    r = a2a("lookup", "--profile", str(bad), "--ep-size", "2", "--hidden", "64", "--topk", "2", "--experts", "8", "--tokens", "4")
    assert r.returncode == 0
    assert r.stdout.strip() == "allgather_reducescatter"
    assert len(r.stderr.strip().splitlines()) == 1 and str(bad) in r.stderr


def test_probe_on_a_machine_without_gpus_reports_the_cpu(tmp_path):
    r = a2a("probe", "--json")
    assert r.returncode == 0
    facts = json.loads(r.stdout)
    assert "fingerprint" in facts and "facts_hash" in facts


def test_help_explains_the_flow():
    r = a2a("--help")
    assert r.returncode == 0
    for word in ("probe", "sweep", "select", "lookup", "run"):
        assert word in r.stdout
