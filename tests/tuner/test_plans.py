"""tuner.plans: options -> the sweep plan, refused whole (one line) before any rank starts.
No typer and no ranks here: the plan is built and judged in this process."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from a2a_tune.tuner import plans
from a2a_tune.tuner.plans import PlanError, SweepOptions, SweepPlan, build_plan, check_plan, parse_tokens
from a2a_tune.tuner.runtime.point import MAX_TOKENS_PER_RANK
from a2a_tune.tuner.shapes import ModelShape, preset

GiB = 2**30
ROOMY = (64 * GiB, "test budget")


def cpu(**over) -> SweepOptions:
    return SweepOptions(**{"device": "cpu", "world": 2, "preset": ["mixtral-8x7b"], "tokens": "1,8", **over})


def config(tmp_path, **numbers):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "test_moe", **numbers}))
    return path


def test_options_become_the_plan_the_command_line_always_built():
    plan, device, world = build_plan(cpu(backend=["allgather_reducescatter"]))
    assert (device, world) == ("cpu", 2)
    assert plan == SweepPlan(
        shapes=(preset("mixtral-8x7b"),),
        tokens=(1, 8),
        ep_sizes=(2,),
        backends=("allgather_reducescatter",),
        warmup=3,  # the cpu defaults
        iters=15,
        refine_ratio=None,  # off on cpu unless --refine
    )
    assert list(plan.shapes_at(world)) == [("mixtral-8x7b", (2, 4096, 2, 8, "bf16", "uniform"))]


def test_tokens_are_parsed_sorted_and_held_to_the_one_bound():
    assert parse_tokens("8, 1,4,8") == (1, 4, 8)
    for bad in ("0", f"1,{MAX_TOKENS_PER_RANK + 1}", "99999999999999999999"):
        with pytest.raises(PlanError, match=rf"^--tokens: tokens per rank must be in 1\.\.{MAX_TOKENS_PER_RANK}, got"):
            parse_tokens(bad)
    with pytest.raises(PlanError, match="comma-separated integers"):
        parse_tokens("1,x")
    assert parse_tokens(str(MAX_TOKENS_PER_RANK)) == (MAX_TOKENS_PER_RANK,)


def test_a_capacity_is_a_token_count_too():
    with pytest.raises(PlanError, match=rf"--capacity: .*must be in 1\.\.{MAX_TOKENS_PER_RANK}"):
        build_plan(cpu(capacity=MAX_TOKENS_PER_RANK + 1))
    with pytest.raises(PlanError, match="--capacity 4 is below the largest token count 8"):
        build_plan(cpu(capacity=4))


@pytest.mark.parametrize(
    "numbers, message",
    [
        # each number's bound: read with the config (test_shapes has every dimension)
        ({"num_local_experts": 10**9, "num_experts_per_tok": 2, "hidden_size": 4096}, "num_experts must be in 1..4096"),
        # a shape's relations, once its EP size is known
        ({"num_local_experts": 4, "num_experts_per_tok": 8, "hidden_size": 64}, "topk 8 is more than the 4 experts"),
        ({"num_local_experts": 3, "num_experts_per_tok": 1, "hidden_size": 64}, "3 experts do not divide over 2 ranks"),
    ],
)
def test_impossible_model_configs_are_refused_in_one_line(tmp_path, numbers, message):
    with pytest.raises(PlanError) as info:
        build_plan(SweepOptions(device="cpu", world=2, model_config=[config(tmp_path, **numbers)], tokens="1"))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_local_routing_needs_topk_within_one_ranks_experts():
    plan = SweepPlan(shapes=(ModelShape("m", 8, 4, 64),), tokens=(1,), ep_sizes=(2,), routings=("uniform", "local"))
    with pytest.raises(PlanError, match="'local' routing needs topk 4 <= the 2 experts of one rank"):
        check_plan(dataclasses.replace(plan, ep_sizes=(4,)), "cpu", 4, budget=ROOMY)
    check_plan(plan, "cpu", 2, budget=ROOMY)  # 4 experts per rank: fine


def test_a_case_that_cannot_fit_is_refused_naming_it_and_the_memory():
    # a token count inside the bound with a large hidden size: terabytes per rank
    big = SweepPlan(shapes=(ModelShape("wide", 8, 2, 65536),), tokens=(1, MAX_TOKENS_PER_RANK), ep_sizes=(2,))
    with pytest.raises(PlanError) as info:
        check_plan(big, "cpu", 2, budget=(8 * GiB, "8 GiB here"))
    text = str(info.value)
    assert text.startswith(f"wide bf16 uniform at {MAX_TOKENS_PER_RANK} tokens/rank: ")
    assert "would allocate about" in text and "more than the 8.0 GiB a rank has here (8 GiB here)" in text
    small = SweepPlan(shapes=(preset("mixtral-8x7b"),), tokens=(1, 4, 16, 64, 256), ep_sizes=(2,))
    check_plan(small, "cpu", 2, budget=(GiB, "1 GiB"))  # the cpu default grid fits in little
    check_plan(big, "cpu", 2, budget=(None, "unknown"))  # no figure for this host: bounds only


def test_the_memory_a_cpu_rank_has_is_the_hosts_shared_over_its_ranks(monkeypatch):
    import a2a_tune.tuner.launch as launch

    monkeypatch.setattr(launch, "host_memory_available", lambda: 8 * GiB)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    limit, why = plans.memory_per_rank("cpu", 4)
    assert (
        limit == 2 * GiB - launch.CPU_RANK_MEMORY_BYTES and why == "8.0 GiB available over 4 CPU rank(s) on this host"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # a torchrun job: only this host's ranks share it
    assert plans.memory_per_rank("cpu", 4)[0] == 4 * GiB - launch.CPU_RANK_MEMORY_BYTES
    # the command line's plan is judged against it
    monkeypatch.setattr(launch, "host_memory_available", lambda: GiB // 2)
    with pytest.raises(PlanError, match=r"more than the 0\.0 GiB a rank has here \(0\.5 GiB available over 2"):
        build_plan(cpu(tokens="1,65536"))


def test_gpu_memory_is_read_through_nvml_without_a_cuda_context(monkeypatch):
    import a2a_tune.tuner.nvml as nvml

    seen = []
    monkeypatch.setattr(nvml, "free_memory_bytes", lambda visible: seen.append(visible) or [80 * GiB, 20 * GiB])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    limit, why = plans.memory_per_rank("cuda", 2)
    assert seen == ["3,1"] and limit == 20 * GiB - plans.GPU_RANK_RESERVE_BYTES and "20.0 GiB free" in why
    monkeypatch.setattr(nvml, "free_memory_bytes", lambda visible: None)
    assert plans.memory_per_rank("cuda", 2)[0] is None  # no NVML: bounds only


def test_impossible_plans_are_refused_quickly_without_allocating():
    """The caller checks the plan once, before any rank starts (the sweep takes it checked):
    an impossible shape, and terabytes per rank, are refused from arithmetic alone."""
    start = time.monotonic()
    for plan in (
        SweepPlan(shapes=(ModelShape("k9", 8, 9, 64),), tokens=(1,), ep_sizes=(2,)),
        SweepPlan(shapes=(ModelShape("wide", 8, 2, 65536),), tokens=(MAX_TOKENS_PER_RANK,), ep_sizes=(2,)),
    ):
        with pytest.raises(PlanError):
            check_plan(plan, "cpu", 2)
    assert time.monotonic() - start < 30


def test_a_backend_asked_for_that_carries_none_of_the_payloads_is_one_line():
    from a2a_tune.tuner.plans import PlanError, check_backends

    with pytest.raises(
        PlanError, match=r"^deepep_low_latency does not carry nvfp4 or mxfp8 \(it carries bf16, fp8_e4m3\)$"
    ):
        check_backends(["deepep_low_latency"], ["nvfp4", "mxfp8"])
    check_backends(["deepep_low_latency"], ["nvfp4", "bf16"])  # one it carries: the other is skipped, said so
    check_backends(["nccl_all2allv"], ["nvfp4"])


def test_the_default_shapes_are_the_shipped_tables_four_and_any_preset_can_be_named():
    """Twelve presets, four by default: a run over EP 2, 4 and 8 stays within 3x the single-size run."""
    from a2a_tune.tuner.plans import model_shapes
    from a2a_tune.tuner.shapes import DEFAULT_PRESETS, presets

    assert [s.name for s in model_shapes([], [])] == list(DEFAULT_PRESETS)
    assert set(DEFAULT_PRESETS) < set(presets())
    assert [s.name for s in model_shapes(["qwen3.5-397b-a17b"], [])] == ["qwen3.5-397b-a17b"]
