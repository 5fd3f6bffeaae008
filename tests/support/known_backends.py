"""Backends of known duration and known memory on one GPU: the figures checked against what
was planted (tests/tuner/test_figures_gpu.py). Built on the all-gather backends at world 1, so
every one passes the invariant and is measured through the sweep's own `measure`.

Durations are spins on the GPU's global timer (`%globaltimer`, ns): a planted µs is a µs at
any SM clock. Not `torch.cuda._sleep`, which spins a count of SM cycles: a spin started on a
GPU whose clock is still climbing from idle outlasts the same spin on a busy one, so its length
depends on what ran before it (BENCHMARKS.md, "MXFP8 and NVFP4 quantize, eager halves"). Memory
is held from construction to `close()`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from a2a_tune.kernels import register_backend
from a2a_tune.kernels._symmetric_backend import rendezvous_workspace
from a2a_tune.kernels.allgather_reducescatter import AllGatherReduceScatter, AllGatherReduceScatterPadded

HELD_BYTES = 256 * 2**20 + 1000  # what each holder holds: not a multiple of any allocator's granule


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _spin(ns):
    """One thread spins until `ns` nanoseconds of the global timer have passed."""
    start = _now()
    now = start
    while now - start < ns:
        now = _now()


def calibrate() -> float:
    """A 5 ms spin timed by CUDA events, after one warm-up: measured / planted (1.0 expected)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        start.record()
        sleep_us(5000.0)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / 5000.0


def sleep_us(us: float) -> None:
    if us > 0:
        _spin[(1,)](int(us * 1000), num_warps=1)


class _Sleeps:
    """A spin of `dispatch_sleep_us` at the end of dispatch and `combine_sleep_us` at the end of combine."""

    dispatch_sleep_us = 0.0
    combine_sleep_us = 0.0

    def dispatch(self, x, topk_ids, topk_weights):
        d = super().dispatch(x, topk_ids, topk_weights)
        sleep_us(self.dispatch_sleep_us)
        return d

    def combine(self, expert_out, dispatched):
        y = super().combine(expert_out, dispatched)
        sleep_us(self.combine_sleep_us)
        return y


@register_backend
class SleepsAfterAHostRead(_Sleeps, AllGatherReduceScatter):
    """Eager only: its dispatch reads the token counts on the host, as nccl_all2allv and DeepEP's
    normal mode do."""

    name = "planted_sleeps_host_read"


@register_backend
class SleepsCapturable(_Sleeps, AllGatherReduceScatterPadded):
    """No host read: timed under graph replay, or eagerly when told."""

    name = "planted_sleeps_capturable"


@register_backend
class TailOverlapsCombine(AllGatherReduceScatterPadded):
    """Dispatch leaves a `tail_us` spin running on a side stream; combine spins
    `combine_sleep_us` on the main stream meanwhile and joins the tail at its end: in the round
    trip the combine overlaps the tail of the dispatch."""

    name = "planted_tail_overlap"
    tail_us = 0.0
    combine_sleep_us = 0.0

    def dispatch(self, x, topk_ids, topk_weights):
        d = super().dispatch(x, topk_ids, topk_weights)
        main = torch.cuda.current_stream(self.device)
        self._side = getattr(self, "_side", None) or torch.cuda.Stream(self.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            sleep_us(self.tail_us)
        return d

    def combine(self, expert_out, dispatched):
        y = super().combine(expert_out, dispatched)
        sleep_us(self.combine_sleep_us)
        torch.cuda.current_stream(self.device).wait_stream(self._side)
        return y


class _Holds(AllGatherReduceScatterPadded):
    """Holds HELD_BYTES of device memory from construction to close (`hold` / `release`)."""

    def __init__(self, group, shape, device) -> None:
        super().__init__(group, shape, device)
        self._held = self.hold(HELD_BYTES)

    def hold(self, nbytes: int):
        raise NotImplementedError

    def release(self, held) -> None:
        pass

    def close(self) -> None:
        held, self._held = getattr(self, "_held", None), None
        if held is not None:
            self.release(held)
        super().close()


@register_backend
class HoldsTorchMemory(_Holds):
    """Through torch's caching allocator."""

    name = "planted_holds_torch"

    def hold(self, nbytes: int):
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)


@register_backend
class HoldsCudaMalloc(_Holds):
    """A raw cudaMalloc outside torch's allocator (CuPy's runtime call, no pool)."""

    name = "planted_holds_cudamalloc"

    def hold(self, nbytes: int):
        import cupy

        with cupy.cuda.Device(self.device.index or 0):
            return cupy.cuda.runtime.malloc(nbytes)

    def release(self, held) -> None:
        import cupy

        cupy.cuda.runtime.free(held)


@register_backend
class HoldsSymmetricMemory(_Holds):
    """Torch symmetric memory, rendezvoused on the group, as the NVLink backends hold theirs."""

    name = "planted_holds_symmetric"

    def hold(self, nbytes: int):
        return rendezvous_workspace(nbytes, self.group, self.device)
