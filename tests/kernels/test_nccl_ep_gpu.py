"""NCCL EP's and DeepEP V2's backends at one rank on one GPU: the invariant holds, or the library
refuses in one line; never a crash. Needs them staged and the staged NCCL preloaded
(scripts/stage_nccl_ep.py; scripts/nccl_ep_one_gpu.sh runs this file). Not yet seen passing:
BENCHMARKS.md, "NCCL EP and DeepEP V2" (the first H100 call found two bugs, fixed since).
"""

from __future__ import annotations

import pytest
import torch
from invariant_cases import Case, run_cases

from a2a_tune.kernels.deepep_v2 import deepep_v2_missing
from a2a_tune.kernels.nccl_ep import nccl_ep_package, nccl_requirement
from a2a_tune.tuner.launch import run_ranks

pytestmark = pytest.mark.gpu


def _why_not(name: str) -> str:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if name.startswith("nccl_ep"):
        missing = "" if nccl_ep_package() else "nccl.ep not staged (scripts/stage_nccl_ep.py)"
    else:
        missing = deepep_v2_missing()
    return missing or nccl_requirement(name)


@pytest.mark.parametrize(
    "name", ["nccl_ep_low_latency", "nccl_ep_high_throughput", "deepep_v2_low_latency", "deepep_v2_high_throughput"]
)
def test_at_one_rank_the_invariant_holds_or_the_library_refuses_in_one_line(name):
    why = _why_not(name)
    if why:
        pytest.skip(why)
    cases = [
        Case(f"{name}-1rank", name, (78,), 256, 8, 7168, "bf16", capacity=128, repeats=2),
        Case(f"{name}-1rank-fp8", name, (64,), 256, 8, 7168, "fp8_e4m3", capacity=128),
    ]
    results = run_ranks(run_cases, 1, "cuda", cases)[0]
    for case in cases:
        ok, _, reason, _ = results[case.id]
        assert ok or reason.startswith("construction: "), f"{case.id}: {reason}"
        print(f"{case.id}: {'invariant holds' if ok else 'refused: ' + reason}")
