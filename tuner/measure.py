"""The one measurement path: build a backend for a point, gate it, time it, agree across ranks.

The sweep, the knob search, the round-trip benchmark (bench/roundtrip.py) and `a2a-tune
check` all measure through here, so a case is built, gated and timed one way:

  1. build (`Backends.get`): at the capacity the point calls for (`capacity_of`), if the
     backend declares the shape feasible (infeasible: skipped, not a failure); constructed
     on every rank, one rank's failure failing all; told the step (`set_step_tokens`);
  2. gate (`gate`): the invariant (`a2a_tune.kernels.reference.check_invariant`) on fresh
     inputs: a backend that breaks it is never timed;
  3. time (`time_agreed`): CUDA-graph replay for capturable backends on CUDA (as engines run
     decode), eager launches otherwise (`tuner.timing`); samples of a backend that gave up a
     flag wait are discarded; every rank agrees on the verdict. Then dispatch and combine
     apart in the same mode (`timing.time_halves`; a failure there costs only the split) and
     the bytes the inputs move (`tuner.figures`); the device memory the backend holds is
     taken when it is built (`Backends`: free memory before construction vs after it and
     one round trip at its capacity; CUDA only).

Every step is collective (every rank of the group calls it) and returns a `Result` of the same
kind on every rank, so all ranks take the same branch: measured (the samples, already the max
over ranks, and the mode they were timed in), passed (gated, not timed), or why not, in the
store's failure vocabulary ("infeasible" is not stored); the reason is the failing rank's own
("failed on another rank" elsewhere). A measured result at its case is one
`runtime.measurement.Measurement` (`Result.measurement`): what the store keeps.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from a2a_tune.kernels import All2AllBackend, MoEShape, feasibility_of, get_backend
from a2a_tune.kernels.reference import RankInputs, check_invariant, input_writes, make_inputs, snapshot
from a2a_tune.kernels.registry import CallFailed, knobs_of

from .figures import Traffic, destination_pairs, traffic_from_pairs
from .launch import RankContext, all_ranks_ok, one_line
from .runtime.measurement import Measurement, MeasurementKey
from .timing import (
    Stats,
    round_trip,
    summarize,
    time_graph_round_trips,
    time_halves,
    time_round_trips,
    unsplit_reason,
)

GAVE_UP = "a flag wait timed out (a peer never signalled); timings discarded"


@dataclass(frozen=True)
class Result:
    """One case's outcome; its kind is the same on every rank."""

    kind: str  # "measured" | "passed" (gated only) | "infeasible" | "error" | "incorrect"
    reason: str = ""  # one line when not ok
    timing: str = ""  # measured: "graph" | "eager"
    device_us: list[float] = field(default_factory=list)  # per round trip, max over ranks
    host_us: list[float] = field(default_factory=list)
    knobs: dict[str, Any] = field(default_factory=dict)  # the backend's settings in effect
    max_rel_error: float | None = None  # gated: the invariant's worst per-token error
    # measured: dispatch and combine apart, per sample, max over ranks ([]: not timed apart)
    dispatch_us: list[float] = field(default_factory=list)
    combine_us: list[float] = field(default_factory=list)
    traffic: Traffic | None = None  # measured: the bytes the timed inputs move (tuner.figures)
    workspace_bytes: int | None = None  # device memory the backend holds per rank (max); None: not measured
    # measured: each EP group's median round trip, in group order (tuner.groups; [] before agreeing)
    group_us: list[float] = field(default_factory=list)

    @property
    def dispatch_median_us(self) -> float | None:
        return statistics.median(self.dispatch_us) if self.dispatch_us else None

    @property
    def combine_median_us(self) -> float | None:
        return statistics.median(self.combine_us) if self.combine_us else None

    def figures(self) -> dict[str, Any]:
        """The figures of this result by name (runtime.measurement.FIGURES; None: not measured)."""
        t = self.traffic
        return {
            "dispatch_us": self.dispatch_median_us,
            "combine_us": self.combine_median_us,
            "dispatch_samples": [round(v, 3) for v in self.dispatch_us] or None,
            "combine_samples": [round(v, 3) for v in self.combine_us] or None,
            "dispatch_logical_bytes": t and t.dispatch_logical,
            "dispatch_link_bytes": t and t.dispatch_link,
            "combine_logical_bytes": t and t.combine_logical,
            "combine_link_bytes": t and t.combine_link,
            "workspace_bytes": self.workspace_bytes,
            "group_us": [round(v, 3) for v in self.group_us] or None,
        }

    def measurement(self, key: MeasurementKey) -> Measurement:
        """This measured result as the case `key`'s Measurement: the round trip's statistics,
        its samples to the nanosecond, the knobs and the figures."""
        return Measurement(
            backend=key.backend,
            point=key.point,
            timing=self.timing,
            **dataclasses.asdict(self.stats),  # median, p10, p90, the median's CI, n
            host_median_us=summarize(self.host_us).median_us,
            samples=[round(s, 3) for s in self.device_us],
            knobs=self.knobs,
            figures=self.figures(),
        )

    @property
    def ok(self) -> bool:
        return self.kind in ("measured", "passed")

    @property
    def stats(self) -> Stats:
        return summarize(self.device_us)

    @property
    def median_us(self) -> float | None:
        return self.stats.median_us if self.kind == "measured" else None


def capacity_for(capacity: int | None, tokens: int) -> int:
    """max_tokens_per_rank a fixed-capacity backend is built with to carry `tokens`: the load's
    own (capacity None, their best case) or an engine's capacity."""
    return max(tokens, 1) if capacity is None else max(capacity, tokens, 1)


def capacity_of(cls: type[All2AllBackend], tokens: int, *, capacity: int | None, largest: int) -> int:
    """The capacity `cls` is built with to time `tokens` per rank. Fixed-capacity backends cost
    what their capacity costs: by default sized to the load, not to the largest count measured
    (their best case); an engine that allocates one workspace for its largest batch pays that
    capacity at every smaller step, which `capacity` (--capacity) measures -- except in the
    backends that take the step's size at run time (`step_sized`), told it as an engine tells
    them. The others are built once for the `largest` count."""
    return capacity_for(capacity, tokens) if cls.capacity_bound else max(largest, 1)


def timing_mode(cls: type[All2AllBackend], device: torch.device) -> str:
    """Graph-capturable backends are timed as engines run them in decode: CUDA-graph replay."""
    return "graph" if cls.graph_capturable and device.type == "cuda" else "eager"


def input_sets(
    ctx: RankContext, shape: MoEShape, tokens: int, *, routing: str = "uniform", seed: int = 0, sets: int = 1
) -> list[RankInputs]:
    """`sets` input sets of this rank (seeds seed, seed+1, ...), rotated by the timers so repeated
    round trips do not replay a warm cache. ShapeError (one line) for a shape or routing the
    world cannot take."""
    shape.validate(ctx.world_size)
    return [
        make_inputs(
            shape, tokens, rank=ctx.rank, world_size=ctx.world_size, routing=routing, seed=seed + i, device=ctx.device
        )
        for i in range(sets)
    ]


class Backends:
    """The backends built for one layer shape on every rank, reused across token counts.

    One instance per backend, built for `largest` tokens per rank, except fixed-capacity ones:
    one per (backend, capacity), the previous capacity's closed when another is built. A
    construction that failed is remembered, so each shape reports it once in full."""

    def __init__(self, ctx: RankContext, shape: MoEShape, *, capacity: int | None = None) -> None:
        self.ctx = ctx
        self.shape = shape  # max_tokens_per_rank: the largest count measured
        self.capacity = capacity
        self._built: dict[tuple[str, int], All2AllBackend | None] = {}
        self._held: dict[tuple[str, int], int | None] = {}  # slot -> workspace bytes (None: not measured)
        if ctx.device.type == "cuda":
            _warm_collectives(ctx)

    def get(self, name: str, tokens: int) -> All2AllBackend | Result:
        """`name` built to run steps of `tokens` per rank (the step's max over ranks, the same
        on every rank) and told that step; or the Result saying why it cannot be."""
        cls = get_backend(name)
        cap = capacity_of(cls, tokens, capacity=self.capacity, largest=self.shape.max_tokens_per_rank)
        shape = dataclasses.replace(self.shape, max_tokens_per_rank=cap)
        slot = (name, cap)
        for old in [s for s in self._built if s[0] == name and s != slot]:
            self._close(old)
        verdict = feasibility_of(cls, shape, self.ctx.world_size)
        feasible, why = verdict
        if isinstance(verdict, CallFailed):  # the backend's own method failed: its error, reported
            return Result("error", why)
        if not feasible:  # e.g. beyond a fixed-capacity backend's slots: not measured, not a failure
            return Result("infeasible", why)
        if slot not in self._built:
            error = ""
            free_before = _free_device_memory(self.ctx.device)
            try:
                self._built[slot] = cls(self.ctx.group, shape, self.ctx.device)
            except Exception as exc:
                self._built[slot], error = None, one_line(exc)
            if not all_ranks_ok(not error, self.ctx):
                self._close(slot)
                self._built[slot] = None
                return Result("error", f"construction failed: {error or 'on another rank'}")
            self._held[slot] = self._workspace(self._built[slot], free_before)
        backend = self._built[slot]
        if backend is None:
            return Result("error", "construction failed (see the first failure of this shape)")
        if tokens:
            backend.set_step_tokens(tokens)
        return backend

    def workspace_bytes(self, name: str, tokens: int) -> int | None:
        """Device memory per rank (max over ranks) the backend `get(name, tokens)` returns holds at
        its capacity; None where not measured (CPU ranks, or the round trip raised)."""
        cap = capacity_of(get_backend(name), tokens, capacity=self.capacity, largest=self.shape.max_tokens_per_rank)
        return self._held.get((name, cap))

    def _workspace(self, backend: All2AllBackend, free_before: int | None) -> int | None:
        """Collective: free device memory before construction minus free memory after it and one
        round trip at its capacity (max_tokens_per_rank), the max over ranks. torch.cuda.mem_get_info
        counts memory outside torch's allocator (symmetric memory, NVSHMEM, FlashInfer's
        workspace); cached blocks nobody holds are released before both readings."""
        if free_before is None:
            return None
        held, ok = 0, True
        try:
            capacity = backend.shape.max_tokens_per_rank
            inputs = make_inputs(
                backend.shape, capacity, rank=self.ctx.rank, world_size=self.ctx.world_size, device=self.ctx.device
            )
            backend.set_step_tokens(None)  # the capacity
            round_trip(backend, inputs)
            del inputs
            vars(backend).pop("_timing_expert_out", None)  # the timers' stand-in expert output, not the backend's
            held = free_before - _free_device_memory(self.ctx.device)
        except Exception:  # the gate reports what is wrong with the backend
            ok = False
        if not all_ranks_ok(ok, self.ctx):
            return None
        agreed = torch.tensor([held], dtype=torch.int64, device=self.ctx.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.ctx.group)
        return max(0, int(agreed.item()))

    def _close(self, slot: tuple[str, int]) -> None:
        self._held.pop(slot, None)
        backend = self._built.pop(slot, None)
        if backend is not None:
            try:
                backend.close()
            except Exception as exc:  # a workspace not freed is no reason to lose the sweep: say so, go on
                print(f"warning: {slot[0]}: close() raised {one_line(exc, 200)}", file=sys.stderr)

    def close(self) -> None:
        for slot in list(self._built):
            self._close(slot)

    def __enter__(self) -> Backends:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _warm_collectives(ctx: RankContext) -> None:
    """Collective: one small all_to_all, all_gather and reduce_scatter on the group, so the buffers
    NCCL sets up at a collective's first use (per-peer channels at the first all_to_all) are in
    place before any backend's memory is read, not charged to the first backend that calls it."""
    one = torch.zeros(ctx.world_size, device=ctx.device)
    dist.all_to_all_single(torch.empty_like(one), one, group=ctx.group)
    dist.all_gather_into_tensor(torch.empty(ctx.world_size**2, device=ctx.device), one, group=ctx.group)
    dist.reduce_scatter_tensor(torch.empty(1, device=ctx.device), one, group=ctx.group)
    torch.cuda.synchronize(ctx.device)


def _free_device_memory(device: torch.device) -> int | None:
    """Free memory of `device` in bytes once queued work finished and unheld cached blocks went
    back to the driver; None on CPU ranks (device memory is not measured there)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def traffic(ctx: RankContext, shape: MoEShape, inputs: Sequence[RankInputs]) -> Traffic:
    """Collective: the bytes `inputs` move per rank per direction, averaged over the ranks and
    the input sets (`tuner.figures`: logical and link bytes of dispatch and combine)."""
    counts = [destination_pairs(i.topk_ids, shape.num_experts, ctx.world_size, ctx.rank) for i in inputs]
    total = torch.tensor([[p for p, _ in counts], [q for _, q in counts]], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(total, group=ctx.group)
    per_rank = total.sum(dim=1) / (ctx.world_size * len(inputs))
    return traffic_from_pairs(float(per_rank[0]), float(per_rank[1]), shape.dtype, shape.hidden)


_T = TypeVar("_T")


def gate(backend: All2AllBackend, inputs: RankInputs) -> Result:
    """The invariant on `inputs`: "passed", or "incorrect" / "error" (the backend raised)."""
    check = check_invariant(backend, inputs)
    if check.ok:
        return Result("passed", max_rel_error=check.max_rel_error)
    return Result("error" if check.crashed else "incorrect", check.reason, max_rel_error=check.max_rel_error)


def time_agreed(
    ctx: RankContext,
    backend: All2AllBackend,
    inputs: Sequence[RankInputs],
    *,
    warmup: int,
    iters: int,
    timing: str | None = None,
    split: bool = True,
) -> Result:
    """Time round trips in `timing` mode (default: `timing_mode`): "measured", or "error"
    when the timer raised, the backend gave up a flag wait, or its `knobs()` raised or blocked
    (`kernels.registry.knobs_of`) on any rank, with the failing rank's reason on every rank.
    `split`: then time dispatch and combine apart and count the bytes (the knob search, which
    compares round trips only, leaves them out)."""
    mode = timing or timing_mode(type(backend), ctx.device)
    timer = time_graph_round_trips if mode == "graph" else time_round_trips
    samples, error = _attempt(backend, lambda: timer(backend, inputs, warmup=warmup, iters=iters))
    knobs: dict[str, Any] = {}
    if not error:  # out-of-tree code too: bounded and caught, agreed with the verdict (kernels.registry)
        knobs, error = knobs_of(backend)
    if not all_ranks_ok(not error, ctx):
        return Result("error", _agreed_reason(ctx, error))
    device_us, host_us = samples
    measured = Result("measured", timing=mode, device_us=device_us, host_us=host_us, knobs=knobs)
    if not split:
        return measured
    dispatch_us, combine_us = _halves(ctx, backend, inputs, warmup=warmup, iters=iters, graph=mode == "graph")
    return dataclasses.replace(
        measured, dispatch_us=dispatch_us, combine_us=combine_us, traffic=traffic(ctx, backend.shape, inputs)
    )


def _attempt(backend: All2AllBackend, timer: Callable[[], _T]) -> tuple[_T | None, str]:
    """(`timer()`'s samples, "") on this rank, or (None, why): it raised, or the backend gave up
    a flag wait (its samples are garbage). The caller agrees on it across ranks."""
    try:
        samples = timer()
    except Exception as exc:
        return None, one_line(exc)
    return (None, GAVE_UP) if backend.gave_up() else (samples, "")


def _agreed_reason(ctx: RankContext, error: str) -> str:
    """Collective, once some rank failed (every rank calls it): this rank's own `error`, or on a
    rank that did not fail, "rank N: its reason" of the first rank that did."""
    reasons: list[str] = [""] * ctx.world_size
    dist.all_gather_object(reasons, error, group=ctx.group)
    failed = next(((r, why) for r, why in enumerate(reasons) if why), None)
    return error or (f"rank {failed[0]}: {failed[1]}" if failed else "failed on another rank")


def _halves(
    ctx: RankContext, backend: All2AllBackend, inputs: Sequence[RankInputs], *, warmup: int, iters: int, graph: bool
) -> tuple[list[float], list[float]]:
    """Dispatch and combine samples (`timing.time_halves`), or ([], []) when the mode cannot split
    the round trip honestly (`timing.unsplit_reason`) or cutting the chain failed on any rank:
    the round trip already measured stands alone, as in stores from before."""
    if unsplit_reason(backend, graph):  # the same on every rank: the backend's class and device type
        return [], []
    halves, error = _attempt(backend, lambda: time_halves(backend, inputs, warmup=warmup, iters=iters, graph=graph))
    return halves if all_ranks_ok(not error, ctx) else ([], [])


def measure(
    ctx: RankContext,
    backend: All2AllBackend,
    inputs: Sequence[RankInputs],
    *,
    warmup: int,
    iters: int,
    timing: str | None = None,
    split: bool = True,
) -> Result:
    """Gate on the first input set, then time: never a timing of a backend that just failed,
    nor of one that wrote into any input set while it was timed (checked against copies taken
    before the gate; "incorrect" on every rank)."""
    originals = [snapshot(i) for i in inputs]
    checked = gate(backend, inputs[0])
    if not checked.ok:
        return checked
    timed = time_agreed(ctx, backend, inputs, warmup=warmup, iters=iters, timing=timing, split=split)
    wrote = next((w for w in map(input_writes, inputs, originals) if w), "")
    if not all_ranks_ok(not wrote, ctx):
        return Result("incorrect", f"{wrote} while timed" if wrote else "failed on another rank")
    return timed


def measure_case(
    ctx: RankContext,
    backends: Backends,
    name: str,
    tokens: int,
    inputs: Sequence[RankInputs],
    *,
    warmup: int,
    iters: int,
) -> Result:
    """One case: `name` built (or reused) for steps of `tokens` per rank, gated, timed."""
    backend = backends.get(name, tokens)
    if isinstance(backend, Result):
        return backend
    result = measure(ctx, backend, inputs, warmup=warmup, iters=iters)
    return dataclasses.replace(result, workspace_bytes=backends.workspace_bytes(name, tokens))
