"""The NVLink GPU tests (test_backends_gpu.py) on ONE GPU: W = 2, 3, 4, 8 virtual ranks of
nvlink_one_sided and nvlink_low_latency in one process (a2a_tune.kernels.virtual), bf16 and
block-FP8, eager and CUDA-graph replay of the whole W-rank sequence; planted kernel bugs
(tests/support/planted_kernels.py) fail them; a new count pattern compiles nothing. Beside them,
what the peers' backends can check on one GPU: DeepEP low-latency and FlashInfer's one- and
two-sided at ep_size = 1 (BENCHMARKS.md says what has run).

Runs where a CUDA GPU is visible (`pytest -m gpu`); NOT RUN on a GPU in the session that wrote it
(no device was lent: their CPU twin, tests/kernels/test_virtual.py, ran under the interpreter).
"""

from __future__ import annotations

import pytest
import torch
from invariant_cases import Case, run_cases
from virtual_work import Pattern, Replays, virtual_work

from a2a_tune.kernels._deepep import find_deepep
from a2a_tune.kernels._flashinfer import flashinfer_version
from a2a_tune.kernels.reference import TOLERANCE
from a2a_tune.tuner.launch import run_ranks

pytestmark = pytest.mark.gpu

NVLINK = ["nvlink_one_sided", "nvlink_low_latency"]
WORLDS = (2, 3, 4, 8)
DTYPES = ("bf16", "fp8_e4m3")
GiB = 1 << 30


def _experts(world: int) -> int:
    return 96 if world == 3 else 256  # DeepSeek-V3's 256 do not divide over 3 ranks


def _workspace_bytes(backend: str, world: int, experts: int, capacity: int, hidden: int = 7168) -> int:
    """Every virtual rank's workspace together (bf16 rows; fp8 rows take less)."""
    if backend == "nvlink_one_sided":
        return world * world * capacity * hidden * 2 * 2  # x and comb, [W, cap, H] on each rank
    return (experts * world + world * 8) * capacity * hidden * 2  # [E_local, W, cap, H] + [cap, k, H] each


# (uniform, skewed-zero, repeated, (step tokens, capacity, step)) per backend: the GPU tests' loads,
# low latency's smaller (its slots scale with every expert: E x W x capacity rows of H per rank)
LOADS = {
    "nvlink_one_sided": ((128, 77), (0, 300), 1024, ((160, 97), 1024, 192)),
    "nvlink_low_latency": ((64, 37), (0, 64), 64, ((40, 25), 64, 48)),
}


def _cycle(tokens: tuple[int, ...], world: int) -> tuple[int, ...]:
    return tuple(tokens[r % len(tokens)] for r in range(world))


def _cases() -> list[Case]:
    cases = []
    for w in WORLDS:
        e = _experts(w)
        for b in NVLINK:
            uniform, skewed, repeated, (stepped, capacity, step) = LOADS[b]
            for dtype in DTYPES:
                tag = f"{b}-w{w}-{dtype}"
                cases += [
                    Case(f"{tag}-uniform", b, _cycle(uniform, w), e, 8, 7168, dtype),
                    Case(f"{tag}-skewed-zero", b, _cycle(skewed, w), e, 8, 7168, dtype, "skewed"),
                    Case(f"{tag}-repeated", b, (repeated,) * w, e, 8, 7168, dtype, repeats=3),
                    Case(f"{tag}-step", b, _cycle(stepped, w), e, 8, 7168, dtype, capacity=capacity, step=step),
                ]
    return cases


PLANTED = [  # each must fail, at W = 4
    Case("planted-drops-row", "planted_kernel_drops_row", (64, 37, 64, 5), 256, 8, 7168, "bf16"),
    Case("planted-wrong-slot", "planted_kernel_wrong_slot", (64, 37, 64, 5), 256, 8, 7168, "bf16"),
    Case("planted-skips-flag", "planted_kernel_skips_flag", (64, 37, 64, 5), 256, 8, 7168, "bf16"),
]
REPLAYS = [
    Replays(f"{b}-w{w}-{dtype}", b, (64, 37, 0, 64, 1, 64, 64, 13)[:w], _experts(w), 8, 7168, dtype)
    for w in WORLDS
    for b in NVLINK
    for dtype in DTYPES
] + [
    # one-sided at a capacity above the step: the captured kernels use the step's rows
    Replays(f"nvlink_one_sided-w{w}-step", "nvlink_one_sided", (64,) * w, _experts(w), 8, 7168, capacity=512)
    for w in WORLDS
]
PLANTED_REPLAYS = [  # the skipped flag is seen by the warm-up round before the capture
    Replays("planted-skips-flag", "planted_kernel_skips_flag", (64, 64, 64, 64), 256, 8, 7168, replays=2),
    Replays("planted-drops-row", "planted_kernel_drops_row", (64, 64, 64, 64), 256, 8, 7168, replays=2),
]
PATTERNS = [Pattern(b, (64, 64), (33, 32), experts=256, topk=8, hidden=7168) for b in NVLINK] + [
    Pattern("nvlink_one_sided", (16,) * 8, (1, 9, 0, 33, 16, 2, 64, 7), experts=256, topk=8, hidden=7168)
]


@pytest.fixture(scope="module")
def one_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_kernels")
        return run_ranks(virtual_work, 1, "cuda", _cases() + PLANTED, PATTERNS, REPLAYS + PLANTED_REPLAYS)[0]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.id)
def test_the_shipped_kernels_hold_the_invariant_on_virtual_ranks_of_one_gpu(one_gpu, case):
    ok, err, reason, _ = one_gpu["invariant"][case.id]
    assert ok, reason
    assert err <= TOLERANCE[case.dtype]


@pytest.mark.parametrize("replays", REPLAYS, ids=lambda r: r.id)
def test_one_graph_of_all_w_ranks_replays_correctly_with_fresh_inputs(one_gpu, replays):
    worst, error = one_gpu["replays"][replays.id]
    assert not error and worst <= TOLERANCE[replays.dtype], error


@pytest.mark.parametrize("case", PLANTED, ids=lambda c: c.id)
def test_a_planted_kernel_bug_fails_on_one_gpu(one_gpu, case):
    ok, _, reason, crashed = one_gpu["invariant"][case.id]
    assert not ok and not crashed, reason


def test_planted_bugs_fail_under_graph_replay_too(one_gpu):
    worst, error = one_gpu["replays"]["planted-skips-flag"]
    assert worst is None and error.endswith("after every rank's combine_send (a skipped signal)"), error
    worst, error = one_gpu["replays"]["planted-drops-row"]
    assert not error and worst > 0.1


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: f"{p.backend}-w{len(p.warm)}")
def test_a_new_count_pattern_compiles_nothing_and_sets_no_error_word_on_a_gpu(one_gpu, pattern):
    got = one_gpu["patterns"][f"{pattern.backend}-{pattern.warm}-{pattern.then}"]
    assert got["ok"] == (True, True), got["reasons"]
    assert got["new_keys"] == [] and got["compiled"][0] == got["compiled"][1]
    assert got["gave_up"] == []


def test_a_step_change_between_dispatch_and_combine_is_refused(one_gpu):
    assert one_gpu["mid_trip"] == "set_step_tokens changed between dispatch (2) and combine (3)"


# ---------------------------------------------------- the peers' backends at one rank (one GPU)


def test_deepep_low_latency_at_one_rank():
    """Passed at 1 rank on an H200 (2026-12-01, scripts/deepep_smoke.py --world 1); timed there at
    1 rank on 2026-12-02 (scripts/peers_one_rank.py; BENCHMARKS.md, "The peers at one rank")."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if find_deepep() is None:
        pytest.skip("DeepEP not staged (scripts/stage_deepep.py): its low-latency kernels at 1 rank not run")
    cases = [
        Case("deepep-ll-1rank", "deepep_low_latency", (77,), 256, 8, 7168, "bf16", capacity=128, repeats=2),
        Case("deepep-ll-1rank-zero", "deepep_low_latency", (0,), 256, 8, 7168, "bf16", capacity=128),
        Case("deepep-ll-1rank-fp8", "deepep_low_latency", (100,), 256, 8, 7168, "fp8_e4m3", capacity=128),
    ]
    results = run_ranks(run_cases, 1, "cuda", cases)[0]
    for case in cases:
        ok, _, reason, _ = results[case.id]
        assert ok, f"{case.id}: {reason}"


@pytest.mark.parametrize("name", ["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"])
def test_flashinfer_at_ep_size_1_runs_correctly_or_refuses_in_one_line(name):
    """Both ran at ep_size=1 on an H200, the invariant holding (2026-12-02, scripts/peers_one_rank.py;
    BENCHMARKS.md, "The peers at one rank"). A one-line refusal passes; a crash (the process dies) fails."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if flashinfer_version() is None:
        pytest.skip("FlashInfer not staged (scripts/stage_flashinfer.py): its backends at ep_size=1 not run here")
    case = Case(f"{name}-ep1", name, (77,), 256, 8, 7168, "bf16", capacity=128)
    ok, _, reason, _ = run_ranks(run_cases, 1, "cuda", [case])[0][case.id]
    assert ok or reason.startswith("construction: "), reason
    print(f"{name} at ep_size=1: {'runs, invariant holds' if ok else 'refuses: ' + reason}")


def test_every_case_s_w_workspaces_fit_in_a_few_gib():
    for c in _cases():
        assert _workspace_bytes(c.backend, len(c.tokens), c.experts, c.capacity or max(c.tokens)) < 2.2 * GiB, c.id
