"""Conformance: every backend against the invariant over the standard cases (`a2a-tune check`).

What a backend must pass before its timings mean anything, run as the sweep runs it (built at
its capacity, told the step, gated by `tuner.measure`) but never timed. For out-of-tree
backend authors as much as for ours: name your module in `A2A_TUNE_BACKEND_MODULES` and run
`a2a-tune check --backend NAME`.

Cases, per backend and model shape (rank r holds the r-th count of `tokens`, cycled):

    uniform        128, 77 tokens    ranks with different loads
    skewed-zero    0, 300            a rank with no tokens; Zipf-skewed expert popularity
    local          64                every token's experts on its own rank: nothing leaves it
    repeated       1024, 3 calls     one instance, repeated round trips (workspace reuse)
    fp8            256, 100; 2 calls block-FP8 payloads (backends that carry them)
    nvfp4          256, 100; 2 calls NVFP4 payloads: e2m1 pairs + e4m3 scales per 16 (as vLLM
                                     dispatches ModelOpt NVFP4 checkpoints)
    mxfp8          128, 77           MXFP8 payloads: e4m3 + E8M0 scales per 32
                                     (a backend that does not carry one: "skip", "does not carry")
    steps          200, 64; 3 calls  built for an engine's capacity (512), told steps of
                                     256, 64 and 200 tokens (a rank holds at most the step)
    graph-replays  64, 5 replays     one CUDA-graph capture replayed with fresh inputs
                                     (graph-capturable backends; CUDA only)

Design notes: docs/architecture.md, "Module notes", `tuner/check.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from a2a_tune.kernels import Availability, BackendEnv, MoEShape, ShapeError, availability_of, get_backend
from a2a_tune.kernels.base import case_bytes
from a2a_tune.kernels.reference import TOLERANCE, graph_replay_error
from a2a_tune.kernels.virtual import VirtualWorld

from .launch import Heartbeat, RankContext, RankFailed, RanksStalled, all_ranks_ok, one_line, run_ranks
from .measure import Backends, Result, capacity_of, gate, input_sets
from .plans import _gib
from .shapes import ModelShape

DEFAULT_TIMEOUT_S = 300.0  # one case, first kernel compilations included
# --device cpu --virtual: every case's token counts times this (the interpreter runs a program
# per token slot in Python, ~5 ms each: 1024 tokens on 8 ranks would take minutes per call)
INTERPRETER_TOKEN_SCALE = 1 / 64


@dataclass(frozen=True)
class Case:
    name: str
    tokens: tuple[int, ...]  # rank r holds tokens[r % len(tokens)] (at most the call's step)
    routing: str = "uniform"
    dtype: str = "bf16"
    calls: int = 1  # round trips checked on one instance (graph: replays of one capture)
    graph: bool = False
    capacity: int | None = None  # an engine's capacity [default: the step's]
    steps: tuple[int, ...] = ()  # the step told before each call [default: the most tokens]

    def tokens_of(self, world_size: int) -> list[int]:
        return [self.tokens[r % len(self.tokens)] for r in range(world_size)]

    def plan(self, world_size: int) -> list[tuple[int, list[int]]]:
        """Per call: (the step, every rank's tokens)."""
        tokens = self.tokens_of(world_size)
        if not self.steps:
            return [(max(tokens), tokens)] * self.calls
        return [(step, [min(t, step) for t in tokens]) for step in self.steps]

    def scaled(self, scale: float) -> Case:
        """The case at `scale` times its token counts (a count above 0 stays above 0)."""
        if scale == 1:
            return self

        def f(n: int) -> int:
            return max(1, round(n * scale)) if n else 0

        return dataclasses.replace(
            self,
            tokens=tuple(map(f, self.tokens)),
            capacity=f(self.capacity) if self.capacity else None,
            steps=tuple(map(f, self.steps)),
        )


CASES = (
    Case("uniform", (128, 77)),
    Case("skewed-zero", (0, 300), routing="skewed"),
    Case("local", (64,), routing="local"),
    Case("repeated", (1024,), calls=3),
    Case("fp8", (256, 100), dtype="fp8_e4m3", calls=2),
    Case("nvfp4", (256, 100), dtype="nvfp4", calls=2),
    Case("mxfp8", (128, 77), dtype="mxfp8"),
    Case("steps", (200, 64), capacity=512, steps=(256, 64, 200)),
    Case("graph-replays", (64,), calls=5, graph=True),
)


@dataclass
class Row:
    """One backend on one case and shape."""

    backend: str
    shape: str
    case: str
    status: str  # "ok" | "FAIL" | "skip"
    reason: str = ""
    tokens: list[int] = field(default_factory=list)  # per rank
    dtype: str = ""
    max_rel_error: float | None = None
    seconds: float | None = None
    virtual: bool = False  # the ranks were virtual ranks of one device (one process)


def check(
    names: Sequence[str],
    shapes: Sequence[ModelShape],
    *,
    device_type: str,
    world_size: int,
    required: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_backend: Callable[[str, list[Row]], None] | None = None,
    virtual: bool = False,
    token_scale: float = 1.0,
) -> list[Row]:
    """Check each backend of `names` on every case and shape, each backend in its own launch of
    `world_size` ranks (virtual: one process holding them all). A backend that is unavailable
    here is skipped with its reason, or FAILs when `required` (it was asked for by name).
    `on_backend(name, rows)` after each."""
    env = None if virtual else BackendEnv.local(world_size, device_type)
    rows: list[Row] = []
    for name in names:
        if virtual:
            ok, reason = virtual_availability(name, device_type, world_size)
        else:
            ok, reason = availability_of(get_backend(name), env)
        if ok:
            got = _check_backend(name, shapes, device_type, world_size, timeout, virtual, token_scale)
        else:
            got = [Row(name, "-", "-", "FAIL" if required else "skip", f"unavailable: {reason}", virtual=virtual)]
        rows += got
        if on_backend is not None:
            on_backend(name, got)
    return rows


def virtual_availability(name: str, device_type: str, world_size: int) -> Availability:
    """Whether `name` runs on `world_size` virtual ranks of one `device_type` device."""
    cls = get_backend(name)
    if not cls.virtual_ranks:
        return Availability(False, "needs a process per rank (collectives), so not on virtual ranks")
    if not BackendEnv.has_package("triton"):
        return Availability(False, "triton not installed")
    if device_type != "cuda":
        return Availability(True)  # the interpreter: no device needs (the check sets TRITON_INTERPRET)
    # one device stands for every rank: peers are regions of its own memory
    return availability_of(cls, dataclasses.replace(BackendEnv.local(world_size, "cuda"), peer_access=True))


@contextmanager
def _interpreted(on: bool) -> Iterator[None]:
    """TRITON_INTERPRET=1 for the ranks about to be spawned (it must be set before Triton's
    kernels are defined, i.e. before a2a_tune.kernels is imported there)."""
    before = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if on and before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        elif on:
            os.environ["TRITON_INTERPRET"] = before


def _check_backend(
    name: str, shapes, device_type: str, world_size: int, timeout: float, virtual: bool, token_scale: float
) -> list[Row]:
    """One launch of ranks for `name` (virtual: of one process); rank 0 appends each case's row
    to a file as it goes, so the rows of a launch that hangs or dies are kept and its last case
    is the one to blame."""
    with tempfile.TemporaryDirectory(prefix="a2a-tune-check-") as tmp:
        heartbeat = Heartbeat(Path(tmp) / "heartbeat.json")
        rows_file = Path(tmp) / "rows.jsonl"
        failure = None
        try:
            with _interpreted(virtual and device_type == "cpu"):
                run_ranks(
                    _check_rank,
                    1 if virtual else world_size,
                    device_type,
                    name,
                    list(shapes),
                    heartbeat,
                    str(rows_file),
                    world_size if virtual else None,
                    token_scale,
                    stalled=heartbeat.stalled_after(timeout),
                )
        except RanksStalled:
            failure = f"hung: no progress for {timeout:.0f} s; its ranks were stopped, its remaining cases not run"
        except RankFailed as exc:
            failure = f"ranks failed: {exc}"
        rows = [Row(**json.loads(line)) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
        if failure is not None:
            doing = heartbeat.last() or {"shape": "-", "case": "-"}
            rows.append(Row(name, doing["shape"], doing["case"], "FAIL", failure, virtual=virtual))
    return rows


def _check_rank(
    ctx: RankContext,
    name: str,
    shapes: list[ModelShape],
    heartbeat: Heartbeat,
    rows_file: str,
    virtual_size: int | None,
    token_scale: float,
) -> None:
    cls = get_backend(name)
    world = None if virtual_size is None else VirtualWorld(virtual_size, ctx.device)
    for model in shapes:
        for i, case in enumerate(CASES):
            if case.graph and not cls.graph_capturable:
                continue  # not applicable
            if ctx.rank == 0:
                heartbeat.beat({"shape": model.name, "case": case.name})
            start = time.perf_counter()
            case = case.scaled(token_scale)
            if world is None:
                row = _check_case(ctx, name, model, case, seed=1000 * i)
            else:
                row = _check_case_virtual(world, name, model, case, seed=1000 * i)
            row.seconds = round(time.perf_counter() - start, 2)
            if ctx.rank == 0:
                with open(rows_file, "a") as f:
                    f.write(json.dumps(asdict(row)) + "\n")
                heartbeat.beat(None)


def _case_shape(model: ModelShape, case: Case, plan: list[tuple[int, list[int]]]) -> MoEShape:
    """The shape of the case's largest step: the backends' capacity unless the case has one."""
    largest = max(case.capacity or 0, *(step for step, _ in plan))
    return MoEShape(model.num_experts, model.topk, model.hidden, largest, case.dtype)


def _check_case(ctx: RankContext, name: str, model: ModelShape, case: Case, seed: int) -> Row:
    """Collective: every rank returns the same verdict."""
    plan = case.plan(ctx.world_size)
    row = Row(name, model.name, case.name, "ok", tokens=case.tokens_of(ctx.world_size), dtype=case.dtype)
    if case.graph and ctx.device.type != "cuda":
        row.status, row.reason = "skip", "CUDA-graph replays need --device cuda"
        return row
    shape = _case_shape(model, case, plan)
    try:
        calls = [
            (step, input_sets(ctx, shape, tokens[ctx.rank], routing=case.routing, seed=seed + call)[0])
            for call, (step, tokens) in enumerate(plan)
        ]
    except ShapeError as exc:  # the same on every rank: the world or routing cannot take this shape
        row.status, row.reason = "skip", str(exc)
        return row
    with Backends(ctx, shape, capacity=case.capacity) as built:
        if case.graph:
            backend = built.get(name, plan[0][0])
            verdict = backend if isinstance(backend, Result) else _graph_verdict(ctx, backend, plan[0][0], case)
        else:
            verdict = _calls_verdict(built, name, calls)
    return _verdict_row(row, verdict)


def _verdict_row(row: Row, verdict: Result) -> Row:
    """The row of a case that ran: ok, skip (the backend declares a step infeasible) or FAIL."""
    if verdict.kind == "infeasible":
        row.status, row.reason = "skip", verdict.reason
        return row
    if verdict.max_rel_error is not None and math.isfinite(verdict.max_rel_error):  # inf: it crashed
        row.max_rel_error = verdict.max_rel_error
    if not verdict.ok:
        built = verdict.reason.startswith("construction failed")  # said as is, like an infeasible step
        row.status, row.reason = "FAIL", verdict.reason if built else f"{verdict.kind}: {verdict.reason}"
    return row


def _calls_verdict(built: Backends, name: str, calls) -> Result:
    """The invariant on each call in turn, at its step; the first failure, else the worst error."""
    worst = 0.0
    for step, inputs in calls:
        backend = built.get(name, step)
        if isinstance(backend, Result):
            return backend
        verdict = gate(backend, inputs)
        if not verdict.ok:
            return verdict
        worst = max(worst, verdict.max_rel_error or 0.0)
    return Result("passed", max_rel_error=worst)


def _graph_verdict(ctx: RankContext, backend, tokens: int, case: Case) -> Result:
    error, worst = "", float("inf")
    try:
        worst = graph_replay_error(backend, tokens, case.calls)
    except Exception as exc:
        error = one_line(exc)
    if not all_ranks_ok(not error, ctx):
        return Result("error", error or "failed on another rank")
    agreed = torch.tensor([worst], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=ctx.group)
    return _replay_result(float(agreed.item()), case)


def _replay_result(worst: float, case: Case) -> Result:
    tolerance = TOLERANCE[case.dtype]
    if worst > tolerance:
        return Result("incorrect", f"replay error {worst:.3g} > tolerance {tolerance:g}", max_rel_error=worst)
    return Result("passed", max_rel_error=worst)


# What one device keeps beside a virtual case: the CUDA context, the allocator's slack, Triton.
VIRTUAL_RESERVE_BYTES = 2 * 1024**3
SMALLEST_SCALE = 1 / 1024  # a case shrunk further than this is skipped instead


def virtual_case_bytes(cls, model: ModelShape, case: Case, world_size: int) -> int:
    """At most the bytes the W virtual ranks of `case` allocate on one device (each rank's
    `case_bytes` at its capacity and its largest step)."""
    plan = case.plan(world_size)
    shape = _case_shape(model, case, plan)
    capacity = capacity_of(cls, plan[0][0], capacity=case.capacity, largest=shape.max_tokens_per_rank)
    built = dataclasses.replace(shape, max_tokens_per_rank=max(capacity, 1))
    return world_size * case_bytes(cls, built, world_size, max(max(step, 1) for step, _ in plan))


def device_free_bytes(device: torch.device) -> int | None:
    """What one device can still give a virtual case: free GPU memory, or the host's on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return max(torch.cuda.mem_get_info(device)[0] - VIRTUAL_RESERVE_BYTES, 0)
    from .launch import host_memory_available

    available = host_memory_available()
    return None if available is None else max(available - VIRTUAL_RESERVE_BYTES, 0)


def fit_virtual_case(cls, model: ModelShape, case: Case, world_size: int, free: int | None) -> tuple[Case | None, str]:
    """`case`, or the case at half, a quarter... of its token counts, whose W ranks fit in `free`
    bytes, and a note saying why it shrank; (None, why) when even the smallest does not fit."""
    need = virtual_case_bytes(cls, model, case, world_size)
    if free is None or need <= free:
        return case, ""
    scale = 0.5
    while scale >= SMALLEST_SCALE:
        smaller = case.scaled(scale)
        if virtual_case_bytes(cls, model, smaller, world_size) <= free:
            return smaller, (
                f"token counts x{scale:g} to fit one device: {_gib(need)} at full size for {world_size} ranks, "
                f"{_gib(free)} free"
            )
        scale /= 2
    return None, f"needs {_gib(need)} on one device for {world_size} virtual ranks, {_gib(free)} free"


def _check_case_virtual(world: VirtualWorld, name: str, model: ModelShape, case: Case, seed: int) -> Row:
    """One case on the world's virtual ranks: the backend's W instances built as `Backends`
    builds them (capacity, step), the invariant over all ranks per call, or the graph replays;
    skipped when the shape cannot take the case's routing at W, sized to the device's memory
    (and, should the bound be short, halved again after running out of memory)."""
    row = Row(name, model.name, case.name, "ok", tokens=case.tokens_of(world.size), dtype=case.dtype, virtual=True)
    if case.graph and world.device.type != "cuda":
        row.status, row.reason = "skip", "CUDA-graph replays need --device cuda"
        return row
    problem = model.at(world.size, case.dtype, case.routing).problem(measuring=True)
    if problem:  # e.g. 'local' routing with top-k beyond one rank's experts: not this shape's case
        row.status, row.reason = "skip", problem
        return row
    cls = get_backend(name)
    fitted, note = fit_virtual_case(cls, model, case, world.size, device_free_bytes(world.device))
    if fitted is None:  # refused before anything is allocated
        row.status, row.reason = "skip", note
        return row
    scale = 1.0
    while True:
        row.tokens = fitted.tokens_of(world.size)
        try:
            verdict = _virtual_case_verdict(world, cls, model, fitted, seed)
        except torch.OutOfMemoryError:
            scale /= 2
            if scale < SMALLEST_SCALE:
                row.status, row.reason = "skip", "out of device memory even at the smallest token counts"
                return row
            fitted = fitted.scaled(0.5)
            note = f"token counts halved {round(math.log2(1 / scale))}x more after running out of memory"
            continue
        break
    row = _verdict_row(row, verdict)
    if note and row.status == "ok":
        row.reason = note
    return row


def _virtual_case_verdict(world: VirtualWorld, cls, model: ModelShape, case: Case, seed: int) -> Result:
    """Build the case's W instances and check it; torch.OutOfMemoryError goes to the caller."""
    plan = case.plan(world.size)
    shape = _case_shape(model, case, plan)
    capacity = capacity_of(cls, plan[0][0], capacity=case.capacity, largest=shape.max_tokens_per_rank)
    try:
        ranks = world.build(cls, dataclasses.replace(shape, max_tokens_per_rank=capacity), step=plan[0][0] or None)
    except ShapeError as exc:  # the shape cannot run on W ranks, or the backend declares it infeasible
        return Result("infeasible", str(exc))
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        return Result("error", f"construction failed: {one_line(exc)}")
    with ranks:
        try:
            return _virtual_verdict(ranks, case, plan, seed)
        except torch.OutOfMemoryError:
            raise
        except ShapeError as exc:  # e.g. more tokens than the step: the caller's mistake, one line
            return Result("error", str(exc))
        except Exception as exc:  # a graph capture that failed, a wait that gave up in the replays
            return Result("error", one_line(exc))


def _virtual_verdict(ranks, case: Case, plan, seed: int) -> Result:
    if case.graph:
        return _replay_result(ranks.graph_replay_error(plan[0][1], case.calls), case)
    worst = 0.0
    for call, (step, tokens) in enumerate(plan):
        ranks.set_step_tokens(step or None)
        verdict = ranks.check(ranks.inputs(tokens, routing=case.routing, seed=seed + call))
        if not verdict.ok:
            kind = "error" if verdict.crashed else "incorrect"
            return Result(kind, verdict.reason, max_rel_error=verdict.max_rel_error)
        worst = max(worst, verdict.max_rel_error)
    return Result("passed", max_rel_error=worst)


def render(rows: Sequence[Row], console, title: str | None = None) -> None:
    """Print the rows as rich Tables: one line per backend, case and shape (tokens and dtypes
    per case: the module docstring, `a2a-tune check --help`, the --json rows). Narrow: the
    shape, error and seconds follow in a second table."""
    from rich.table import Column
    from rich.text import Text

    from .console import print_fitted

    style = {"ok": "green", "FAIL": "bold red", "skip": "dim"}
    columns = [
        Column("backend", no_wrap=True),
        Column("case", no_wrap=True),
        Column("shape", no_wrap=True),
        Column("result", no_wrap=True),
        Column("max error", justify="right", no_wrap=True),
        Column("s", justify="right", no_wrap=True),
        Column("reason"),  # prose: wraps at spaces
    ]
    cells, ends = [], []
    for i, r in enumerate(rows):
        first = i == 0 or rows[i - 1].backend != r.backend
        cells.append(
            (
                Text(r.backend if first else ""),  # Text: a name is never markup
                Text(r.case),
                Text(r.shape),
                Text(r.status, style=style[r.status]),
                "" if r.max_rel_error is None else f"{r.max_rel_error:.2g}",
                "" if r.seconds is None else f"{r.seconds:.1f}",
                Text(r.reason),
            )
        )
        ends.append(i == len(rows) - 1 or rows[i + 1].backend != r.backend)
    print_fitted(
        console,
        columns,
        cells,
        key=2,
        stack=(5, 4, 2),
        title=title,
        stacked_title="shapes, errors and seconds of the same cases",
        ends=ends,
        show_edge=False,
        pad_edge=False,
    )
