"""The invariant over NCCL on real GPUs (2 ranks): every backend, every preset shape.

Runs only where at least 2 CUDA GPUs are visible (`pytest -m gpu`); skipped elsewhere.
"""

from __future__ import annotations

import pytest

from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.shapes import presets

from test_backends import REAL_BACKENDS, Case, _cases_w2, _run_cases

pytestmark = pytest.mark.gpu


def _gpu_cases() -> list[Case]:
    cases = list(_cases_w2())
    for b in REAL_BACKENDS:
        for p in presets().values():
            cases += [
                Case(f"{b}-{p.name}-uniform", b, (128, 77), p.num_experts, p.topk, p.hidden, "bf16"),
                Case(f"{b}-{p.name}-skewed-zero", b, (0, 300), p.num_experts, p.topk, p.hidden, "bf16", "skewed"),
                Case(f"{b}-{p.name}-large-repeated", b, (4096, 4096), p.num_experts, p.topk, p.hidden, "bf16", repeats=3),
            ]
    return cases


@pytest.fixture(scope="module")
def gpu_results():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
        return run_ranks(_run_cases, 2, "cuda", _gpu_cases())[0]


@pytest.mark.parametrize("case", [c for c in _gpu_cases() if not c.id.startswith("planted")], ids=lambda c: c.id)
def test_invariant_holds_over_nccl(gpu_results, case):
    ok, err, reason, _ = gpu_results[case.id]
    assert ok, reason


@pytest.mark.parametrize("planted", ["planted_off_by_one", "planted_double_weights", "planted_crash"])
def test_planted_bugs_fail_over_nccl(gpu_results, planted):
    assert not gpu_results[planted][0]
