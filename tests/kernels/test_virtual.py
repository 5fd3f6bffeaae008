"""Virtual ranks on CPU (a2a_tune.kernels.virtual): W ranks of nvlink_one_sided and
nvlink_low_latency in one process, their Triton kernels under Triton's interpreter, in phase
order; and what they compile, checked against what a GPU would compile.

One spawned process (TRITON_INTERPRET=1 from its start) runs every case: W = 2, 3 and one W = 8
case at tiny counts, planted kernel bugs (copies of the kernel modules loaded as out-of-tree
backends: tests/support/planted_kernels.py), a new count pattern on a warm instance. The
GPU variants are tests/kernels/test_virtual_gpu.py.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

from invariant_cases import Case  # noqa: E402
from kernel_copies import copy_module  # noqa: E402
from nvlink_cases import BASE, NVLINK, per_backend  # noqa: E402
from virtual_work import Pattern, virtual_work  # noqa: E402

from a2a_tune.kernels import MoEShape, get_backend  # noqa: E402
from a2a_tune.kernels import _one_sided_kernels as one_sided  # noqa: E402
from a2a_tune.kernels.errors import VirtualRanksError  # noqa: E402
from a2a_tune.kernels.reference import TOLERANCE  # noqa: E402
from a2a_tune.kernels.virtual import VirtualWorld  # noqa: E402
from a2a_tune.tuner.launch import run_ranks  # noqa: E402

# the emulation's cases but two (CI time: one W = 8 case, EP 8 at tiny counts with block-FP8
# and top-8; knobs with fp8 only), and what virtual ranks add: a step below the capacity on
# one instance, calls back to back
CASES = per_backend(
    [c for c in BASE if c.id not in ("w8-skewed", "w2-knobs-small-blocks")]
    + [
        Case("w2-step-below-capacity", "", (3, 2), experts=8, topk=2, hidden=8, capacity=8, step=4, repeats=2),
        Case("w3-repeated-calls", "", (2, 3, 1), experts=6, topk=2, hidden=8, dtype="bf16", repeats=3),
    ]
)
PLANTED = {  # planted_kernels.py: each must fail, none crash
    "planted_kernel_drops_row": Case("drops-row", "planted_kernel_drops_row", (3, 2, 3), 12, 2, 16, "bf16"),
    "planted_kernel_wrong_slot": Case("wrong-slot", "planted_kernel_wrong_slot", (3, 2, 3), 12, 2, 16, "bf16"),
    "planted_kernel_skips_flag": Case("skips-flag", "planted_kernel_skips_flag", (2, 2, 2), 12, 2, 16, "bf16"),
}
# a warm instance meets counts it never saw (the step too): 64 is divisible by 16, 33 is not,
# and Triton specializes integers on that (and on == 1)
PATTERNS = [Pattern(b, (64, 64), (33, 32)) for b in NVLINK] + [
    Pattern("nvlink_one_sided", (16, 16, 16), (1, 9, 0), experts=6)
]


@pytest.fixture(scope="module")
def virtual():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_kernels")
        return run_ranks(virtual_work, 1, "cpu", CASES + list(PLANTED.values()), PATTERNS)[0]


@pytest.mark.parametrize("case", [c for c in CASES if "than-the-step" not in c.id], ids=lambda c: c.id)
def test_the_shipped_kernels_hold_the_invariant_on_virtual_ranks(virtual, case):
    ok, err, reason, _ = virtual["invariant"][case.id]
    assert ok, reason
    assert err <= TOLERANCE[case.dtype]


@pytest.mark.parametrize("backend", NVLINK)
def test_more_tokens_than_the_step_is_the_step_check_s_one_line(virtual, backend):
    ok, _, reason, crashed = virtual["invariant"][f"{backend}-w2-more-tokens-than-the-step"]
    assert not ok and crashed and reason == "5 tokens exceed this step's 4 (set_step_tokens)"


def test_a_planted_kernel_bug_fails_the_virtual_check(virtual):
    dropped = virtual["invariant"]["drops-row"]
    assert not dropped[0] and not dropped[3] and re.fullmatch(r"rank \d: token 1: relative error .*", dropped[2])
    wrong = virtual["invariant"]["wrong-slot"]
    assert not wrong[0] and not wrong[3] and wrong[1] > 0.1
    skipped = virtual["invariant"]["skips-flag"]  # found by the host between phases: nothing spun
    assert not skipped[0] and not skipped[3]
    assert skipped[2] == "rank 0: no combine flag from rank(s) 2 after every rank's combine_send (a skipped signal)"


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: f"{p.backend}-{p.warm}-{p.then}")
def test_a_new_count_pattern_compiles_nothing_new_and_sets_no_error_word(virtual, pattern):
    got = virtual["patterns"][f"{pattern.backend}-{pattern.warm}-{pattern.then}"]
    assert got["ok"] == (True, True), got["reasons"]
    assert got["new_keys"] == []
    assert got["gave_up"] == []
    # the same launches, were counts specialized: new variants to compile while peers spin
    assert got["naive_new_keys"], "the pattern does not exercise the specialization"


def test_virtual_timings_carry_the_label_the_store_refuses(virtual):
    assert virtual["timed"] == ("virtual", 2, True)  # tests/db/test_store.py: refused


def test_a_step_change_between_dispatch_and_combine_is_refused_on_virtual_ranks(virtual):
    assert virtual["mid_trip"] == "set_step_tokens changed between dispatch (2) and combine (3)"


# ------------------------------------------------------------------ in this process (no kernels run)


def test_backends_that_need_ranks_of_their_own_are_refused():
    with pytest.raises(VirtualRanksError, match="nccl_all2allv cannot run on virtual ranks"):
        VirtualWorld(2, "cpu").build(get_backend("nccl_all2allv"), MoEShape(8, 2, 8, 4))


class _Launches:
    """Stands in for a Triton kernel: records what a host wrapper launches it with."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


@pytest.fixture
def no_kernels(monkeypatch):
    """Construction loads the wait kernel; here nothing may launch one (no GPU, no interpreter)."""
    from a2a_tune.kernels import _nvlink_common

    monkeypatch.setattr(_nvlink_common, "_wait_kernel", _Launches())


def test_each_virtual_rank_is_its_own_region_of_one_zeroed_allocation(no_kernels):
    with VirtualWorld(3, "cpu").build(get_backend("nvlink_one_sided"), MoEShape(6, 2, 8, 4)) as ranks:
        states = [b.state for b in ranks.backends]
        assert [s.rank for s in states] == [0, 1, 2] and all(s.phased for s in states)
        whole = ranks.backends[0]._symm
        assert all(b._symm is whole for b in ranks.backends) and not whole.any()
        starts = [s.buf.data_ptr() for s in states]
        assert starts[0] == whole.data_ptr() and starts == sorted(starts)
        for s in states:  # every rank sees every rank's workspace where it is
            assert [s.buf.data_ptr() + d for d in s.delta_bytes] == starts


def _ttir(fn, args, kwargs) -> str:
    """Triton's IR of `fn` for an sm_90 GPU, specialized as a launch with (args, kwargs) would
    be (no GPU needed: the front end only), without source locations."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ASTSource(fn, signature, constexprs, attrs).make_ir(
        target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context
    )
    text = re.sub(r"\s*loc\((#loc\d*|\"[^\"]*\"[^)]*)\)", "", str(module))
    return "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))


def test_the_sweep_s_dispatch_kernel_is_the_one_before_the_phase_switch(no_kernels, monkeypatch):
    """FUSED_WAIT (the switch virtual ranks turn off) at its default compiles to the IR of the
    kernel without the switch, from the arguments the sweep's launch passes (it does not pass
    the switch); the phased launch compiles to another kernel (no wait in it)."""
    if getattr(one_sided._dispatch_send_kernel, "_pack_args", None) is None:
        pytest.skip("the kernels are interpreted here (TRITON_INTERPRET=1)")
    without = copy_module(
        one_sided,
        "one_sided_without_the_switch",
        [
            ("    FUSED_WAIT: tl.constexpr = True,  # False: virtual ranks in phase order (the sweep: True)\n", ""),
            (
                "    if FUSED_WAIT:\n        if last:\n            wait_flags(flags_ws, epoch, epoch_ptr + 1, W)",
                "    if last:\n        wait_flags(flags_ws, epoch, epoch_ptr + 1, W)",
            ),
        ],
    )
    shipped_kernel = one_sided._dispatch_send_kernel
    shape = MoEShape(16, 4, 7168, 128, "bf16")  # DeepSeek-like rows, W = 4
    with VirtualWorld(4, "cpu").build(get_backend("nvlink_one_sided"), shape, step=128) as ranks:
        inputs = ranks.inputs([100, 128, 3, 0])
        st = ranks.backends[1].state
        launches = _Launches()
        monkeypatch.setattr(one_sided, "_dispatch_send_kernel", launches)
        st.phased = False  # the sweep's ranks
        one_sided.dispatch_send(st, inputs[1].x, inputs[1].topk_ids, inputs[1].topk_weights)
        st.phased = True
        one_sided.dispatch_send(st, inputs[1].x, inputs[1].topk_ids, inputs[1].topk_weights)
        monkeypatch.setattr(one_sided, "_dispatch_send_kernel", shipped_kernel)
    (sweep_args, sweep_kwargs), (phased_args, phased_kwargs) = launches.calls
    assert "FUSED_WAIT" not in sweep_kwargs and phased_kwargs.pop("FUSED_WAIT") is False
    assert (sweep_args, sweep_kwargs) == (phased_args, phased_kwargs)  # nothing else differs
    shipped = _ttir(one_sided._dispatch_send_kernel, sweep_args, sweep_kwargs)
    assert shipped == _ttir(without._dispatch_send_kernel, sweep_args, sweep_kwargs)
    phased = _ttir(one_sided._dispatch_send_kernel, phased_args, {**phased_kwargs, "FUSED_WAIT": False})
    assert phased != shipped and "scf.while" in shipped and "scf.while" not in phased
