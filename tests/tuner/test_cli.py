"""The command line as a user runs it: real subprocesses, real exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import paths
import pytest
from run_cli import a2a

from a2a_tune.tuner.runtime.measurement import Measurement

CPU_BACKENDS = {"allgather_reducescatter", "allgather_reducescatter_padded", "nccl_all2allv"}
# `lookup` for the shape the finished run measured (Mixtral on 2 ranks)
MIXTRAL_EP2 = "lookup --ep-size 2 --hidden 4096 --topk 2 --experts 8"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """`a2a-tune run` on 2 CPU ranks, small: the README's main job in miniature."""
    root = tmp_path_factory.mktemp("cli")
    env = {"XDG_DATA_HOME": str(root / "xdg")}
    args = "run --device cpu --world 2 --preset mixtral-8x7b --tokens 1,8,32 --warmup 1 --iters 3 --no-progress"
    r = a2a(*args.split(), "--db", str(root / "t.db"), env_extra=env, cwd=root)
    return root, env, r


def test_run_writes_a_table_the_lookup_finds_by_fingerprint(finished_run):
    root, env, r = finished_run
    assert r.returncode == 0, r.stderr
    assert "9 measured" in r.stdout and "(completed)" in r.stdout  # 3 token counts x 3 CPU backends
    table = root / "xdg" / "a2a-tune" / "profiles" / "cpu-x86_64.node1.json"
    if not table.exists():  # another architecture: find the one file written
        (table,) = (root / "xdg" / "a2a-tune" / "profiles").glob("cpu-*.json")
    profile = json.loads(table.read_text())
    assert profile["schema"] == 4 and profile["entries"][0]["tokens"] == [1, 8, 32]
    assert {c["timing"] for c in profile["entries"][0]["backends"].values()} == {"eager"}

    look = a2a(*f"{MIXTRAL_EP2} --tokens 16".split(), env_extra=env)
    assert look.returncode == 0, look.stderr
    assert look.stdout.strip() in CPU_BACKENDS
    assert look.stderr.startswith("exact:")

    as_json = json.loads(a2a(*f"{MIXTRAL_EP2} --tokens 16 --format json".split(), env_extra=env).stdout)
    assert as_json["match"] == "exact" and set(as_json["expected_us"]) == CPU_BACKENDS


def test_vllm_format_only_prints_a_literal_vllm_accepts(finished_run):
    root, env, _ = finished_run
    r = a2a(*f"{MIXTRAL_EP2} --tokens 8 --format vllm".split(), env_extra=env)
    assert r.returncode == 0
    assert r.stdout.strip() == "--all2all-backend allgather_reducescatter"  # nccl_all2allv has no vLLM literal


def test_select_again_from_the_database(finished_run, tmp_path):
    root, env, _ = finished_run
    r = a2a("select", "--db", str(root / "t.db"), "--out", str(tmp_path), env_extra=env)
    assert r.returncode == 0, r.stderr
    (again,) = tmp_path.glob("cpu-*.json")
    assert r.stdout.strip() == f"wrote {again} (1 shape(s)) from run 1"
    # The same measurements give the same table as `run` wrote, but for when it was written.
    first = json.loads((root / "xdg" / "a2a-tune" / "profiles" / again.name).read_text())
    table = json.loads(again.read_text())
    assert table.pop("generated_at") >= first.pop("generated_at") and table == first
    (entry,) = table["entries"]
    shape = dict(ep_size=2, hidden=4096, topk=2, num_experts=8, dtype="bf16", routing="uniform")
    assert {k: entry[k] for k in shape} == shape and entry["tokens"] == [1, 8, 32]
    assert set(entry["backends"]) == CPU_BACKENDS  # the GPU backends: unavailable, said in `failed`
    assert all(
        f["kind"] == "unavailable" and f["reason"].startswith("needs CUDA GPUs") for f in entry["failed"].values()
    )
    assert [w["backend"] in CPU_BACKENDS for w in entry["winners"]] == [True] * 3
    assert all(len(c["median_us"]) == 3 and None not in c["median_us"] for c in entry["backends"].values())


def small_sweep(db, *backends: str, iters: int = 2, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`a2a-tune sweep` of `backends` on 2 CPU ranks at one point of one preset."""
    args = ["--device", "cpu", "--preset", "mixtral-8x7b", "--tokens", "1", "--iters", str(iters), "--warmup", "0"]
    for b in backends:
        args += ["--backend", b]
    return a2a("sweep", *args, "--db", str(db), "--no-progress", env_extra=env_extra)


def test_resume_of_a_completed_plan_measures_again_into_a_new_run(finished_run):
    root, env, _ = finished_run
    r = small_sweep(root / "t.db", "nccl_all2allv", env_extra=env)
    assert r.returncode == 0, r.stderr
    assert "run 2 (completed)" in r.stdout and "1 measured" in r.stdout


# A tiny lookup shape, then what each case adds.
_LOOKUP = "lookup --ep-size 2 --hidden 1 --topk 1 --experts 2"


@pytest.mark.parametrize(
    "args, message",
    [
        ("sweep --device cpu --preset llama", "unknown model preset 'llama'"),
        ("sweep --device cpu --backend deepep", "unknown backend 'deepep'"),
        ("sweep --device cpu --tokens 1,x", "--tokens must be comma-separated integers"),
        ("sweep --device cpu --world 1", "--world must be at least 2"),
        ("sweep --device cpu --dtype int3", "unknown --dtype 'int3'"),
        (f"{_LOOKUP} --tokens 1 --format x", "--format must be"),
        (_LOOKUP, "give exactly one of --tokens, --phase or --workload (got none)"),
        (
            f"{_LOOKUP} --tokens 1 --phase decode",
            "give exactly one of --tokens, --phase or --workload (got --tokens, --phase)",
        ),
        (f"{_LOOKUP} --phase decode", "--phase decode needs --max-batch N"),
        (f"{_LOOKUP} --phase decode --max-tokens 8", "--max-tokens goes with --phase prefill"),
        (f"{_LOOKUP} --phase mixed", "--phase must be decode or prefill"),
        (f"{_LOOKUP} --phase prefill --max-tokens 0", "--max-tokens: tokens per rank must be in 1..1048576, got 0"),
        # the shape follows lookup's request rules too: refused, not answered with the fallback
        ("lookup --ep-size 2 --hidden 0 --topk 1 --experts 2 --tokens 1", "--hidden must be >= 1, got 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = a2a(*args.split())
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


def test_db_upgrade_of_a_file_that_does_not_exist_is_refused(tmp_path):
    missing = tmp_path / "tpyo.db"
    r = a2a("db", "upgrade", "--db", str(missing))
    assert r.returncode == 2 and r.stdout == ""
    assert (
        " ".join(r.stderr.split())
        == f"error: no database at {missing}: nothing to upgrade (a sweep creates its store when it starts)"
    )
    assert list(tmp_path.iterdir()) == []  # upgrading nothing created nothing


FIXTURE_ENV = {
    "A2A_TUNE_PROFILE_DIR": str(paths.FIXTURES / "profiles"),
    "A2A_TUNE_FINGERPRINT": "test.fixture.node1",
}
SHAPE_A = ("--ep-size", "2", "--hidden", "7168", "--topk", "8", "--experts", "256")


def test_lookup_per_phase_for_disaggregated_engines():
    decode = a2a("lookup", *SHAPE_A, "--phase", "decode", "--max-batch", "64", env_extra=FIXTURE_ENV)
    prefill = a2a("lookup", *SHAPE_A, "--phase", "prefill", "--max-tokens", "1024", env_extra=FIXTURE_ENV)
    assert (decode.returncode, prefill.returncode) == (0, 0), decode.stderr + prefill.stderr
    assert (decode.stdout.strip(), prefill.stdout.strip()) == ("nvlink_one_sided", "nccl_all2allv")
    assert "decode: tokens/rank 1..64 log-uniform" in decode.stderr


def test_lookup_workload_json_output_has_regrets(tmp_path):
    w = tmp_path / "steps.csv"
    w.write_text("tokens,steps\n1,300\n64,100\n")
    r = a2a("lookup", *SHAPE_A, "--workload", str(w), "--format", "json", env_extra=FIXTURE_ENV)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend"] == "nvlink_one_sided" and out["phase"] == "workload"
    assert out["alternatives"] == {"allgather_reducescatter": 0.7273, "nccl_all2allv": 0.9091}


@pytest.mark.parametrize(
    "fmt, expected",
    [
        ("vllm", "--all2all-backend allgather_reducescatter"),  # nvlink_one_sided: no vLLM literal
        ("sglang", "--moe-a2a-backend none"),
        ("name", "nvlink_one_sided"),
    ],
)
def test_lookup_engine_formats_print_only_accepted_literals(fmt, expected):
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--format", fmt, env_extra=FIXTURE_ENV)
    assert r.returncode == 0 and r.stdout.strip() == expected, r.stderr


def test_lookup_trtllm_format_leaves_tensorrt_llm_its_own_choice_without_a_method():
    # The fixture table names no TensorRT-LLM method: nothing to force, one warning why.
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--format", "trtllm", env_extra=FIXTURE_ENV)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "no usable backend that TensorRT-LLM accepts;" in line and line.endswith(
        "TensorRT-LLM keeps its own choice (no TRTLLM_FORCE_COMM_METHOD)"
    )
    sh = subprocess.run(
        ["env", *r.stdout.split(), "sh", "-c", 'echo "[$TRTLLM_FORCE_COMM_METHOD]"'], capture_output=True
    )
    assert sh.stdout == b"[]\n"  # `env $(a2a-tune lookup ... --format trtllm) trtllm-serve ...` still starts


def test_lookup_preset_fills_the_shape_and_vs_default_is_in_the_engines_units():
    """--preset deepseek-v3: hidden 7168, top-k 8, 256 experts, 58 MoE layers. The fixture's decode
    answer (nvlink_one_sided 26.502 us) against vLLM's default (allgather_reducescatter 41.791 us)."""
    r = a2a(
        "lookup",
        "--ep-size",
        "2",
        "--preset",
        "deepseek-v3",
        "--phase",
        "decode",
        "--max-batch",
        "64",
        "--tpot-ms",
        "29.2",
        "--format",
        "json",
        env_extra=FIXTURE_ENV,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["entry_shape"]["hidden"] == 7168 and out["backend"] == "nvlink_one_sided"
    vs = out["vs_default"]
    assert (vs["engine"], vs["engine_default"], vs["moe_layers"]) == ("vllm", "allgather_reducescatter", 58)
    assert vs["saving_us_per_layer"] == pytest.approx(41.791 - 26.502, abs=1e-3)
    assert vs["saving_ms_per_step"] == pytest.approx(vs["saving_us_per_layer"] * 58 / 1000, abs=1e-4)
    assert vs["share_of_tpot"] == pytest.approx(vs["saving_ms_per_step"] / 29.2, abs=1e-4)
    # --moe-layers wins over the preset's; the other formats say it on stderr
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--moe-layers", "10", env_extra=FIXTURE_ENV)
    assert r.returncode == 0 and "ms per step vs vLLM's default (allgather_reducescatter) (10 MoE layers)" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("--preset", "no-such-model"), "unknown model preset 'no-such-model'; known: deepseek-v3"),
        (("--hidden", "7168"), "give --topk, --experts, or --preset NAME"),
        (("--preset", "deepseek-v3", "--hidden", "7000", "--dtype", "nvfp4"), "nvfp4 needs hidden divisible"),
    ],
)
def test_lookup_bad_shape_options_are_one_line(args, message):
    r = a2a("lookup", "--ep-size", "2", "--tokens", "64", *args, env_extra=FIXTURE_ENV)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# The shipped 2xH200 table, DeepSeek-V3's block-FP8 shape, a decode engine of max batch 64:
# ours (nvlink_one_sided) is fastest; each engine gets the fastest it can be told.
SHIPPED = {"A2A_TUNE_FINGERPRINT": "h200.nvl18x2.node1"}
DSV3_DECODE = ("--ep-size", "2", "--hidden", "7168", "--topk", "8", "--experts", "256", "--dtype", "fp8_e4m3")
DSV3_DECODE += ("--phase", "decode", "--max-batch", "64")


@pytest.mark.parametrize(
    "fmt, expected",
    [
        ("name", "nvlink_one_sided"),
        ("vllm", "--all2all-backend flashinfer_nvlink_one_sided"),
        ("sglang", "--moe-a2a-backend flashinfer"),
        ("trtllm", "TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED"),
    ],
)
def test_lookup_engine_formats_on_the_shipped_table(fmt, expected):
    r = a2a("lookup", *DSV3_DECODE, "--format", fmt, env_extra=SHIPPED)
    assert r.returncode == 0 and r.stdout.strip() == expected, r.stderr


@pytest.mark.parametrize(
    "facts, fmt, expected",
    [
        (("--lora",), "vllm", "--all2all-backend allgather_reducescatter"),
        (("--platform", "cuda:8.9", "--quantization", "none"), "vllm", "--all2all-backend allgather_reducescatter"),
        (("--platform", "rocm"), "vllm", "--all2all-backend allgather_reducescatter"),
        (("--moe-runner", "triton"), "sglang", "--moe-a2a-backend none"),
        (("--moe-tp-size", "2"), "trtllm", ""),
        (
            ("--platform", "cuda:9.0", "--no-lora", "--pipeline-size", "2"),
            "vllm",
            "--all2all-backend flashinfer_nvlink_one_sided",
        ),
    ],
)
def test_lookup_knows_the_deployment(facts, fmt, expected):
    """A backend the engine cannot start with in the deployment never competes (engine_rules)."""
    r = a2a("lookup", *DSV3_DECODE, *facts, "--format", fmt, env_extra=SHIPPED)
    assert r.returncode == 0 and r.stdout.strip() == expected, r.stderr
    r = a2a("lookup", *DSV3_DECODE, *facts, "--format", "json", env_extra=SHIPPED)
    excluded = json.loads(r.stdout)["excluded"]
    assert set(excluded) == {"vllm", "sglang", "trtllm"}
    if expected != SHIPPED_LINES[fmt]:  # each refused literal is listed with its rule
        assert excluded[fmt] and all(set(v) == {"rule", "why"} for v in excluded[fmt].values())


SHIPPED_LINES = {
    "vllm": "--all2all-backend flashinfer_nvlink_one_sided",
    "sglang": "--moe-a2a-backend flashinfer",
    "trtllm": "TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED",
}


@pytest.mark.parametrize(
    "facts, words",
    [
        (("--platform", "gpu"), "--platform must be cuda or cuda:MAJOR.MINOR or rocm or cpu, got 'gpu'"),
        (("--quantization", "int3"), "--quantization must be none or fp8_block"),
        (("--pipeline-size", "0"), "--pipeline-size must be >= 1, got 0"),
    ],
)
def test_lookup_refuses_a_bad_deployment_fact_in_one_line(facts, words):
    r = a2a("lookup", *DSV3_DECODE, *facts, env_extra=SHIPPED)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_backends_states_what_each_engine_can_start_with():
    r = a2a("backends", "--device", "cpu", "--json")
    rules = json.loads(r.stdout)["engine_rules"]
    assert {"vllm", "sglang", "trtllm"} == {x["engine"] for x in rules}
    lora = next(x for x in rules if x["rule"] == "lora_ep")
    assert "flashinfer_nvlink_one_sided" in lora["backends"] and lora["source"].endswith("FusedMoEWithLoRA._ep_check")


def test_lookup_env_format_is_shell_lines(tmp_path):
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--format", "env", env_extra=FIXTURE_ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "export A2A_TUNE_BACKEND=nvlink_one_sided",
        "export A2A_TUNE_VLLM_ALL2ALL_BACKEND=allgather_reducescatter",
        "export A2A_TUNE_SGLANG_MOE_A2A_BACKEND=none",
        "export A2A_TUNE_SGLANG_ARGS='--moe-a2a-backend none'",
        "export A2A_TUNE_MATCH=exact",
    ]
    assert "a2a-tune:" not in r.stderr  # engines without a literal here are no warning
    sh = subprocess.run(
        ["bash", "-c", 'eval "$(cat)"; echo $A2A_TUNE_BACKEND'], input=r.stdout, capture_output=True, text=True
    )
    assert sh.stdout.strip() == "nvlink_one_sided"
    r = a2a("lookup", *DSV3_DECODE, "--format", "env", env_extra=SHIPPED)
    assert "export TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED" in r.stdout.splitlines()


def test_lookup_workspace_budget_reaches_every_paste_line():
    """The fixture's nvlink_one_sided holds 3072 MiB per rank: a 1024 MiB budget, given or from
    $A2A_TUNE_MAX_WORKSPACE_MIB, leaves it out of every format, and stderr says so."""
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--max-workspace-mib", "1024", env_extra=FIXTURE_ENV)
    assert r.returncode == 0 and r.stdout.strip() == "nccl_all2allv", r.stderr  # 75 us; nvlink_one_sided 50
    assert r.stderr.strip().endswith("workspace budget 1024 MiB: skipped nvlink_one_sided (3072 MiB)")
    budget = {**FIXTURE_ENV, "A2A_TUNE_MAX_WORKSPACE_MIB": "1024"}
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--format", "env", env_extra=budget)
    assert "export A2A_TUNE_BACKEND=nccl_all2allv" in r.stdout.splitlines(), r.stderr
    as_json = json.loads(a2a("lookup", *SHAPE_A, "--tokens", "64", "--format", "json", env_extra=budget).stdout)
    assert (as_json["backend"], as_json["over_budget"]) == ("nccl_all2allv", {"nvlink_one_sided": 3072.0})
    r = a2a("lookup", *SHAPE_A, "--tokens", "64", "--max-workspace-mib", "-1", env_extra=FIXTURE_ENV)
    assert r.returncode == 2 and "--max-workspace-mib" in r.stderr


def test_lookup_with_a_bad_workload_file_still_prints_the_default(tmp_path):
    w = tmp_path / "w.json"
    w.write_text('{"1": "many"}')
    r = a2a("lookup", *SHAPE_A, "--workload", str(w), "--format", "vllm", env_extra=FIXTURE_ENV)
    assert r.returncode == 0 and r.stdout.strip() == "--all2all-backend allgather_reducescatter"
    assert len(r.stderr.strip().splitlines()) == 1 and str(w) in r.stderr and "weight must be" in r.stderr


def test_lookup_with_a_garbled_table_falls_back_with_one_warning(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": 1, "entries": [')
    r = a2a("lookup", "--profile", str(bad), *"--ep-size 2 --hidden 64 --topk 2 --experts 8 --tokens 4".split())
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


def test_evaluate_reports_the_tables_regret_on_held_out_points(finished_run):
    root, env, _ = finished_run
    (table,) = (root / "xdg" / "a2a-tune" / "profiles").glob("cpu-*.json")
    r = a2a(
        "evaluate",
        "--profile",
        str(table),
        "--device",
        "cpu",
        "--db",
        str(root / "t.db"),
        "--warmup",
        "0",
        "--iters",
        "3",
        "--no-progress",
        env_extra=env,
    )
    assert r.returncode == 0, r.stderr
    assert "at 2 held-out token counts" in r.stdout  # midpoints of 1, 8, 32: 3 and 16
    assert "table" in r.stdout and "always allgather_reducescatter" in r.stdout and "mean regret" in r.stdout


def test_evaluate_scores_a_table_on_a_stored_run_without_measuring(finished_run):
    root, env, _ = finished_run
    (table,) = (root / "xdg" / "a2a-tune" / "profiles").glob("cpu-*.json")
    r = a2a("evaluate", "--profile", str(table), "--db", str(root / "t.db"), "--run", "1", env_extra=env)
    assert r.returncode == 0, r.stderr
    assert "run 1 (stored)" in r.stdout and "sweeping" not in r.stdout
    (row,) = [line for line in r.stdout.splitlines() if line.strip("│┃ ").startswith("table ")]
    mean, worst = (float(cell.strip(" %")) for cell in row.split("│")[2:4])
    # on its own measurements the table loses only where it called a tie (within 3%)
    assert 0.0 <= mean <= worst <= 3.0, row

    missing = a2a("evaluate", "--profile", str(table), "--db", str(root / "t.db"), "--run", "99", env_extra=env)
    assert (
        missing.returncode == 2 and "run 99 could not be read" in missing.stderr and "Traceback" not in missing.stderr
    )


def test_replaying_a_stored_run_through_the_adaptive_search(finished_run, tmp_path):
    root, env, _ = finished_run
    script = str(paths.REPO / "bench" / "replay_adaptive.py")
    r = subprocess.run(
        [sys.executable, script, "--db", str(root / "t.db"), "--run", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stderr
    assert "of 9 measurements" in r.stdout and "scored on run 1" in r.stdout
    (table,) = tmp_path.glob("*.json")
    tokens = json.loads(table.read_text())["entries"][0]["tokens"]
    assert tokens[0] == 1 and tokens[-1] == 32 and set(tokens) <= {1, 8, 32}  # both ends, a subset between


def test_evaluate_rejects_a_broken_profile_in_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{")
    r = a2a("evaluate", "--profile", str(bad), "--device", "cpu")
    assert r.returncode == 2 and "invalid JSON" in r.stderr and "Traceback" not in r.stderr


def test_capacity_builds_fixed_capacity_backends_for_the_engines_largest_batch(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    common = (
        *"--device cpu --preset mixtral-8x7b --warmup 0 --iters 2 --no-progress".split(),
        *("--backend", "allgather_reducescatter_padded", "--db", str(tmp_path / "t.db")),
    )
    r = a2a("run", *common, "--tokens", "1,8", "--capacity", "32", "--out", str(tmp_path / "p"), env_extra=env)
    assert r.returncode == 0, r.stderr
    assert "2 measured" in r.stdout  # the invariant held with 1 and 8 tokens in 32-token slots
    (table,) = (tmp_path / "p").glob("*.json")
    assert json.loads(table.read_text())["run"]["capacity"] == 32

    small = a2a("sweep", *common, "--tokens", "1,8", "--capacity", "4", env_extra=env)
    assert small.returncode == 2 and "--capacity 4 is below the largest token count 8" in small.stderr


def test_a_plan_without_capacity_hashes_as_before_it_existed():
    from a2a_tune.tuner.shapes import preset
    from a2a_tune.tuner.sweep import SweepPlan

    plan = SweepPlan(shapes=(preset("mixtral-8x7b"),), tokens=(1, 8), ep_sizes=(2,))
    assert "capacity" not in plan.to_dict()  # resumable runs recorded before --capacity still match
    assert plan.capacity_for(0) == 1 and plan.capacity_for(8) == 8
    sized = SweepPlan(shapes=(preset("mixtral-8x7b"),), tokens=(1, 8), ep_sizes=(2,), capacity=64)
    assert sized.to_dict()["capacity"] == 64 and sized.capacity_for(8) == 64
    assert sized.config_hash("cpu", 2) != plan.config_hash("cpu", 2)


def test_version():
    from importlib.metadata import version

    r = a2a("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"a2a-tune {version('a2a-tune')}"


def _all_commands():
    import typer

    from a2a_tune.tuner.cli import app

    def walk(group, path):
        for name, cmd in group.commands.items():
            yield (*path, name)
            if hasattr(cmd, "commands"):
                yield from walk(cmd, (*path, name))

    return list(walk(typer.main.get_command(app), ()))


def test_no_help_text_shows_markup_escapes_or_cites_missing_files():
    from typer.testing import CliRunner

    from a2a_tune.tuner.cli import app

    runner = CliRunner()
    for command in [(), *_all_commands()]:
        text = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}).output
        assert "Usage:" in text, command
        assert "\\[" not in text and "\\]" not in text, (command, text)
        for cited in ("ARCHITECTURE", "STYLE.md"):  # design notes that ship outside the repository
            assert cited not in text, (command, cited)


def test_backends_at_80_columns_shows_every_name_whole():
    # The registry as the command sees it: this process may hold backends other tests planted.
    code = "import json; from a2a_tune.kernels import engine_names; print(json.dumps(engine_names()))"
    names = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)

    r = a2a("backends", "--device", "cpu", env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and max(map(len, r.stdout.splitlines())) <= 80
    words = set(re.findall(r"[\w.-]+", r.stdout))
    literals = {n for spec in names.values() for n in (spec["engines"]["vllm"], spec["closest"].get("vllm")) if n}
    assert set(names) | literals <= words


def test_a_sweep_counts_the_backends_it_can_run_and_keeps_each_line_whole(tmp_path):
    """Captured at 80 columns (a log, CI): the announcement counts what runs here, and a
    backend's reason wraps at spaces beside its whole name: no line over 80 (issue 37: 108)."""
    backends = ("allgather_reducescatter", "flashinfer_nvlink_one_sided", "deepep_low_latency")
    r = small_sweep(tmp_path / "s.db", *backends, iters=1, env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].strip() == "plan: 2 cpu rank(s)"
    (row,) = [line.split() for line in lines if line.split()[:1] == ["2"]]  # EP size 2, the world
    assert row == ["2", "1", "1", "1", "1", "(+2", "unavailable)", "1"]  # groups shapes tokens backends cases
    assert "  unavailable backends: `a2a-tune backends` says why" in lines
    from a2a_tune.kernels import BackendEnv, get_backend

    _, why = get_backend("flashinfer_nvlink_one_sided").availability(BackendEnv.local(2, "cpu"))
    assert len(f"  flashinfer_nvlink_one_sided: unavailable: {why}") > 80  # what one line would have been
    assert not [line for line in lines if len(line) > 80], [line for line in lines if len(line) > 80]
    (at,) = [i for i, line in enumerate(lines) if line.split()[:1] == ["flashinfer_nvlink_one_sided"]]
    said = " ".join(" ".join(lines[at : at + 3]).split()[1:])  # the reason, over its lines
    assert said.startswith(" ".join(f"unavailable: {why}".split()[:6])), said


# --------------------------------------------------------------- refused before any rank


def _capped(*args: str, env_extra: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """`a2a-tune` with its address space capped at 3 GiB (its ranks inherit the cap): a command
    that would allocate without bound fails here instead of waking the OOM killer."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # a tiny sweep runs in it

    env = {**os.environ, "COLUMNS": "200", **(env_extra or {})}
    cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, preexec_fn=cap)


@pytest.mark.parametrize(
    "numbers, tokens, message",
    [
        ({"num_local_experts": 10**9, "num_experts_per_tok": 2, "hidden_size": 4096}, "1", "num_experts must be in"),
        ({"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 10**9}, "1", "hidden must be in 1..65536"),
        ({"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 10**30}, "1", "hidden must be in 1..65536"),
        # inside every bound, but terabytes per rank at 2^20 tokens
        ({"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 65536}, "1048576", "would allocate about"),
        (
            {"num_local_experts": 4, "num_experts_per_tok": 8, "hidden_size": 64},
            "1",
            "topk 8 is more than the 4 experts",
        ),
        ({"num_local_experts": 3, "num_experts_per_tok": 1, "hidden_size": 64}, "1", "3 experts do not divide over 2"),
    ],
)
def test_impossible_shapes_are_refused_in_one_line_before_any_rank_starts(tmp_path, numbers, tokens, message):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "test_moe", **numbers}))
    db = tmp_path / "t.db"
    r = _capped(
        "sweep",
        "--device",
        "cpu",
        "--world",
        "2",
        "--model-config",
        str(config),
        "--tokens",
        tokens,
        "--backend",
        "allgather_reducescatter",
        "--db",
        str(db),
        "--no-progress",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "plan:" not in r.stdout and not db.exists()  # no rank started, no run opened


@pytest.mark.parametrize("tokens", [0, 2**20 + 1])
def test_one_token_bound_for_the_cli_the_store_the_table_and_lookup(tmp_path, tokens):
    """1..2^20 tokens per rank, checked by runtime.point.check_tokens wherever a count enters."""
    from bad_tables import fixture_data

    from a2a_tune.db import open_store
    from a2a_tune.tuner.runtime.lookup import lookup
    from a2a_tune.tuner.runtime.table import ProfileError, parse_profile

    said = f"must be in 1..1048576, got {tokens}"
    sweep = a2a("sweep", "--device", "cpu", "--tokens", f"1,{tokens}", "--db", str(tmp_path / "s.db"), "--no-progress")
    assert sweep.returncode == 2 and f"--tokens: tokens per rank {said}" in sweep.stderr
    looked = a2a("lookup", "--ep-size", "2", "--hidden", "64", "--topk", "2", "--experts", "8", "--tokens", str(tokens))
    assert looked.returncode == 2 and f"--tokens: tokens per rank {said}" in looked.stderr

    with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        hw = store.get_or_create_hardware("cpu-x86_64.node1", "f" * 64, {})
        run = store.start_run(
            hw, device_type="cpu", world_size=2, versions={}, git_sha=None, config={}, config_hash="c"
        )
        with pytest.raises(ValueError, match=said.replace(".", r"\.")):
            store.add_measurement(
                run,
                Measurement.from_columns(
                    dict(
                        backend="nccl_all2allv",
                        ep_size=2,
                        hidden=64,
                        topk=2,
                        num_experts=8,
                        dtype="bf16",
                        routing="uniform",
                        tokens_per_rank=tokens,
                        timing="eager",
                        median_us=1.0,
                        p10_us=1.0,
                        p90_us=1.0,
                        n=1,
                        samples=[1.0],
                    )
                ),
            )

    table = fixture_data()
    table["entries"][0]["tokens"][0] = tokens
    with pytest.raises(ProfileError) as info:
        parse_profile(table, "t.json")
    assert str(info.value) == f"t.json: entries[0].tokens[0]: tokens per rank {said}"

    choice = lookup(ep_size=2, hidden=7168, topk=8, num_experts=256, tokens=tokens, fingerprint="x.y", quiet=True)
    assert (
        choice.match == "fallback"
        and f"invalid lookup argument tokens={tokens} (tokens per rank {said})" in choice.reason
    )


def test_runs_closing_hint_is_a_lookup_the_table_answers(tmp_path):
    """Issue 37: `run --ep-sizes 2 --world 4 --preset mixtral-8x7b` ended with `lookup --ep-size 4
    --hidden H --topk K --experts E --tokens T`: an EP size not measured (following it gave the
    fallback), placeholders though the run had one preset. The hint is now a command that runs."""
    args = "run --device cpu --world 4 --ep-sizes 2 --preset mixtral-8x7b --tokens 1,8 --warmup 1 --iters 3"
    backends = ["--backend", "allgather_reducescatter", "--backend", "nccl_all2allv", "--no-progress"]
    r = a2a(*args.split(), *backends, "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "p"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (hint,) = [line for line in r.stdout.splitlines() if line.startswith("look it up: ")]
    words = hint.removeprefix("look it up: ").split()
    assert words[:4] == ["a2a-tune", "lookup", "--ep-size", "2"] and "--preset" in words, hint
    assert not {"H", "K", "E", "T"} & set(words), hint
    found = a2a(*words[1:], cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() in {"allgather_reducescatter", "nccl_all2allv"}, found.stdout
    assert found.stderr.startswith("exact") and "fallback" not in found.stderr, found.stderr


def test_dry_run_help_says_what_it_prints(tmp_path):
    """Issue 37: `run --help` said --dry-run prints shapes, token counts and backends; it prints
    how many of each. The help names what the plan's table shows, and the table shows it."""
    r = a2a("run", "--help", env_extra={"COLUMNS": "200"})
    said = " ".join(r.stdout.split())
    assert "how many shapes, token counts, backends" in said, said
    plan = a2a("run", "--device", "cpu", "--dry-run", "--db", str(tmp_path / "s.db"), env_extra={"COLUMNS": "80"})
    assert plan.returncode == 0, plan.stderr
    header = next(line for line in plan.stdout.splitlines() if "EP size" in line).split()
    assert header == ["EP", "size", "groups", "shapes", "tokens", "backends", "cases"]
    assert "estimated" in plan.stdout
