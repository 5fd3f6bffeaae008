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
    fp8            256, 100; 2 calls block-FP8 payloads (backends that carry quantized ones)
    graph-replays  64, 5 replays     one CUDA-graph capture replayed with fresh inputs
                                     (graph-capturable backends; CUDA only)

A case is "ok" (the invariant held on every rank and call), "FAIL" (wrong results, a crash,
a failed construction, or no progress for `timeout` seconds: a hung backend is stopped and
reported, and the next backend runs), or "skip" with the reason (the backend declares the
shape infeasible, or the case needs what this run lacks).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from a2a_tune.kernels import BackendEnv, MoEShape, ShapeError, get_backend
from a2a_tune.kernels.reference import TOLERANCE, graph_replay_error

from .launch import Heartbeat, RankContext, RankFailed, RanksStalled, all_ranks_ok, one_line, run_ranks
from .measure import Backends, Result, gate, input_sets
from .shapes import ModelShape

DEFAULT_TIMEOUT_S = 300.0  # one case, first kernel compilations included


@dataclass(frozen=True)
class Case:
    name: str
    tokens: tuple[int, ...]  # rank r holds tokens[r % len(tokens)]
    routing: str = "uniform"
    dtype: str = "bf16"
    calls: int = 1  # round trips checked on one instance (graph: replays of one capture)
    graph: bool = False

    def tokens_of(self, world_size: int) -> list[int]:
        return [self.tokens[r % len(self.tokens)] for r in range(world_size)]


CASES = (
    Case("uniform", (128, 77)),
    Case("skewed-zero", (0, 300), routing="skewed"),
    Case("local", (64,), routing="local"),
    Case("repeated", (1024,), calls=3),
    Case("fp8", (256, 100), dtype="fp8_e4m3", calls=2),
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


def check(
    names: Sequence[str],
    shapes: Sequence[ModelShape],
    *,
    device_type: str,
    world_size: int,
    required: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_backend: Callable[[str, list[Row]], None] | None = None,
) -> list[Row]:
    """Check each backend of `names` on every case and shape, each backend in its own launch of
    `world_size` ranks. A backend that is unavailable here is skipped with its reason, or
    FAILs when `required` (it was asked for by name). `on_backend(name, rows)` after each."""
    env = BackendEnv.local(world_size, device_type)
    rows: list[Row] = []
    for name in names:
        ok, reason = get_backend(name).availability(env)
        if ok:
            got = _check_backend(name, shapes, device_type, world_size, timeout)
        else:
            got = [Row(name, "-", "-", "FAIL" if required else "skip", f"unavailable: {reason}")]
        rows += got
        if on_backend is not None:
            on_backend(name, got)
    return rows


def _check_backend(name: str, shapes, device_type: str, world_size: int, timeout: float) -> list[Row]:
    """One launch of ranks for `name`; rank 0 appends each case's row to a file as it goes, so
    the rows of a launch that hangs or dies are kept and its last case is the one to blame."""
    with tempfile.TemporaryDirectory(prefix="a2a-tune-check-") as tmp:
        heartbeat = Heartbeat(Path(tmp) / "heartbeat.json")
        rows_file = Path(tmp) / "rows.jsonl"
        failure = None
        try:
            run_ranks(
                _check_rank,
                world_size,
                device_type,
                name,
                list(shapes),
                heartbeat,
                str(rows_file),
                stalled=heartbeat.stalled_after(timeout),
            )
        except RanksStalled:
            failure = f"hung: no progress for {timeout:.0f} s; its ranks were stopped, its remaining cases not run"
        except RankFailed as exc:
            failure = f"ranks failed: {exc}"
        rows = [Row(**json.loads(line)) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
        if failure is not None:
            doing = heartbeat.last() or {"shape": "-", "case": "-"}
            rows.append(Row(name, doing["shape"], doing["case"], "FAIL", failure))
    return rows


def _check_rank(ctx: RankContext, name: str, shapes: list[ModelShape], heartbeat: Heartbeat, rows_file: str) -> None:
    cls = get_backend(name)
    for model in shapes:
        for i, case in enumerate(CASES):
            if case.graph and not cls.graph_capturable:
                continue  # not applicable
            if ctx.rank == 0:
                heartbeat.beat({"shape": model.name, "case": case.name})
            start = time.perf_counter()
            row = _check_case(ctx, name, model, case, seed=1000 * i)
            row.seconds = round(time.perf_counter() - start, 2)
            if ctx.rank == 0:
                with open(rows_file, "a") as f:
                    f.write(json.dumps(asdict(row)) + "\n")
                heartbeat.beat(None)


def _check_case(ctx: RankContext, name: str, model: ModelShape, case: Case, seed: int) -> Row:
    """Collective: every rank returns the same verdict."""
    tokens = case.tokens_of(ctx.world_size)
    row = Row(name, model.name, case.name, "ok", tokens=tokens, dtype=case.dtype)
    if case.graph and ctx.device.type != "cuda":
        row.status, row.reason = "skip", "CUDA-graph replays need --device cuda"
        return row
    step = max(tokens)  # the step's max over ranks, as an engine tells it
    shape = MoEShape(model.num_experts, model.topk, model.hidden, step, case.dtype)
    try:
        calls = [
            input_sets(ctx, shape, tokens[ctx.rank], routing=case.routing, seed=seed + call)[0]
            for call in range(case.calls)
        ]
    except ShapeError as exc:  # the same on every rank: the world or routing cannot take this shape
        row.status, row.reason = "skip", str(exc)
        return row
    with Backends(ctx, shape) as built:
        backend = built.get(name, step)
        if isinstance(backend, Result):
            row.status, row.reason = ("skip" if backend.kind == "infeasible" else "FAIL"), backend.reason
            return row
        verdict = _graph_verdict(ctx, backend, step, case) if case.graph else _calls_verdict(backend, calls)
    if verdict.max_rel_error is not None and math.isfinite(verdict.max_rel_error):  # inf: it crashed
        row.max_rel_error = verdict.max_rel_error
    if not verdict.ok:
        row.status, row.reason = "FAIL", f"{verdict.kind}: {verdict.reason}"
    return row


def _calls_verdict(backend, calls) -> Result:
    """The invariant on each call in turn; the first failure, else the worst error."""
    worst = 0.0
    for inputs in calls:
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
    worst = float(agreed.item())
    tolerance = TOLERANCE[case.dtype]
    if worst > tolerance:
        return Result("incorrect", f"replay error {worst:.3g} > tolerance {tolerance:g}", max_rel_error=worst)
    return Result("passed", max_rel_error=worst)


def render(rows: Sequence[Row]):
    """The rows as a rich Table: one line per backend, shape and case (tokens and dtypes per
    case: the module docstring, `a2a-tune check --help`, the --json rows)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    table.add_column("backend", no_wrap=True)
    table.add_column("shape", no_wrap=True)
    table.add_column("case", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("max error", justify="right", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    table.add_column("reason", overflow="fold")
    style = {"ok": "green", "FAIL": "bold red", "skip": "dim"}
    for i, r in enumerate(rows):
        first = i == 0 or rows[i - 1].backend != r.backend
        last = i == len(rows) - 1 or rows[i + 1].backend != r.backend
        table.add_row(
            escape(r.backend) if first else "",
            r.shape,
            r.case,
            f"[{style[r.status]}]{r.status}[/]",
            "" if r.max_rel_error is None else f"{r.max_rel_error:.2g}",
            "" if r.seconds is None else f"{r.seconds:.1f}",
            escape(r.reason),
            end_section=last,
        )
    return table
