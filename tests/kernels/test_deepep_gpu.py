"""DeepEP's and torch's NVSHMEM backends on real GPUs (2 ranks): the invariant for every preset
shape, skewed routing with a rank of zero tokens, repeated calls, block-FP8 payloads, and the
capturable ones replayed from a captured CUDA graph.

Runs only where at least 2 CUDA GPUs are visible and the backend is available (DeepEP staged
by scripts/stage_deepep.py on PYTHONPATH; torch with NVSHMEM); skipped elsewhere. Each
backend runs in ranks of its own: DeepEP's low-latency buffer and torch's symmetric memory
both initialise NVSHMEM, and torch's symmetric-memory backend is chosen once per process.
"""

from __future__ import annotations

import pytest
import torch
from invariant_cases import Case, run_cases

from a2a_tune.kernels import BackendEnv, MoEShape, get_backend
from a2a_tune.kernels.reference import graph_replay_error
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.shapes import presets

pytestmark = pytest.mark.gpu

BACKENDS = ["deepep_high_throughput", "deepep_low_latency", "torch_nvshmem_all2all"]


def _cases(name: str) -> list[Case]:
    cls = get_backend(name)
    large = 1024 if name == "deepep_low_latency" else 4096
    cases = []
    for p in presets().values():
        for dtype in ("bf16", "fp8_e4m3"):
            for tag, tokens, routing, repeats in [
                ("uniform", (128, 77), "uniform", 1),
                ("skewed-zero", (0, 300), "skewed", 1),
                ("large-repeated", (large, large), "uniform", 3),
            ]:
                case = Case(
                    f"{name}-{p.name}-{dtype}-{tag}",
                    name,
                    tokens,
                    p.num_experts,
                    p.topk,
                    p.hidden,
                    dtype,
                    routing=routing,
                    repeats=repeats,
                )
                shape = MoEShape(p.num_experts, p.topk, p.hidden, max(tokens), dtype)
                if cls.feasibility(shape, 2).ok:
                    cases.append(case)
    if name == "deepep_high_throughput":  # a setting of DeepEP's Config other than its defaults
        knobs = {"num_sms": 32, "dispatch_send_tokens": 8, "combine_recv_tokens": 512}
        cases.append(Case(f"{name}-knobs", name, (300, 100), 256, 8, 7168, "bf16", knobs=knobs))
    if name == "deepep_low_latency":  # an engine's capacity above the step's tokens
        cases.append(
            Case(f"{name}-capacity-above-tokens", name, (5, 60), 256, 8, 7168, "bf16", capacity=256, repeats=2)
        )
    return cases


def _work(ctx, name: str, cases: list[Case]):
    graphs = {}
    if get_backend(name).graph_capturable:
        for cap in (64, 256):
            backend = get_backend(name)(ctx.group, MoEShape(256, 8, 7168, cap, "bf16"), ctx.device)
            try:
                graphs[cap] = graph_replay_error(backend, 64, 20)
            finally:
                backend.close()
    return run_cases(ctx, cases), graphs


_results: dict[str, tuple] = {}


def _results_for(name: str):
    if torch.cuda.device_count() < 2:
        pytest.skip(
            "needs 2 CUDA GPUs; on one GPU only deepep_low_latency runs (1 rank: test_virtual_gpu.py, "
            "scripts/peers_one_rank.py); high-throughput ('Unsupported ranks') and torch's NVSHMEM refuse one rank"
        )
    ok, reason = get_backend(name).availability(BackendEnv.local(2, "cuda"))
    if not ok:
        pytest.skip(f"{name}: {reason}")
    if name not in _results:
        _results[name] = run_ranks(_work, 2, "cuda", name, _cases(name))[0]
    return _results[name]


@pytest.mark.parametrize("case", [c for n in BACKENDS for c in _cases(n)], ids=lambda c: c.id)
def test_invariant_holds_on_gpus(case):
    ok, err, reason, _ = _results_for(case.backend)[0][case.id]
    assert ok, reason


@pytest.mark.parametrize("name", [n for n in BACKENDS if get_backend(n).graph_capturable])
@pytest.mark.parametrize("capacity", [64, 256])
def test_graph_replays_stay_correct_without_host_barriers(name, capacity):
    assert _results_for(name)[1][capacity] < 2.5e-2
