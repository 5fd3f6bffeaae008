"""The invariant over NCCL / NVLink on real GPUs (2 ranks): every backend, every preset shape,
and the graph-capturable backends replayed from a captured CUDA graph.

Runs only where at least 2 CUDA GPUs are visible (`pytest -m gpu`); skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from invariant_cases import REAL_BACKENDS, Case, cases_w2, conformance_cases, run_cases, with_planted_backends

from a2a_tune.kernels import MoEShape, get_backend
from a2a_tune.kernels._flashinfer import flashinfer_version
from a2a_tune.kernels.reference import graph_replay_error
from a2a_tune.tuner.shapes import presets

pytestmark = pytest.mark.gpu

# FlashInfer is optional: its backends are checked where it is installed (or staged on PYTHONPATH).
FLASHINFER = ["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"] if flashinfer_version() else []
NVLINK = ["nvlink_one_sided", "nvlink_low_latency", *FLASHINFER]  # carry block-FP8 payloads
GPU_BACKENDS = [*REAL_BACKENDS, *NVLINK]
GRAPH_BACKENDS = ["allgather_reducescatter_padded", *NVLINK]


def _gpu_cases() -> list[Case]:
    cases = list(cases_w2()) + cases_w2(["nvlink_one_sided", "nvlink_low_latency"])  # tiny odd shapes
    for b in GPU_BACKENDS:
        large = 1024 if b == "nvlink_low_latency" else 4096  # the low-latency slots' capacity
        for p in presets().values():
            cases += [
                Case(f"{b}-{p.name}-uniform", b, (128, 77), p.num_experts, p.topk, p.hidden, "bf16"),
                Case(f"{b}-{p.name}-skewed-zero", b, (0, 300), p.num_experts, p.topk, p.hidden, "bf16", "skewed"),
                Case(
                    f"{b}-{p.name}-large-repeated",
                    b,
                    (large, large),
                    p.num_experts,
                    p.topk,
                    p.hidden,
                    "bf16",
                    repeats=3,
                ),
            ]
            # an engine's capacity, a smaller step: step-sized backends move only the step's rows
            cases.append(
                Case(
                    f"{b}-{p.name}-step-below-capacity",
                    b,
                    (160, 97),
                    p.num_experts,
                    p.topk,
                    p.hidden,
                    "bf16",
                    repeats=2,
                    capacity=large,
                    step=192,
                )
            )
            fp8 = MoEShape(p.num_experts, p.topk, p.hidden, 256, "fp8_e4m3")
            if b in NVLINK and get_backend(b).feasibility(fp8, 2).ok:  # block-FP8: the NVLink backends
                cases.append(
                    Case(f"{b}-{p.name}-fp8", b, (256, 100), p.num_experts, p.topk, p.hidden, "fp8_e4m3", repeats=2)
                )
                cases.append(
                    Case(
                        f"{b}-{p.name}-fp8-step",
                        b,
                        (100, 64),
                        p.num_experts,
                        p.topk,
                        p.hidden,
                        "fp8_e4m3",
                        capacity=256,
                        step=128,
                    )
                )
    return cases


def _graph_replays(ctx, name: str, replays: int, capacity: int = 64) -> float:
    backend = get_backend(name)(ctx.group, MoEShape(256, 8, 7168, capacity, "bf16"), ctx.device)
    try:
        backend.set_step_tokens(64)  # below a larger capacity: the captured kernels use the step's rows
        return graph_replay_error(backend, 64, replays)
    finally:
        backend.close()


def _all_gpu_work(ctx, cases):
    graphs = {name: _graph_replays(ctx, name, 20) for name in GRAPH_BACKENDS}
    graphs.update({f"{name}-step": _graph_replays(ctx, name, 20, capacity=512) for name in GRAPH_BACKENDS})
    return run_cases(ctx, cases), graphs


@pytest.fixture(scope="module")
def gpu_results():
    if torch.cuda.device_count() < 2:
        pytest.skip(
            "needs 2 CUDA GPUs; on one GPU: test_virtual_gpu.py checks our NVLink kernels on 2-8 virtual ranks, "
            "and FlashInfer's backends at ep_size=1 (they run there: scripts/peers_one_rank.py, BENCHMARKS.md)"
        )
    return with_planted_backends(_all_gpu_work, 2, "cuda", _gpu_cases())


@pytest.mark.parametrize(
    "case",
    conformance_cases(_gpu_cases()),
    ids=lambda c: c.id,
)
def test_invariant_holds_on_gpus(gpu_results, case):
    ok, err, reason, _ = gpu_results[0][case.id]
    assert ok, reason


@pytest.mark.parametrize("planted", ["planted_off_by_one", "planted_double_weights", "planted_crash"])
def test_planted_bugs_fail_over_nccl(gpu_results, planted):
    assert not gpu_results[0][planted][0]


@pytest.mark.parametrize("name", GRAPH_BACKENDS + [f"{n}-step" for n in GRAPH_BACKENDS])
def test_graph_replays_stay_correct_without_host_barriers(gpu_results, name):
    assert gpu_results[1][name] < 2.5e-2
