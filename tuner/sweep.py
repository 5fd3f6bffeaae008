"""The sweep: every available backend, correctness-checked then timed, over a grid of cases.

Read top-down: the plan's groups (shape, dtype, routing) -> each point (tokens per rank) of
the grid, or of the adaptive search -> each case (a backend at that point) measured on every
rank together by `tuner.measure` (built at its capacity, gated on the invariant, timed: a
backend that fails the gate is recorded as "incorrect" and is not timed) -> rank 0 commits
the measurement to the store at once, so an interrupted sweep loses nothing and `--resume`
skips what is already there.
The caller checks the plan whole and the store's URL before calling (tuner.plans.build_plan /
check_plan: impossible shapes and cases that cannot fit in a rank's memory are refused in one
line; a2a_tune.db.check_url), and says what runs on the ranks after a completed run (`after`:
`a2a-tune run` publishes the table on every node). Unavailable backends
(availability() says why), backends whose reach the EP group leaves (not applicable:
tuner.cluster) and backends that raise are recorded with their one-line reason and the sweep
goes on; a backend that hangs a case or kills a rank's process is recorded ("timeout",
"crashed") and the ranks restart without it. Before any timing the ranks gather what every
node probed (tuner.cluster): nodes that differ stop the sweep unless `allow_mixed`. Cases a
backend declares infeasible (feasibility(), e.g. beyond a fixed capacity) are skipped and
reported.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from a2a_tune.db import (
    ConnectionLostError,
    LeaseHeartbeat,
    LeaseLostError,
    MeasurementKey,
    StoreError,
    StoreFileLostError,
    Writer,
    mask_secrets,
    open_store,
    resolve_url,
)
from a2a_tune.kernels import BackendEnv, MoEShape, ShapeError, availability_of, engine_names, get_backend
from a2a_tune.kernels.base import REACH_TEXT, reaches

from . import cluster
from .adaptive import AdaptiveSearch
from .cluster import gather_cluster, library_versions
from .groups import EPGroups
from .launch import (
    Heartbeat,
    PeerFailed,
    RankContext,
    RankCrashed,
    RankFailed,
    RanksLost,
    launched_externally,
    one_line,
    run_ranks,
)
from .measure import Backends, Result, input_sets, measure_case
from .plans import DEFAULT_ITERS, DEFAULT_TOKENS, SweepPlan
from .progress import progress_bar
from .runtime.point import Point, Shape

__all__ = [
    "DEFAULT_ITERS",
    "DEFAULT_TOKENS",
    "CompletedRun",
    "SweepOutcome",
    "SweepPlan",
    "sweep",
]  # the plan's names: tuner.plans


@dataclass
class SweepOutcome:
    run_id: int
    fingerprint: str
    world_size: int
    measured: int = 0
    skipped: int = 0  # already in the store (resume)
    failed: dict[str, int] = field(default_factory=dict)  # kind -> count
    unavailable: dict[str, str] = field(default_factory=dict)  # backend -> reason
    not_applicable: dict[str, str] = field(default_factory=dict)  # backend -> why the EP group is beyond its reach
    infeasible: dict[str, str] = field(default_factory=dict)  # backend -> why some cases were skipped
    adaptive_saved: int = 0  # grid points the adaptive search did not need to measure
    status: str = "completed"
    cluster: dict[str, Any] = field(default_factory=dict)  # tuner.cluster.ClusterView.summary()
    after: Any = None  # what the caller's `after` step returned on rank 0 (None: no step)


@dataclass(frozen=True)
class CompletedRun:
    """What the caller's `after` step gets on every rank once the run completed: the store,
    the run in it, and the cluster the ranks formed."""

    db_url: str | None
    run_id: int
    view: cluster.ClusterView


DEFAULT_CASE_TIMEOUT_S = 600.0  # one case: gate + warm-up + timing (first cases also compile kernels)
MAX_RESTARTS = 8
# Failure kinds of a case that lost its ranks (its backend is left out of the rest of the run).
LOST = {"timeout": "timed out", "crashed": "crashed"}


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP stopped the sweep; its run (``run_id``, None if none was opened yet)
    is marked "interrupted" and can be resumed."""

    def __init__(self, run_id: int | None, signal_name: str = "SIGINT") -> None:
        super().__init__(f"run {run_id} interrupted by {signal_name}")
        self.run_id = run_id
        self.signal_name = signal_name


def sweep(
    plan: SweepPlan,
    *,
    device_type: str,
    world_size: int,
    db_url: str | None,
    resume: bool = False,
    progress: bool = True,
    case_timeout: float = DEFAULT_CASE_TIMEOUT_S,
    allow_mixed: bool = False,
    after: Callable[[RankContext, CompletedRun], Any] | None = None,
) -> SweepOutcome | None:
    """Run the sweep on `world_size` ranks (spawned here, or this process's torchrun job).
    Returns the outcome; None on the non-zero ranks of a torchrun/srun job.

    The run has one writer: this process (see a2a_tune.db, "One writer per run"). `resume`
    continues the latest unfinished run of the same plan unless another live process holds
    it (then `RankFailed` says who), leaving out the backends that hung or crashed in it; when
    the plan's latest run completed it changes nothing and reports that run. A sweep that lost
    its run stops without changing it.

    `plan` must be checked whole for `device_type` x `world_size` and `db_url` be a checked
    URL (see the module docstring): ranks start at once.
    `allow_mixed`: sweep even when the nodes differ (tuner.cluster); the run records the mix.
    `after`: the caller's step after a completed run, called on every rank together (it may
    use their process group) as `after(ctx, CompletedRun)`; picklable, for spawned ranks.
    Rank 0's answer is `outcome.after`.

    Spawned ranks are watched: a case that makes no progress for `case_timeout` seconds (a
    hung collective or kernel) gets every rank killed — the only way to free a wedged NCCL
    communicator or GPU — is recorded as a "timeout" failure, its backend is left out of the
    rest of this sweep, and the ranks restart on the same run, skipping what is stored. A
    rank whose process dies in a case (a segfault, ``abort()``, ``os._exit``, the OOM
    killer) is handled the same way, recorded as "crashed" with its exit code or signal.
    A rank that dies outside any case marks the run "failed" and raises `RankCrashed`; a rank's
    error marks it "failed" (rank 0 does) and raises `RankFailed`. Ctrl-C or SIGTERM stops every rank, marks the run "interrupted" and raises
    `SweepInterrupted`; after `kill -9` the run stays "running" and `resume` takes it over.
    """
    writer = Writer.this_process()
    skip: dict[str, str] = {}  # backend -> why the rest of this sweep goes on without it
    lost: dict[str, str] = {}  # backend -> the failure kind it was left out for
    run_id: int | None = None  # known once rank 0 opened the run (its first heartbeat)
    with tempfile.TemporaryDirectory(prefix="a2a-tune-") as tmp:
        heartbeat = Heartbeat(Path(tmp) / "heartbeat.json")
        stalled = None if launched_externally() else heartbeat.stalled_after(case_timeout)
        for _ in range(MAX_RESTARTS + 1):
            try:
                results = run_ranks(
                    _sweep_rank,
                    world_size,
                    device_type,
                    plan,
                    _Target(db_url, resume, run_id, writer),
                    progress,
                    heartbeat,
                    dict(skip),
                    {"allow_mixed": allow_mixed, "after": after},
                    stalled=stalled,
                )
            except RanksLost as exc:
                # A case hung, or a rank's process died in it: the case that rank was in is
                # recorded against its backend, which the restarted ranks leave out.
                doing = heartbeat.of_rank(exc.rank or 0).last()
                run_id = run_id or heartbeat.fact("run_id")
                heartbeat.clear()  # the restarted ranks start a fresh heartbeat
                if doing is None:  # between cases: nothing to blame, nothing to go on without
                    _mark_stopped(db_url, run_id, writer, "failed")
                    raise
                key = MeasurementKey(*doing["key"])
                run_id = doing["run_id"]
                kind, reason = _lost_case(exc, case_timeout)
                _record_lost(db_url, run_id, key, kind, reason, writer)
                skip[key.backend] = _left_out(kind, key.tokens_per_rank, reason)
                lost[key.backend] = kind
                continue  # the same run, held by the same writer
            except KeyboardInterrupt as exc:
                run_id = run_id or heartbeat.fact("run_id")
                _mark_stopped(db_url, run_id, writer, "interrupted")
                raise SweepInterrupted(run_id, getattr(exc, "signal_name", "SIGINT")) from None
            outcome = next((r for r in results if r is not None), None)
            if outcome is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports
                return None
            for backend, why in skip.items():
                outcome.failed[lost[backend]] = outcome.failed.get(lost[backend], 0) + 1
                outcome.infeasible[backend] = why
            return outcome
    _mark_stopped(db_url, run_id, writer, "failed")
    raise RankFailed(f"gave up after {MAX_RESTARTS} restarts of lost ranks")


def _lost_case(exc: RanksLost, case_timeout: float) -> tuple[str, str]:
    """(failure kind, reason) for a case that lost its ranks."""
    if isinstance(exc, RankCrashed):
        return "crashed", f"rank {exc.rank} {exc.how}; every rank was stopped"
    return "timeout", f"no progress for {case_timeout:.0f} s; every rank was stopped"


def _left_out(kind: str, tokens: int | None, reason: str) -> str:
    """Why the rest of a run goes on without a backend that lost the ranks (one of LOST)."""
    return f"{LOST[kind]} at {tokens} tokens/rank ({reason})"


def _record_lost(db_url: str | None, run_id: int, key: MeasurementKey, kind: str, reason: str, writer: Writer) -> None:
    """Record the lost case, taking the run back first: rank 0 may have seen its peer go and
    marked the run failed (releasing it) before it was stopped."""
    with open_store(db_url) as store:
        store.claim_run(run_id, writer)
        store.add_failure(run_id, kind=kind, reason=reason, writer=writer, **key._asdict())


def _mark_stopped(db_url: str | None, run_id: int | None, writer: Writer, status: str) -> None:
    """Mark `run_id` `status` ("interrupted", "failed") for `writer` and release it, so ranks
    that were stopped or died do not leave it "running"; nothing when rank 0 already finished
    it (or the run is another's: the lease decides), when no run was opened, or under
    torchrun/srun (rank 0 records its own end there). Not after a rank's own error: rank 0
    recorded the end itself, and the store may be what failed (a replaced SQLite file must not
    be opened again: the old file's -wal beside it would be replayed into it)."""
    if run_id is None or launched_externally() or _file_gone(db_url):
        return
    try:
        with open_store(db_url) as store:
            store.finish_run(run_id, status, writer=writer)
    except StoreError:
        pass


def _file_gone(db_url: str | None) -> bool:
    """Whether the store is an SQLite file that is not there any more (deleted mid-sweep):
    opening it would create an empty one in its place."""
    from sqlalchemy.engine import make_url

    url = make_url(resolve_url(db_url))
    path = url.database
    return (
        url.get_backend_name() == "sqlite"
        and bool(path)
        and not path.startswith(("file:", ":memory:"))
        and (not os.path.exists(path))
    )


# --------------------------------------------------------------------------------- ranks


def _sweep_rank(
    ctx: RankContext,
    plan: SweepPlan,
    target: _Target,
    show_progress: bool,
    heartbeat: Heartbeat,
    skip: dict,
    job: dict,
):
    rec = _Recorder(ctx, plan, target, heartbeat, job["allow_mixed"])
    if not rec.completed:  # --resume of a completed run has nothing to measure
        _sweep_cases(ctx, plan, rec, {**rec.lost, **skip}, show_progress and rec.is_writer)
    if job["after"] is not None:
        rec.outcome.after = job["after"](ctx, CompletedRun(target.db_url, rec.run_id, rec.view))
    return rec.outcome if rec.is_writer else None


def _sweep_cases(ctx: RankContext, plan: SweepPlan, rec: _Recorder, skip: dict[str, str], show_progress: bool) -> None:
    """Every case of the plan not yet in the run, EP size by EP size (each on its groups of
    consecutive ranks, every group at once: tuner.groups), leaving out the backends of `skip`;
    then the run's end is recorded (completed, or interrupted / failed on the way out)."""
    sizes = plan.sizes(ctx.world_size)
    usable = {size: _usable_backends(ctx, plan, rec, skip, size) for size in sizes}
    try:
        with progress_bar(show_progress, "sweep") as bar:
            # only the cases that can run: backends left out of a size count nothing
            total = sum(len(list(plan.shapes_at(s))) * len(plan.tokens) * len(usable[s]) for s in sizes)
            progress = _Progress(bar, total)
            for size in sizes:
                groups = EPGroups.of(ctx, size)
                try:
                    _sweep_size(plan, rec, groups, usable[size], progress)
                finally:
                    groups.close()
        rec.finish("completed")  # raises when the store lost what it was given: never reported measured
    except KeyboardInterrupt:
        rec.abandon("interrupted")
        raise
    except ConnectionLostError as exc:
        rec.abandon("failed")
        raise ConnectionLostError(
            f"{exc}, mid-sweep; run {rec.run_id} keeps what was stored: rerun the same command with --resume to continue"
        ) from exc
    except StoreFileLostError as exc:
        rec.abandon("failed")
        raise StoreFileLostError(f"{exc}; what this sweep measured is not in {exc.path}", exc.path) from exc
    except BaseException:
        rec.abandon("failed")
        raise


def _sweep_size(plan: SweepPlan, rec: _Recorder, groups: EPGroups, usable: list[str], progress: _Progress) -> None:
    """Every shape of the plan measurable at one EP size, on this rank's group."""
    backends: Backends | None = None
    try:
        for name, shape in plan.shapes_at(groups.ep_size):
            built_for = MoEShape.of(shape, max(plan.tokens))
            if backends is None or backends.shape != built_for:  # groups run shape-major: free the last
                if backends is not None:
                    backends.close()
                backends = Backends(groups.ctx, built_for, capacity=plan.capacity)
            routing = "" if shape.routing == "uniform" else f" {shape.routing}"  # the default goes unsaid
            label = f"EP {groups.ep_size} {name} {shape.dtype}{routing}"  # + T=: one line of the bar at 80 columns
            _sweep_group(plan, rec, groups, backends, label, shape, usable, progress)
    finally:
        if backends is not None:
            backends.close()


def _usable_backends(ctx: RankContext, plan: SweepPlan, rec: _Recorder, skip: dict[str, str], size: int) -> list[str]:
    """The plan's backends that can run here on groups of `size` ranks and reach every such
    group; the others recorded with their reason (the same on every rank: every group of a
    size runs the same backends)."""
    env = BackendEnv.local(size, ctx.device.type)
    groups = ctx.world_size // size
    span, span_text = rec.view.widest_span(size)
    usable: list[str] = []
    for name in plan.backend_names():
        cls = get_backend(name)
        ok, reason = availability_of(cls, env)
        if ok and groups > 1 and cls.sub_group_reason:
            ok, reason = False, f"{cls.sub_group_reason}; EP {size} runs {groups} groups"
        if name in skip:  # hung or crashed earlier in this run
            rec.infeasible(name, skip[name])
        elif not ok:
            rec.not_timed(name, "unavailable", reason, size)
        elif not reaches(cls.reach, span):
            rec.not_timed(
                name, "not_applicable", f"reaches {REACH_TEXT[cls.reach]}; this EP group is {span_text}", size
            )
        else:
            usable.append(name)
    return usable


def _sweep_group(
    plan: SweepPlan,
    rec: _Recorder,
    groups: EPGroups,
    backends: Backends,
    label: str,
    shape: Shape,
    usable: list[str],
    progress: _Progress,
) -> None:
    """One shape: every point of the grid then the refinements, or the points the adaptive
    search asks for."""

    def point(tokens: int, names: list[str]) -> dict[str, float | None]:
        return _run_point(plan, rec, groups, backends, label, shape.at(tokens), names, progress)

    if not plan.adaptive:
        # the whole grid is the coarse pass; the search then only refines crossovers and races
        search = AdaptiveSearch(plan.tokens, tuple(usable), coarse_step=1, refine_ratio=plan.refine_ratio)
        for tokens in plan.tokens:
            progress.advance(0, f"{label} T={tokens}")
            for b, median in point(tokens, usable).items():
                search.observe(tokens, b, median)
        if plan.refine_ratio is not None:
            _follow(search, plan, usable, point, progress)
        return
    search = AdaptiveSearch(plan.tokens, tuple(usable), refine_ratio=plan.refine_ratio)
    _observe_stored(search, rec, shape, usable, plan.tokens)  # a resumed run: what is stored counts
    points = _follow(search, plan, usable, point, progress)
    rec.outcome.adaptive_saved += len(plan.tokens) * len(usable) - points
    progress.advance(len(plan.tokens) * len(usable) - points, label)


def _follow(search: AdaptiveSearch, plan: SweepPlan, usable: list[str], point, progress: _Progress) -> int:
    """Run `search` to its end; how many grid points (tokens, backend) it handed out.

    A full-grid sweep times every usable backend at a refinement count, not only the
    contenders the search asks for: its table has no gaps, so every backend stays in
    lookups over ranges that span the count (an engine's default among them)."""
    points = 0
    while batch := search.next_points():
        for tokens in sorted({t for t, _ in batch}):
            names = [b for t, b in batch if t == tokens]
            if tokens not in plan.tokens:
                if not plan.adaptive:
                    names = [b for b in usable if (tokens, b) not in search.medians]
                progress.grow(len(names))  # beyond the grid's total
            for b, median in point(tokens, names).items():
                search.observe(tokens, b, median)
            points += len(names) if tokens in plan.tokens else 0
    return points


def _observe_stored(search: AdaptiveSearch, rec: _Recorder, shape: Shape, usable, grid) -> None:
    """Feed `search` the medians a resumed run stored for one shape, refinement counts
    between the grid's ends included."""
    for key, median in rec.medians.items():
        point = key.point
        if point.shape == shape and key.backend in usable and grid[0] <= point.tokens_per_rank <= grid[-1]:
            search.observe(point.tokens_per_rank, key.backend, median)


def _run_point(
    plan: SweepPlan,
    rec: _Recorder,
    groups: EPGroups,
    backends: Backends,
    label: str,
    point: Point,
    names: list[str],
    progress: _Progress,
) -> dict[str, float | None]:
    """Every backend of `names` at one point, every group at once: the slowest group's median
    µs, or None (failed / infeasible on any group)."""
    tokens = point.tokens_per_rank
    label = f"{label} T={tokens}"
    keys = {name: MeasurementKey.of(name, point) for name in names}
    result = {name: rec.medians.get(keys[name]) for name in names if keys[name] in rec.done}
    todo = [name for name in names if keys[name] not in rec.done]
    rec.outcome.skipped += len(names) - len(todo)
    progress.advance(len(names) - len(todo), label)
    if not todo:
        return result
    try:
        inputs = input_sets(
            groups.ctx, backends.shape, tokens, routing=point.routing, seed=plan.seed, sets=plan.input_sets
        )
    except ShapeError as exc:
        for name in todo:
            rec.failure(name, "error", str(exc), keys[name])
            result[name] = None
        progress.advance(len(todo), label)
        return result
    for name in todo:
        progress.advance(0, f"{label} {name}")
        rec.beat(keys[name])
        groups.start_together()
        measured = measure_case(groups.ctx, backends, name, tokens, inputs, warmup=plan.warmup, iters=plan.iters)
        result[name] = rec.record(keys[name], groups.agree(measured))
        rec.beat(None)
        progress.advance(1, label)
    return result


class _Progress:
    """The sweep's progress bar (rank 0 with --progress), or nothing."""

    def __init__(self, bar, total: int) -> None:
        self.bar = bar
        self.task = bar.add_task("", total=total) if bar is not None else None

    def advance(self, n: int, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=n, description=text)

    def grow(self, n: int) -> None:
        if self.bar is not None:
            total = next(t.total for t in self.bar.tasks if t.id == self.task)
            self.bar.update(self.task, total=total + n)


@dataclass(frozen=True)
class _Target:
    """Where the ranks record: the store, which run (`run_id` when the ranks restart on a known
    run, else the latest unfinished one with `resume`, else a new one) and as which writer."""

    db_url: str | None
    resume: bool
    run_id: int | None
    writer: Writer


class _Recorder:
    """Rank 0's side of the store, written under the sweep's writer (the run's lease, kept
    fresh by a LeaseHeartbeat thread); other ranks hold a recorder that writes nothing."""

    def __init__(
        self, ctx: RankContext, plan: SweepPlan, target: _Target, heartbeat: Heartbeat, allow_mixed: bool = False
    ):
        self.is_writer = ctx.rank == 0
        self.heartbeat = heartbeat.of_rank(ctx.rank)  # each rank's own: the case a rank died in
        self.writer = target.writer
        self.store = None
        self.lease: LeaseHeartbeat | None = None
        self.world_size = ctx.world_size
        self.sizes = len(plan.sizes(ctx.world_size))
        self._reasons: dict[tuple[str, str], dict[str, list[int]]] = {}  # (kind, backend) -> reason -> EP sizes
        self.view = gather_cluster(ctx)
        self.topology = self.view.topology
        mixed = cluster.check_mixed(self.view, allow_mixed)  # the same answer on every rank, before any timing
        if mixed and self.is_writer:
            print(f"warning: mixed cluster (--allow-mixed): {' | '.join(mixed)}", file=sys.stderr, flush=True)
        header: list[Any] = [None]
        error: Exception | None = None
        if self.is_writer:
            try:
                header[0] = self._open(plan, target, ctx.device.type, ctx.world_size)
            except Exception as exc:  # every rank must learn of it, or they wait forever
                error, header[0] = exc, {"error": one_line(exc)}
        dist.broadcast_object_list(header, src=0)
        if error is not None:
            raise error
        if "error" in header[0]:
            raise PeerFailed(f"rank 0 could not open the run: {header[0]['error']}")
        self.run_id: int = header[0]["run_id"]
        self.done: set[MeasurementKey] = header[0]["done"]
        self.completed: bool = header[0].get("completed", False)  # --resume of a completed run: a no-op
        # (backend, kind, ep_size) a resumed run has
        self.recorded: set[tuple[str, str, int | None]] = header[0].get("recorded", set())
        self.medians: dict[MeasurementKey, float | None] = header[0].get("medians", {})  # for a resumed search
        self.lost: dict[str, str] = header[0].get("lost", {})  # backend -> why the run goes on without it
        self.outcome = SweepOutcome(self.run_id, self.topology.fingerprint, ctx.world_size, cluster=self.view.summary())
        if self.completed:
            self.outcome.skipped = len(self.done)
            self.close()
        elif self.is_writer:
            self.lease = LeaseHeartbeat(self.store, self.run_id, self.writer).__enter__()
            self.beat(None)  # the supervisor learns the run id

    def _open(self, plan: SweepPlan, target: _Target, device_type: str, world: int) -> dict:
        """Open the store and take the run (see _Target)."""
        self.store = open_store(target.db_url)
        topo = self.topology
        hw = self.store.get_or_create_hardware(topo.fingerprint, topo.facts_hash, topo.to_dict())
        config_hash = plan.config_hash(device_type, world)
        run_id = target.run_id
        if run_id is None and target.resume:
            run_id = self.store.find_resumable_run(hw, config_hash)
            if run_id is None and (finished := self._completed_run(topo.fingerprint, hw, config_hash)) is not None:
                # --resume of a plan whose latest run completed: nothing to continue, nothing to write
                return {"run_id": finished, "completed": True, "done": self.store.done_keys(finished)}
        if run_id is not None:
            self.store.claim_run(run_id, self.writer)  # refuses a run another live sweep holds
        else:
            argv = [mask_secrets(arg) for arg in sys.argv[1:]]
            config = {**plan.to_dict(), "device_type": device_type, "world_size": world, "argv": argv}
            # every backend's engine literals, in registry order, so that `select` never needs to
            # import the out-of-tree modules (A2A_TUNE_BACKEND_MODULES) to write this run's table
            config["engine_names"] = [[name, spec] for name, spec in engine_names().items()]
            if device_type == "cuda":  # where the ranks really ran: select's `fabric` per EP size
                config["fabrics"] = self.view.fabrics(plan.sizes(world))
            summary = self.view.summary()
            if len(summary["nodes"]) > 1 or "mixed" in summary:
                config["cluster"] = summary  # which node ran which ranks, and any mix (the table shows it)
            run_id = self.store.start_run(
                hw,
                device_type=device_type,
                world_size=world,
                versions=library_versions(device_type, topo),
                git_sha=None,
                config=config,
                config_hash=config_hash,
                writer=self.writer,
            )
        failures = self.store.failures(run_id)
        recorded = {(f.backend, f.kind, f.ep_size) for f in failures if f.key is None}
        medians = {m.key: m.median_us for m in self.store.measurements(run_id)}
        medians.update({f.key: None for f in failures if f.key is not None})
        # backends that hung or killed a rank earlier in this run: a resumed run goes on without them
        lost = {f.backend: _left_out(f.kind, f.tokens_per_rank, f.reason) for f in failures if f.kind in LOST}
        return {
            "run_id": run_id,
            "done": self.store.done_keys(run_id),
            "recorded": recorded,
            "medians": medians,
            "lost": lost,
        }

    def _completed_run(self, fingerprint: str, hardware_id: int, config_hash: str) -> int | None:
        """The latest run of this plan on this hardware when it is completed, else None."""
        runs = [r for r in self.store.runs(fingerprint) if (r.hardware_id, r.config_hash) == (hardware_id, config_hash)]
        return runs[0].id if runs and runs[0].status == "completed" else None

    def record(self, key: MeasurementKey, result: Result) -> float | None:
        """Store what measuring the case `key` gave; its median µs, or None."""
        if result.kind == "measured":
            self.measurement(key, result)
        elif result.kind == "infeasible":
            self.infeasible(key.backend, result.reason)
        else:
            self.failure(key.backend, result.kind, result.reason, key)
        return result.median_us

    def measurement(self, key: MeasurementKey, result: Result) -> None:
        self.outcome.measured += 1
        self.medians[key] = result.median_us
        if not self.is_writer:
            return
        self.store.add_measurement(self.run_id, result.measurement(key), writer=self.writer)

    def beat(self, key: MeasurementKey | None) -> None:
        """Tell the watching parent which case this rank runs now (None: between cases)."""
        self.heartbeat.beat({"run_id": self.run_id, "key": list(key)} if key else None, run_id=self.run_id)

    def infeasible(self, backend: str, reason: str) -> None:
        self.outcome.infeasible[backend] = reason

    def not_timed(self, backend: str, kind: str, reason: str, ep_size: int) -> None:
        """A backend left out of one EP size ("unavailable", "not_applicable" to its groups):
        recorded once per run and size, with the EP size it is about (none for an unavailable
        backend of a one-size run: the machine, not the size, is why)."""
        said = self.outcome.unavailable if kind == "unavailable" else self.outcome.not_applicable
        sizes = self._reasons.setdefault((kind, backend), {}).setdefault(reason, [])
        sizes.append(ep_size)
        said[backend] = "; ".join(  # one reason at every size is said once
            why if len(at) == self.sizes else f"at EP {','.join(map(str, at))}: {why}"
            for why, at in self._reasons[(kind, backend)].items()
        )
        if kind == "unavailable" and self.sizes == 1:
            ep_size = None
        if (backend, kind, ep_size) in self.recorded:  # a resumed run said so already
            return
        if kind == "unavailable":
            self.outcome.failed[kind] = self.outcome.failed.get(kind, 0) + 1
        if self.is_writer:
            self.store.add_failure(
                self.run_id, backend=backend, kind=kind, reason=reason[:500], ep_size=ep_size, writer=self.writer
            )

    def failure(self, backend: str, kind: str, reason: str, key: MeasurementKey | None = None) -> None:
        self.outcome.failed[kind] = self.outcome.failed.get(kind, 0) + 1
        if not self.is_writer:
            return
        fields = key._asdict() if key is not None else {"backend": backend}
        self.store.add_failure(self.run_id, kind=kind, reason=reason[:500], writer=self.writer, **fields)

    def finish(self, status: str) -> None:
        """Record the run's end and release it. Raises when that fails (LeaseLostError: the run
        was taken over; nothing is changed then); `abandon` is the quiet form for error paths."""
        self.outcome.status = status
        if self.store is None:
            return
        if self.lease is not None:
            self.lease.__exit__(None, None, None)
            self.lease = None
        summary = {
            "measured": self.outcome.measured,
            "skipped": self.outcome.skipped,
            "failed": self.outcome.failed,
        }
        try:
            self.store.finish_run(self.run_id, status, summary=summary, writer=self.writer)
        finally:
            self.close()

    def close(self) -> None:
        """Let go of the store without writing (a run this sweep does not hold)."""
        if self.store is not None:
            self.store.close()
            self.store = None

    def abandon(self, status: str) -> None:
        """`finish` on the way out of an error: the error that got us here is the one to report,
        so a store that fails too (disk full, the run taken over) does not replace it."""
        try:
            self.finish(status)
        except (StoreError, LeaseLostError):
            pass
