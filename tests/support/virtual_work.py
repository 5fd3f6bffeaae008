"""What the virtual-rank tests run in a rank of their own (`run_ranks(virtual_work, 1, device,
...)`): on CPU that process has TRITON_INTERPRET=1 from the start (the kernels are interpreted);
on a GPU it is the one process holding every virtual rank. A2A_TUNE_BACKEND_MODULES=planted_kernels
registers the planted-bug copies of the kernel modules there, never in the test session.

`CompileKeys` records, for every launch of the NVLink kernels, the key under which Triton
would compile it for a GPU (its specialization of each argument: dtype and 16-byte alignment of
pointers, divisibility by 16 or == 1 of integers, unless `do_not_specialize`): the same on CPU
under the interpreter as on a GPU, so a new count pattern's new compilations show on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from invariant_cases import Case, run_cases_virtual

from a2a_tune.kernels import MoEShape, ShapeError, get_backend
from a2a_tune.kernels.virtual import VirtualWorld


class CompileKeys:
    """Pre-run hooks on every Triton kernel of the NVLink kernel modules: the compile key of
    each launch, as the kernel declares it (`honoured`) and as it would be without its
    `do_not_specialize` (`naive`: what the test compares against)."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature

        from a2a_tune.kernels import _low_latency_kernels, _nvlink_common, _one_sided_kernels

        gpu = make_backend(GPUTarget("cuda", 90, 32))  # an H100/H200: what the keys are for
        self.honoured: set[tuple[str, str]] = set()
        self.naive: set[tuple[str, str]] = set()
        for module in (_one_sided_kernels, _low_latency_kernels, _nvlink_common):
            for name, kernel in vars(module).items():
                if not (name.endswith("_kernel") and hasattr(kernel, "add_pre_run_hook")):
                    continue
                dns = getattr(kernel, "do_not_specialize", None)
                if dns is None:  # the interpreter's function keeps jit's arguments
                    dns = kernel.kwargs.get("do_not_specialize")
                binders = [
                    create_function_from_signature(jf.signature, jf.params, gpu)
                    for jf in (JITFunction(kernel.fn, do_not_specialize=dns), JITFunction(kernel.fn))
                ]
                kernel.add_pre_run_hook(self._hook(f"{module.__name__}.{name}", binders))

    def _hook(self, name: str, binders):
        def hook(*args, **kwargs):
            for keys, binder in zip((self.honoured, self.naive), binders):
                keys.add((name, repr(binder(*args, **kwargs)[1])))

        return hook

    def snapshot(self) -> tuple[set, set]:
        return set(self.honoured), set(self.naive)

    @staticmethod
    def compiled() -> int | None:
        """Kernels Triton compiled so far in this process (on a GPU; None when interpreted)."""
        from a2a_tune.kernels import _low_latency_kernels, _nvlink_common, _one_sided_kernels

        caches = [
            cache[0]
            for module in (_one_sided_kernels, _low_latency_kernels, _nvlink_common)
            for name, kernel in vars(module).items()
            if name.endswith("_kernel")
            for cache in getattr(kernel, "device_caches", {}).values()
        ]
        return sum(map(len, caches)) if caches else None


@dataclass(frozen=True)
class Pattern:
    """Round trips on one instance of W virtual ranks whose per-rank counts change: the first
    `warm` rounds load every variant, then `then` is a pattern never seen (each at its step)."""

    backend: str
    warm: tuple[int, ...]
    then: tuple[int, ...]
    experts: int = 4
    topk: int = 2
    hidden: int = 32


def count_pattern(device, keys: CompileKeys, p: Pattern) -> dict:
    capacity = max(*p.warm, *p.then)
    shape = MoEShape(p.experts, p.topk, p.hidden, capacity, "bf16")
    with VirtualWorld(len(p.warm), device).build(get_backend(p.backend), shape, step=max(p.warm)) as ranks:
        warm = ranks.check(ranks.inputs(p.warm, seed=1))
        before, compiled = keys.snapshot(), keys.compiled()
        ranks.set_step_tokens(max(p.then))  # an engine's step: the most any rank holds
        then = ranks.check(ranks.inputs(p.then, seed=2))
        after = keys.snapshot()
        return {
            "compiled": (compiled, keys.compiled()),
            "ok": (warm.ok, then.ok),
            "reasons": (warm.reason, then.reason),
            "new_keys": sorted(after[0] - before[0]),
            "naive_new_keys": sorted(after[1] - before[1]),
            "gave_up": ranks.gave_up(),
        }


def _step_change_mid_trip(device) -> str:
    """Dispatch at a step of 2, combine after set_step_tokens(3): the handle refuses, on every
    virtual rank, before any kernel of the combine runs."""
    shape = MoEShape(8, 2, 8, 4)
    with VirtualWorld(2, device).build(get_backend("nvlink_one_sided"), shape, step=2) as ranks:
        ds = ranks.dispatch(ranks.inputs([2, 2]))
        ranks.set_step_tokens(3)
        try:
            ranks.combine([d.x.new_zeros(d.x.shape[0], shape.hidden, dtype=ranks.backends[0].dtype) for d in ds], ds)
        except ShapeError as exc:
            return str(exc)
    return "no error"


@dataclass(frozen=True)
class Replays:
    """One CUDA-graph capture of the whole W-rank sequence, replayed with fresh inputs (GPU)."""

    id: str
    backend: str
    tokens: tuple[int, ...]
    experts: int
    topk: int
    hidden: int
    dtype: str = "bf16"
    capacity: int = 64
    replays: int = 20


def graph_replays(device, r: Replays) -> tuple[float | None, str]:
    shape = MoEShape(r.experts, r.topk, r.hidden, r.capacity, r.dtype)
    try:
        with VirtualWorld(len(r.tokens), device).build(get_backend(r.backend), shape, step=max(r.tokens)) as ranks:
            return ranks.graph_replay_error(r.tokens, r.replays), ""
    except Exception as exc:  # noqa: BLE001 - a planted bug's wait giving up: the test reads it
        return None, f"{type(exc).__name__}: {exc}"


def _timed(device) -> tuple[str, int, bool]:
    """Virtual round trips timed at T = 1 on 2 ranks: (their label, samples, all positive)."""
    with VirtualWorld(2, device).build(get_backend("nvlink_one_sided"), MoEShape(8, 2, 8, 1), step=1) as ranks:
        t = ranks.time_round_trips(ranks.inputs([1, 1]), warmup=1, iters=2)
    return t.timing, len(t.us), all(us > 0 for us in t.us)


def virtual_work(
    ctx, cases: list[Case], patterns: list[Pattern], replays: list[Replays] = (), mid_trip: bool = True
) -> dict:
    keys = CompileKeys()
    return {
        "invariant": run_cases_virtual(ctx.device, cases),
        "patterns": {f"{p.backend}-{p.warm}-{p.then}": count_pattern(ctx.device, keys, p) for p in patterns},
        "mid_trip": _step_change_mid_trip(ctx.device) if mid_trip else None,
        "replays": {r.id: graph_replays(ctx.device, r) for r in replays},
        "timed": _timed(ctx.device),
    }
