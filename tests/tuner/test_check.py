"""`a2a-tune check` as a backend author runs it: real subprocesses, 2 CPU ranks over gloo, the
built-in CPU backends and deliberately broken out-of-tree ones (tests/support/planted_backends.py,
loaded through A2A_TUNE_BACKEND_MODULES like any plugin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from a2a_tune.kernels.reference import TOLERANCE

CPU_BACKENDS = ("allgather_reducescatter", "allgather_reducescatter_padded", "nccl_all2allv")
INVARIANT_CASES = {"uniform", "skewed-zero", "local", "repeated", "steps"}


def a2a_check(
    tmp_path, *args: str, env_extra: dict | None = None, world: int = 2, experts: int = 8
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    config = tmp_path / "tiny" / "config.json"  # a small MoE layer: the cases stay quick on CPU
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps({"num_local_experts": experts, "num_experts_per_tok": 2, "hidden_size": 96}))
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", "check", "--device", "cpu", "--world", str(world)]
        + ["--model-config", str(config), "--no-progress", "--json", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env_extra or {})},
        timeout=600,
    )
    # --json: the rows on standard output (an error document has none), the table and the counts on stderr
    document = json.loads(r.stdout) if r.stdout.strip() else {}
    assert ("rows" in document) != ("error" in document), document  # one document: the rows, or the error
    return subprocess.CompletedProcess(r.args, r.returncode, r.stderr, r.stderr), document.get("rows", [])


def by_backend(rows: list[dict]) -> dict[str, dict[str, dict]]:
    table: dict[str, dict[str, dict]] = {}
    for row in rows:
        table.setdefault(row["backend"], {})[row["case"]] = row
    return table


def test_the_built_in_cpu_backends_pass_every_case_that_applies(tmp_path):
    r, rows = a2a_check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    table = by_backend(rows)
    for name in CPU_BACKENDS:
        cases = table[name]
        for case in INVARIANT_CASES:
            assert cases[case]["status"] == "ok", cases[case]
            assert 0 <= cases[case]["max_rel_error"] <= 2.5e-2
        assert cases["skewed-zero"]["tokens"] == [0, 300] and cases["repeated"]["tokens"] == [1024, 1024]
        for case, dtype in (("fp8", "fp8_e4m3"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp8")):  # packed rows + scales
            assert cases[case]["status"] == "ok" and cases[case]["dtype"] == dtype, cases[case]
            assert 0 < cases[case]["max_rel_error"] <= TOLERANCE[dtype]
    # graph replays: only for capturable backends, and only on CUDA
    assert table["allgather_reducescatter_padded"]["graph-replays"]["status"] == "skip"
    assert "graph-replays" not in table["nccl_all2allv"]
    # GPU backends are skipped here with their reason, not failed
    assert table["nvlink_one_sided"]["-"]["status"] == "skip"
    assert table["nvlink_one_sided"]["-"]["reason"].startswith("unavailable: needs CUDA")
    assert "0 FAIL" in r.stdout and "nccl_all2allv" in r.stdout


def test_broken_out_of_tree_backends_fail_the_check_and_a_hung_one_is_stopped(tmp_path):
    names = ["planted_off_by_one", "planted_crash", "planted_hang", "nccl_all2allv", "planted_unavailable"]
    names.append("planted_bf16_only")
    r, rows = a2a_check(
        tmp_path,
        "--timeout",
        "8",
        *[arg for n in names for arg in ("--backend", n)],
        env_extra={"A2A_TUNE_BACKEND_MODULES": "planted_backends"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    table = by_backend(rows)
    for case in INVARIANT_CASES:
        assert table["planted_off_by_one"][case]["status"] == "FAIL"
        assert table["planted_off_by_one"][case]["reason"].startswith("incorrect: ")
        crash = table["planted_crash"][case]
        assert crash["status"] == "FAIL" and "RuntimeError: planted failure: kernel image not found" in crash["reason"]
        assert table["nccl_all2allv"][case]["status"] == "ok"  # checked after the hung backend's ranks were stopped
    (hung,) = table["planted_hang"].values()  # its first case hangs; the rest is not run
    assert (
        hung["case"] == "uniform"
        and hung["status"] == "FAIL"
        and hung["reason"].startswith("hung: no progress for 8 s")
    )
    # asked for by name and unavailable here: nothing was checked, so the check fails
    unavailable = table["planted_unavailable"]["-"]
    assert (unavailable["status"], unavailable["reason"]) == ("FAIL", "unavailable: package planted_ext not installed")
    assert "FAIL" in r.stdout and "planted_off_by_one" in r.stdout
    # a payload the backend does not carry: skipped with that reason, not failed, not timed
    limited = table["planted_bf16_only"]
    for case, dtype in (("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("fp8", "fp8_e4m3")):
        assert (limited[case]["status"], limited[case]["reason"]) == ("skip", f"does not carry {dtype}")
    assert limited["uniform"]["status"] == "ok"


def test_an_unknown_backend_is_a_one_line_usage_error(tmp_path):
    r, _ = a2a_check(tmp_path, "--backend", "no_such_backend")
    assert r.returncode == 2
    assert "no_such_backend" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_virtual_ranks_run_the_cases_in_one_process_and_a_planted_kernel_bug_fails(tmp_path):
    """--virtual --device cpu: 3 virtual ranks under Triton's interpreter (token counts / 64);
    the shipped one-sided kernels pass, a copy of them with a row dropped fails, a backend that
    needs ranks of its own is skipped."""
    r, rows = a2a_check(
        tmp_path,
        "--virtual",
        *("--backend", "nvlink_one_sided", "--backend", "planted_kernel_drops_row"),
        env_extra={"A2A_TUNE_BACKEND_MODULES": "planted_kernels"},
        world=3,
        experts=12,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "each case ran on 3 virtual ranks of one cpu device" in " ".join(r.stdout.split())
    assert "on 3 virtual ranks of one cpu device, 1 shape(s), token counts x 0.015625" in " ".join(r.stdout.split())
    table = by_backend(rows)
    assert all(row["virtual"] for row in rows)
    shipped = table["nvlink_one_sided"]
    quantized = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4", "mxfp8": "mxfp8"}
    for case in INVARIANT_CASES | set(quantized):
        assert shipped[case]["status"] == "ok", shipped[case]
        assert shipped[case]["max_rel_error"] <= TOLERANCE[quantized.get(case, "bf16")]
    assert shipped["uniform"]["tokens"] == [2, 1, 2] and shipped["skewed-zero"]["tokens"] == [0, 5, 0]
    assert shipped["graph-replays"]["status"] == "skip"
    planted = table["planted_kernel_drops_row"]
    for case in ("uniform", "skewed-zero", "repeated", "fp8", "steps"):  # a rank holds a token 1
        assert planted[case]["status"] == "FAIL" and planted[case]["reason"].startswith("incorrect: rank "), planted
    assert planted["local"]["status"] == "ok"  # one token per rank: the planted bug never triggers


def test_virtual_ranks_skip_backends_that_need_ranks_of_their_own_and_refuse_bad_worlds(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 96}))
    base = [sys.executable, "-m", "a2a_tune.tuner.cli", "check", "--device", "cpu", "--virtual", "--no-progress"]
    r = subprocess.run([*base, "--world", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().endswith("--world must be 2..1024 with --virtual, got 1")
    r = subprocess.run(
        [*base, "--backend", "nccl_all2allv", "--model-config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},  # the reason on one line of the table
    )
    assert r.returncode == 1 and "needs a process per rank (collectives), so not on virtual ranks" in r.stdout
