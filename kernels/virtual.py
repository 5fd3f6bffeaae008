"""Virtual ranks: the W ranks of one EP group in one process, on one device (ARCHITECTURE.md,
"Virtual ranks"), for checking a backend's device code at any W on a single GPU, or on CPU
under Triton's interpreter (TRITON_INTERPRET=1).

torch symmetric memory and NCCL refuse two ranks on one device, so the ranks cannot be
processes. A backend with `virtual_ranks` (the symmetric-memory ones: ours, and any
out-of-tree backend on their kernel-module host API) reaches its peers only through its
`rendezvous`: here each of W instances is built with a `VirtualRank` as its group and gets its
region of one zeroed allocation. The instances are the classes the sweep runs (the step check,
the handle, block-FP8 quantization, knobs).

The ranks run in phase order on the current stream: every rank's dispatch_send, then every
rank's dispatch_recv, the expert, every combine_send, every combine_recv. A wait therefore never
needs a rank that has not run yet: host work between launches (a JIT compile, a lazy module load)
cannot make it give up, and on CPU, where a spinning "rank" would block the only thread, the
same order runs. Between phases (eager calls) the host reads every rank's flags: one still
missing after every rank's send is a skipped signal, reported at once instead of spun on.

Timings taken this way move bytes through one device's memory, not the link between GPUs:
never a machine's figures. They are labelled `VIRTUAL_TIMING`, which the store refuses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from a2a_tune.tuner.runtime.point import MAX_EP_SIZE
from a2a_tune.tuner.runtime.text import one_line

from .base import All2AllBackend, Dispatched, MoEShape
from .errors import ShapeError, VirtualRanksError
from .reference import (
    TOLERANCE,
    CheckResult,
    RankInputs,
    capture_graph,
    combine_error,
    dispatch_problem,
    expected_output,
    expert_outputs,
    expert_scales,
    input_writes,
    make_inputs,
    refill,
    relative_error,
    snapshot,
)
from .registry import feasibility_of

# No limit of its own beyond an EP group's (MAX_EP_SIZE): memory is the limit (W workspaces on
# one device), which `a2a_tune.tuner.check` sizes each case to before anything is allocated.
MAX_VIRTUAL_RANKS = MAX_EP_SIZE
VIRTUAL_TIMING = "virtual"  # the timing label of virtual-rank samples; db refuses to store it
_ALIGN = 256  # what RankState requires between workspaces (and a cache line pair on GPUs)


class VirtualRank:
    """The `group` one virtual rank's backend instance is built with."""

    def __init__(self, world: VirtualWorld, rank: int) -> None:
        self.virtual_world = world
        self.rank = rank

    def __repr__(self) -> str:
        return f"VirtualRank({self.rank} of {self.virtual_world.size})"


class VirtualWorld:
    """W virtual ranks on `device`: builds a backend's W instances over one allocation."""

    def __init__(self, size: int, device: torch.device | str) -> None:
        if not 2 <= size <= MAX_VIRTUAL_RANKS:
            raise ShapeError(f"virtual ranks: a world of 2..{MAX_VIRTUAL_RANKS}, got {size}")
        self.size = size
        self.device = torch.device(device)
        self._building: list | None = None  # [nbytes, stride, allocation, next rank] of build()

    def rendezvous(
        self, nbytes: int, group: VirtualRank, device: torch.device
    ) -> tuple[torch.Tensor, list[int], object]:
        """`SymmetricMemoryBackend.rendezvous` for virtual ranks, called by rank 0, 1, ... in turn
        (`build`): rank 0 allocates W zeroed workspaces (symmetric memory starts zeroed too),
        each rank gets its own; every rank's base address is known from the start."""
        if group.rank == 0:
            stride = -(-nbytes // _ALIGN) * _ALIGN
            self._building = [nbytes, stride, torch.zeros(self.size * stride, dtype=torch.uint8, device=device), 0]
        building = self._building
        if building is None or building[3] != group.rank or building[0] != nbytes:
            raise VirtualRanksError("virtual ranks rendezvous out of order: build them with VirtualWorld.build")
        nbytes, stride, whole, _ = building
        building[3] += 1
        base = whole.data_ptr()
        mine = whole[group.rank * stride : group.rank * stride + nbytes]
        return mine, [base + r * stride for r in range(self.size)], whole

    def build(self, cls: type[All2AllBackend], shape: MoEShape, *, step: int | None = None) -> VirtualRanks:
        """W instances of `cls` for `shape`, told the step (`set_step_tokens`). ShapeError when
        the shape cannot run on W ranks or `cls` declares it infeasible (as the sweep skips it);
        VirtualRanksError when `cls` needs ranks of its own."""
        if not cls.virtual_ranks:
            raise VirtualRanksError(f"{cls.name} cannot run on virtual ranks: its transport needs one process per rank")
        shape.validate(self.size)
        ok, why = feasibility_of(cls, shape, self.size)
        if not ok:
            raise ShapeError(why)
        backends: list[All2AllBackend] = []
        try:
            for r in range(self.size):
                backends.append(cls(VirtualRank(self, r), shape, self.device))
        except BaseException:
            for b in backends:
                b.close()
            raise
        finally:
            self._building = None
        ranks = VirtualRanks(backends)
        ranks.set_step_tokens(step)
        return ranks


@dataclass
class VirtualTimings:
    """Round trips of the whole W-rank sequence: one device's HBM standing in for the link.
    A kernel's fixed costs (launches, the flag protocol) at T = 1, never a machine's table."""

    backend: str
    world: int
    device: str
    us: list[float] = field(default_factory=list)  # per round trip of all W ranks
    timing: str = VIRTUAL_TIMING


class VirtualRanks:
    """One backend's W instances (rank r = `backends[r]`), run in phase order."""

    def __init__(self, backends: list[All2AllBackend]) -> None:
        self.backends = backends

    @property
    def size(self) -> int:
        return len(self.backends)

    @property
    def shape(self) -> MoEShape:
        return self.backends[0].shape

    @property
    def device(self) -> torch.device:
        return self.backends[0].device

    def set_step_tokens(self, step: int | None) -> None:
        for b in self.backends:
            b.set_step_tokens(step)

    def set_knobs(self, knobs: dict) -> None:
        for b in self.backends:
            b.set_knobs(knobs)

    def gave_up(self) -> list[int]:
        """Ranks whose flag wait timed out since they were built (host sync)."""
        return [r for r, b in enumerate(self.backends) if b.gave_up()]

    def close(self) -> None:
        for b in self.backends:
            b.close()

    def __enter__(self) -> VirtualRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def inputs(self, tokens: Sequence[int], *, routing: str = "uniform", seed: int = 0) -> list[RankInputs]:
        """Every rank's inputs (rank r holds tokens[r]), as the ranks of a process group make them."""
        return [
            make_inputs(self.shape, t, rank=r, world_size=self.size, routing=routing, seed=seed, device=self.device)
            for r, t in enumerate(tokens)
        ]

    # ---------------------------------------------------------------------------- phases

    def dispatch(self, inputs: Sequence[RankInputs], *, check_signals: bool = True) -> list[Dispatched]:
        """Every rank's dispatch_send, then every rank's dispatch_recv."""
        handles = [b.dispatch_send(i.x, i.topk_ids, i.topk_weights) for b, i in zip(self.backends, inputs)]
        if check_signals:
            self._signalled(0, "dispatch")
        return [b.dispatch_recv(h) for b, h in zip(self.backends, handles)]

    def combine(
        self, expert_out: Sequence[torch.Tensor], dispatched: Sequence[Dispatched], *, check_signals: bool = True
    ) -> list[torch.Tensor]:
        """Every rank's combine_send, then every rank's combine_recv: y of each rank."""
        for b, out, d in zip(self.backends, expert_out, dispatched):
            b.combine_send(out, d)
        if check_signals:
            self._signalled(1, "combine")
        return [b.combine_recv(d) for b, d in zip(self.backends, dispatched)]

    def round_trip(
        self, inputs: Sequence[RankInputs], scales: torch.Tensor, *, check_signals: bool = True
    ) -> list[torch.Tensor]:
        """dispatch -> the reference expert compute -> combine on every rank: y of each rank."""
        ds = self.dispatch(inputs, check_signals=check_signals)
        outs = [expert_outputs(b, d, scales) for b, d in zip(self.backends, ds)]
        return self.combine(outs, ds, check_signals=check_signals)

    def _signalled(self, row: int, phase: str) -> None:
        """After every rank's send: every flag of `row` must be up (host sync; eager only)."""
        for r, b in enumerate(self.backends):
            state = getattr(b, "state", None)
            missing = state.unsignalled(row) if state is not None else []
            if missing:
                raise VirtualRanksError(
                    f"rank {r}: no {phase} flag from rank(s) {', '.join(map(str, missing))} after every rank's "
                    f"{phase}_send (a skipped signal)"
                )

    # ----------------------------------------------------------------------- the invariant

    def check(
        self, inputs: Sequence[RankInputs], *, scales: torch.Tensor | None = None, tolerance: float | None = None
    ) -> CheckResult:
        """`reference.check_invariant` over the W virtual ranks: one verdict for all, naming the
        first rank that failed; ShapeError (the caller's inputs) is raised as there."""
        scales = expert_scales(self.shape.num_experts, self.device) if scales is None else scales.to(self.device)
        tol = TOLERANCE[self.shape.dtype] if tolerance is None else tolerance
        originals = [snapshot(i) for i in inputs]
        verdict = self._check(inputs, originals, scales, tol)
        for r, (i, o) in enumerate(zip(inputs, originals)):
            if wrote := input_writes(i, o):
                return CheckResult(False, verdict.max_rel_error, f"rank {r}: {wrote}")
        return verdict

    def _check(
        self, inputs: Sequence[RankInputs], originals: Sequence[RankInputs], scales: torch.Tensor, tol: float
    ) -> CheckResult:
        """`check`'s verdict on what the ranks returned, judged against `originals`."""
        try:
            ds = self.dispatch(inputs)
            for r, (b, d) in enumerate(zip(self.backends, ds)):
                if problem := dispatch_problem(b, d):
                    return CheckResult(False, float("inf"), f"rank {r}: {problem}")
            outs = [expert_outputs(b, d, scales) for b, d in zip(self.backends, ds)]
            ys = self.combine(outs, ds)
        except ShapeError:
            raise
        except VirtualRanksError as exc:  # a skipped signal: wrong results, no crash
            return CheckResult(False, float("inf"), str(exc))
        except Exception as exc:  # a crashing backend is a failed check, reported in one line
            return CheckResult(False, float("inf"), one_line(exc), crashed=True)
        worst, first = 0.0, ""
        for r, (y, i) in enumerate(zip(ys, originals)):
            err, reason = combine_error(y, i, scales, tol)
            worst = max(worst, err)
            first = first or (f"rank {r}: {reason}" if reason else "")
        if gave := self.gave_up():
            first = first or f"rank {gave[0]}: a flag wait timed out (a peer never signalled)"
        return CheckResult(not first, worst, first)

    def graph_replay_error(self, tokens: Sequence[int], replays: int) -> float:
        """`reference.graph_replay_error` for the whole W-rank sequence: every rank's dispatch,
        expert compute and combine captured once in one CUDA graph, replayed `replays` times with
        fresh inputs copied into the captured ones; the worst per-token relative error over all
        ranks. CUDA only; VirtualRanksError when a wait gave up during the replays."""
        scales = expert_scales(self.shape.num_experts, self.device)
        static = self.inputs(tokens, seed=0)

        graph, ys = capture_graph(
            lambda: self.round_trip(static, scales, check_signals=False),  # no host reads under capture
            warmup=lambda: self.round_trip(static, scales),  # the warm-up checks every signal
        )
        worst = 0.0
        for rep in range(replays):
            fresh = self.inputs(tokens, seed=100 + rep)
            for s, f in zip(static, fresh):
                refill(s, f)
            graph.replay()
            for y, f in zip(ys, fresh):
                if len(y):
                    worst = max(worst, relative_error(y, expected_output(f, scales)))
        torch.cuda.synchronize()
        if gave := self.gave_up():
            raise VirtualRanksError(f"rank {gave[0]}: a flag wait timed out during the graph replays")
        return worst

    def time_round_trips(self, inputs: Sequence[RankInputs], *, warmup: int = 3, iters: int = 10) -> VirtualTimings:
        """Wall time of dispatch + combine of all W ranks in phase order (device-synchronised on
        CUDA; the expert compute is not in it: combine sends a fixed output), after `warmup`
        checked round trips: `VIRTUAL_TIMING`, a kernel's fixed costs, never a machine's figures."""
        scales = expert_scales(self.shape.num_experts, self.device)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        outs = None
        for _ in range(warmup):
            ds = self.dispatch(inputs)
            outs = [expert_outputs(b, d, scales) for b, d in zip(self.backends, ds)]
            self.combine(outs, ds)
        out = VirtualTimings(self.backends[0].name, self.size, str(self.device))
        for _ in range(iters):
            sync()
            start = time.perf_counter()
            ds = self.dispatch(inputs, check_signals=False)
            outs = outs or [
                d.x.new_zeros(d.x.shape[0], self.shape.hidden, dtype=b.dtype) for b, d in zip(self.backends, ds)
            ]
            self.combine(outs, ds, check_signals=False)
            sync()
            out.us.append((time.perf_counter() - start) * 1e6)
        if gave := self.gave_up():
            raise VirtualRanksError(f"rank {gave[0]}: a flag wait timed out while timing")
        return out
