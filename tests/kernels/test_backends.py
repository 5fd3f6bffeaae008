"""The backend contract's invariant, checked over gloo with real processes (2 and 3 ranks).

All cases of one world size run in one launch (process start-up dominates), then each
case is asserted by its own test.
"""

from __future__ import annotations

import pytest
import torch
from invariant_cases import (
    REAL_BACKENDS,
    Case,
    cases_w2,
    conformance_cases,
    cpu_conformance,
    run_cases,
    with_planted_backends,
)

from a2a_tune.kernels import BackendEnv, MoEShape, ShapeError, get_backend, list_backends
from a2a_tune.kernels.reference import TOLERANCE, expert_scales, make_inputs
from a2a_tune.tuner.launch import run_ranks


def _cases_w3() -> list[Case]:
    cases = []
    for b in REAL_BACKENDS:
        cases += [
            Case(f"{b}-w3-uniform", b, (4, 9, 2), experts=12, topk=3),
            Case(f"{b}-w3-zero-middle", b, (5, 0, 7), experts=12, topk=3, dtype="bf16"),
            Case(f"{b}-w3-skewed-odd", b, (11, 3, 8), experts=24, topk=5, hidden=47, routing="skewed"),
            Case(f"{b}-w3-local", b, (6, 6, 6), experts=12, topk=4, routing="local"),
        ]
    return cases


@pytest.fixture(scope="module")
def results_w2():
    return with_planted_backends(run_cases, 2, "cpu", cases_w2())


@pytest.fixture(scope="module")
def results_w3():
    return run_ranks(run_cases, 3, "cpu", _cases_w3())[0]


@pytest.mark.parametrize(
    "case",
    conformance_cases(cases_w2()),
    ids=lambda c: c.id,
)
def test_invariant_holds_on_two_ranks(results_w2, case):
    ok, err, reason, _ = results_w2[case.id]
    assert ok, reason
    assert err <= TOLERANCE[case.dtype]


@pytest.mark.parametrize("backend", REAL_BACKENDS)
def test_more_tokens_than_the_step_is_a_one_line_error(results_w2, backend):
    ok, _, reason, crashed = results_w2[f"{backend}-more-tokens-than-the-step"]
    assert not ok and crashed
    assert "5 tokens exceed this step's 4 (set_step_tokens)" in reason


@pytest.mark.parametrize("case", _cases_w3(), ids=lambda c: c.id)
def test_invariant_holds_on_three_ranks(results_w3, case):
    ok, _, reason, _ = results_w3[case.id]
    assert ok, reason


def test_planted_off_by_one_fails_the_check(results_w2):
    ok, err, reason, _ = results_w2["planted_off_by_one"]
    assert not ok
    assert "relative error" in reason or "another rank" in reason
    assert err > 0.1


def test_planted_double_weights_fails_the_check(results_w2):
    ok, err, _, _ = results_w2["planted_double_weights"]
    assert not ok
    assert err == pytest.approx(0.5, rel=1e-3)  # every token comes back at half its value


def test_crashing_backend_is_a_failed_check_with_its_message(results_w2):
    ok, _, reason, _ = results_w2["planted_crash"]
    assert not ok
    assert "RuntimeError: planted failure: kernel image not found" in reason


@pytest.mark.parametrize("backend", list(cpu_conformance()))
def test_every_registered_backend_passes_the_cpu_conformance_cases_or_says_why_not(results_w2, backend):
    """Registration is enough: no list of backends to add a new one to."""
    why = cpu_conformance()[backend]
    if why is not None:
        pytest.skip(f"{backend} does not run on CPU ranks: {why}")
    mine = {c.id for c in conformance_cases(cases_w2()) if c.backend == backend}
    assert len(mine) >= 12
    failed = {i: results_w2[i][2] for i in sorted(mine) if not results_w2[i][0]}
    assert failed == {}


def test_a_newly_registered_backend_gets_the_cpu_conformance_cases(monkeypatch):
    from a2a_tune.kernels import register_backend, registry
    from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv
    from a2a_tune.kernels.nvlink_one_sided import NvlinkOneSided

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test
    for name, base in (("test_new_cpu", NcclAll2Allv), ("test_new_gpu", NvlinkOneSided)):
        register_backend(type(name, (base,), {"name": name, "__module__": f"a2a_tune.kernels.{name}"}))
    conformance = cpu_conformance()
    assert conformance["test_new_cpu"] is None  # gets the cases: it runs on two CPU ranks
    assert "needs CUDA GPUs" in conformance["test_new_gpu"]  # skipped, with its reason
    assert len(cases_w2(["test_new_cpu"])) == len(cases_w2([REAL_BACKENDS[0]]))


def test_registry_lists_the_real_backends_first():
    assert list_backends()[:3] == ["allgather_reducescatter", "allgather_reducescatter_padded", "nccl_all2allv"]


def test_unknown_backend_error_names_the_known_ones():
    with pytest.raises(
        KeyError,
        match="unknown backend 'nope'; known: allgather_reducescatter, allgather_reducescatter_padded, nccl_all2allv",
    ):
        get_backend("nope")


@pytest.mark.parametrize("name", REAL_BACKENDS)
def test_single_rank_is_unavailable_with_a_reason(name):
    ok, reason = get_backend(name).availability(BackendEnv(world_size=1, device_type="cpu", dist_backend="gloo"))
    assert not ok and reason == "needs at least 2 ranks"
    assert get_backend(name).availability(BackendEnv(world_size=2, device_type="cpu", dist_backend="gloo")).ok


@pytest.mark.parametrize(
    "shape, world, message",
    [
        (MoEShape(10, 2, 64, 8), 3, "10 experts do not divide over 3 ranks"),
        (MoEShape(4, 8, 64, 8), 2, "topk 8 is more than the 4 experts"),
        (MoEShape(8, 2, 10**9, 8), 2, "hidden must be in 1..65536, got 1000000000"),
        (MoEShape(8, 2, 64, 2**20 + 1), 2, "max_tokens_per_rank must be in 1..1048576"),
        (MoEShape(8, 2, 0, 8), 2, "must be positive"),
        (MoEShape(8, 2, 64, 8, dtype="int4"), 2, "unknown payload dtype 'int4'"),
    ],
)
def test_impossible_shapes_are_one_line_errors(shape, world, message):
    with pytest.raises(ShapeError, match=message):
        shape.validate(world)


def test_case_bytes_bounds_what_a_case_allocates_per_rank():
    """The one estimate the plan refuses cases with: linear in the tokens and the hidden size,
    counting each layout's received rows (expert-major slots hold E_local x W x capacity)."""
    from a2a_tune.kernels.base import case_bytes

    ag, ll = get_backend("allgather_reducescatter"), get_backend("nvlink_low_latency")
    small = MoEShape(256, 8, 7168, 128)
    assert ag.received_rows(small, 8) == 8 * 128
    assert ll.received_rows(small, 8) == 32 * 8 * 128
    assert case_bytes(ll, small, 8, 128) > case_bytes(ag, small, 8, 128)
    # what x, the received rows and the reference need at least: [T, H] and [W*T, H] of bf16
    assert case_bytes(ag, small, 8, 128) >= (128 + 8 * 128) * 7168 * 2
    double = MoEShape(256, 8, 2 * 7168, 256)
    assert 3.5 < case_bytes(ag, double, 8, 256) / case_bytes(ag, small, 8, 128) < 4.5
    # inside the token bound, a large hidden size is far beyond any machine: what plans refuse
    assert case_bytes(ag, MoEShape(8, 2, 65536, 2**20), 2, 2**20) > 2**40


def test_make_inputs_rows_have_distinct_experts_and_normalised_weights():
    shape = MoEShape(32, 8, 16, 64)
    for routing in ("uniform", "skewed"):
        inp = make_inputs(shape, 64, rank=1, world_size=4, routing=routing, seed=3)
        assert inp.topk_ids.shape == (64, 8)
        assert all(len(set(row.tolist())) == 8 for row in inp.topk_ids)
        assert torch.allclose(inp.topk_weights.sum(1), torch.ones(64))
        assert inp.x.dtype == torch.bfloat16


def test_make_inputs_is_reproducible_and_differs_per_rank():
    shape = MoEShape(16, 2, 8, 16)
    a = make_inputs(shape, 10, rank=0, world_size=2, seed=5)
    b = make_inputs(shape, 10, rank=0, world_size=2, seed=5)
    c = make_inputs(shape, 10, rank=1, world_size=2, seed=5)
    assert torch.equal(a.topk_ids, b.topk_ids) and torch.equal(a.x, b.x)
    assert not torch.equal(a.x, c.x)


def test_skewed_routing_concentrates_on_few_experts():
    shape = MoEShape(64, 4, 8, 4096)
    uniform = (
        make_inputs(shape, 4096, rank=0, world_size=2, routing="uniform").topk_ids.flatten().bincount(minlength=64)
    )
    skewed = make_inputs(shape, 4096, rank=0, world_size=2, routing="skewed").topk_ids.flatten().bincount(minlength=64)
    top8 = lambda counts: counts.sort(descending=True).values[:8].sum().item() / counts.sum().item()  # noqa: E731
    assert top8(skewed) > 2 * top8(uniform)


def test_local_routing_stays_on_the_rank_and_rejects_impossible_topk():
    inp = make_inputs(MoEShape(16, 4, 8, 8), 8, rank=1, world_size=2, routing="local")
    assert bool(((inp.topk_ids >= 8) & (inp.topk_ids < 16)).all())
    with pytest.raises(ShapeError, match="'local' routing needs topk 6 <= experts per rank 4"):
        make_inputs(MoEShape(8, 6, 8, 8), 8, rank=0, world_size=2, routing="local")


def test_expert_scales_default_is_index_plus_one():
    assert expert_scales(4).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_crash_is_flagged_as_a_crash_and_wrong_values_are_not(results_w2):
    assert results_w2["planted_crash"][3] is True
    assert results_w2["planted_off_by_one"][3] is False


def test_a_backend_module_that_does_not_import_is_one_line(monkeypatch):
    import subprocess
    import sys

    env = {**__import__("os").environ, "A2A_TUNE_BACKEND_MODULES": "no_such_backend_module"}
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", "backends", "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2
    assert "A2A_TUNE_BACKEND_MODULES: cannot import 'no_such_backend_module'" in r.stderr
    assert "Traceback" not in r.stderr


def _cases_w4() -> list[Case]:
    cases = []
    for b in REAL_BACKENDS:
        cases += [
            Case(f"{b}-w4-uniform", b, (6, 1, 9, 4), experts=16, topk=4),
            Case(f"{b}-w4-zero-ranks", b, (0, 7, 0, 3), experts=16, topk=3, dtype="bf16"),
            Case(f"{b}-w4-skewed", b, (12, 12, 5, 8), experts=32, topk=6, routing="skewed"),
        ]
    return cases


@pytest.fixture(scope="module")
def results_w4():
    return run_ranks(run_cases, 4, "cpu", _cases_w4())[0]


@pytest.mark.parametrize("case", _cases_w4(), ids=lambda c: c.id)
def test_invariant_holds_on_four_ranks(results_w4, case):
    """Expert parallelism is 8 GPUs or more in most deployments: nothing may assume 2 ranks."""
    ok, err, reason, _ = results_w4[case.id]
    assert ok, reason
    assert err <= TOLERANCE[case.dtype]
