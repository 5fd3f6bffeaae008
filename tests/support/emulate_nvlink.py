"""The shipped NVLink backends on CPU: each rank a process over gloo, their Triton kernels under
Triton's interpreter (TRITON_INTERPRET=1), torch symmetric memory replaced by shared files.

Only the transport is emulated. On GPUs every rank maps every peer's workspace through CUDA
IPC; here every rank maps every rank's workspace file (MAP_SHARED) into its own address space,
so a kernel's store into a peer's region lands in the peer's process and the flags signal
across processes as they do across GPUs. Everything else is the backends' own code: the
construction and its barrier, `set_step_tokens` and its ShapeError, block-FP8 quantization
(the torch path), the kernels, the handle. The ranks run concurrently, so between round trips
only the device-side flags order the rounds, as in a replayed CUDA graph.

`run_ranks(emulate, W, "cpu", directory, worlds)` runs them (`directory`: where the workspace
files go); the parent sets TRITON_INTERPRET=1 before the ranks start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from invariant_cases import Case, run_cases
from nvlink_cases import NVLINK

from a2a_tune.kernels import MoEShape, ShapeError, get_backend, list_backends, register_backend
from a2a_tune.kernels._symmetric_backend import SymmetricMemoryBackend
from a2a_tune.kernels.reference import expected_output, expert_compute, expert_scales, make_inputs


class SharedFileRendezvous:
    """`SymmetricMemoryBackend.rendezvous` over files: call n creates this rank's zeroed file
    `ws<n>-rank<r>` (symmetric memory starts zeroed too), then maps every rank's. Every rank
    builds its backends in the same order, so call n names the same workspace everywhere."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.calls = 0

    def __call__(self, nbytes: int, group, device: torch.device) -> tuple[torch.Tensor, list[int], object]:
        n, self.calls = self.calls, self.calls + 1
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        files = [self.directory / f"ws{n}-rank{r}" for r in range(world)]
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(files[rank], "wb") as f:
            f.truncate(nbytes)
        dist.barrier(group=group)
        maps = [torch.from_file(str(p), shared=True, size=nbytes, dtype=torch.uint8) for p in files]
        return maps[rank], [m.data_ptr() for m in maps], maps  # page-aligned: 256-byte deltas


class _OffByOneSlot:
    """Mixed into an NVLink backend: the received rows move one slot on (a destination bug)."""

    def dispatch(self, x, topk_ids, topk_weights):
        d = super().dispatch(x, topk_ids, topk_weights)
        d.x = torch.roll(d.x, 1, dims=0)
        return d


@dataclass(frozen=True)
class RoundTrips:
    """Round trips back to back on one backend instance, with no host synchronisation between
    them: round i at step steps[i] (set_step_tokens; None: the capacity), fresh inputs each."""

    id: str
    backend: str
    tokens: tuple[int, ...]  # per rank
    steps: tuple[int | None, ...]
    experts: int = 8
    topk: int = 2
    hidden: int = 8
    dtype: str = "fp32"
    capacity: int | None = None  # default: the most tokens

    def shape(self) -> MoEShape:
        return MoEShape(self.experts, self.topk, self.hidden, self.capacity or max(max(self.tokens), 1), self.dtype)


@dataclass(frozen=True)
class World:
    """What runs on W ranks: `run_cases(cases)` (the sweep's invariant check, agreed over the
    ranks), each of `trips`, and a combine after the step changed since its dispatch on each
    of `mid_trip_step_change` (backends)."""

    size: int
    cases: list[Case]
    trips: list[RoundTrips]
    mid_trip_step_change: list[str]


def placement(sizes: list[int], launch: int) -> dict[int, int]:
    """World size -> its first rank in a launch of `launch` ranks: each world takes the ranks
    after the previous one, or the last ones when too few are left; worlds sharing no rank run
    at the same time. Every size is at most `launch`."""
    first, free = {}, 0
    for size in sorted(sizes):
        first[size] = min(free, launch - size)
        free = first[size] + size
    return first


def emulate(ctx, directory: str, worlds: list[World]) -> dict[int, dict]:
    """Rank function: run each world on its ranks (`placement`) over a gloo subgroup, so one
    launch (the largest world's ranks) covers every size. -> {size: {"rank": this rank in
    that world, "invariant": {case id: result}, "trips": {trips id: this rank's (received
    rows, ids all local, worst relative error) per round}, "mid_trip": {backend: error}}}
    for the worlds this rank is in."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before the ranks start"
    for name in NVLINK:  # registered in the ranks only: the test session's registry stays as shipped
        if f"planted_{name}" not in list_backends():
            register_backend(type(f"Planted_{name}", (_OffByOneSlot, get_backend(name)), {"name": f"planted_{name}"}))
    first = placement([w.size for w in worlds], ctx.world_size)
    groups = {w.size: dist.new_group(list(range(first[w.size], first[w.size] + w.size))) for w in worlds}  # every rank
    out = {}
    for w in sorted(worlds, key=lambda w: w.size):
        rank = ctx.rank - first[w.size]
        if not 0 <= rank < w.size:
            continue
        sub = replace(ctx, rank=rank, world_size=w.size, group=groups[w.size])
        SymmetricMemoryBackend.rendezvous = SharedFileRendezvous(Path(directory) / f"w{w.size}")
        out[w.size] = {
            "rank": rank,
            "invariant": run_cases(sub, w.cases),
            "trips": {t.id: _round_trips(sub, t) for t in w.trips},
            "mid_trip": {name: _step_change_mid_trip(sub, name) for name in w.mid_trip_step_change},
        }
    return out


def _round_trips(ctx, trips: RoundTrips) -> list[tuple[int, bool, float]]:
    shape = trips.shape()
    b = get_backend(trips.backend)(ctx.group, shape, ctx.device)
    scales = expert_scales(shape.num_experts)
    lo, hi = b.local_expert_range()
    out = []
    for i, step in enumerate(trips.steps):
        b.set_step_tokens(step)
        inputs = make_inputs(shape, trips.tokens[ctx.rank], rank=ctx.rank, world_size=ctx.world_size, seed=i)
        d = b.dispatch(inputs.x, inputs.topk_ids, inputs.topk_weights)
        local = not bool(((d.topk_ids != -1) & ((d.topk_ids < lo) | (d.topk_ids >= hi))).any())
        y = b.combine(expert_compute(d.x, d.topk_ids, d.topk_weights, scales, d.x_scale, b.shape.dtype), d)
        ref = expected_output(inputs, scales)
        err = float(((y.float() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max()) if len(y) else 0.0
        out.append((d.x.shape[0], local, err))
    b.close()
    return out


def _step_change_mid_trip(ctx, backend: str) -> str:
    """Dispatch at a step of 2, combine after set_step_tokens(3): the handle refuses before any
    kernel runs (on every rank, so no rank waits for another)."""
    shape = MoEShape(8, 2, 8, 4)
    b = get_backend(backend)(ctx.group, shape, ctx.device)
    b.set_step_tokens(2)
    inputs = make_inputs(shape, 2, rank=ctx.rank, world_size=ctx.world_size)
    d = b.dispatch(inputs.x, inputs.topk_ids, inputs.topk_weights)
    b.set_step_tokens(3)
    try:
        b.combine(torch.zeros(d.x.shape[0], shape.hidden, dtype=b.dtype), d)
    except ShapeError as exc:
        return str(exc)
    finally:
        b.close()
    return "no error"
