"""The rank side of the sweep: what every rank runs, case by case, and rank 0's writes.

Each rank gathers the cluster, opens (rank 0) or learns the run, then walks the plan's cases
(`SweepPlan.cases`) EP size by EP size on its group (tuner.groups): per shape the grid of
token counts, or the adaptive search's points, each backend measured by `tuner.measure`
(gated, then timed) and committed by rank 0 at once, so an interrupted sweep loses nothing
and `--resume` skips what is stored. Backends that are unavailable, beyond the group's reach
or infeasible are recorded with their one-line reason; rank 0 tells the parent which case it
is in (`Heartbeat`), so the supervisor (tuner.sweep) can blame a hung or crashed case.
"""

from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import dataclass, field
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
)
from a2a_tune.kernels import BackendEnv, MoEShape, ShapeError, availability_of, engine_names, get_backend
from a2a_tune.kernels.base import REACH_TEXT, reaches

from . import cluster
from .adaptive import AdaptiveSearch
from .cluster import gather_cluster, library_versions
from .groups import EPGroups
from .launch import Heartbeat, PeerFailed, RankContext, one_line
from .measure import Backends, Result, input_sets, measure_case
from .plans import Case, SweepPlan, plan_difference
from .progress import progress_bar
from .runtime.point import Point, Shape


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


class ResumeRefused(ValueError):
    """--resume found an unfinished run here planned otherwise (one line: which, what differs)."""


# Failure kinds of a case that lost its ranks (its backend is left out of the rest of the run).
LOST = {"timeout": "timed out", "crashed": "crashed"}


def left_out(kind: str, tokens: int | None, reason: str) -> str:
    """Why the rest of a run goes on without a backend that lost the ranks (one of LOST)."""
    return f"{LOST[kind]} at {tokens} tokens/rank ({reason})"


def sweep_rank(
    ctx: RankContext,
    plan: SweepPlan,
    target: Target,
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
    cases = list(plan.cases())
    sizes = plan.sizes()
    usable = {size: _usable_backends(ctx, plan, rec, skip, size) for size in sizes}
    try:
        with progress_bar(show_progress, "sweep") as bar:
            # only the cases that can run: backends left out of a size count nothing
            total = sum(len(c.tokens) * len(usable[c.ep_size]) for c in cases)
            progress = _Progress(bar, total)
            for size in sizes:
                groups = EPGroups.of(ctx, size)
                try:
                    at_size = [c for c in cases if c.ep_size == size]
                    _sweep_size(plan, rec, groups, at_size, usable[size], progress)
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


def _sweep_size(
    plan: SweepPlan, rec: _Recorder, groups: EPGroups, cases: list[Case], usable: list[str], progress: _Progress
) -> None:
    """The cases of one EP size, on this rank's group."""
    backends: Backends | None = None
    try:
        for case in cases:
            built_for = MoEShape.of(case.shape, max(case.tokens))
            if backends is None or backends.shape != built_for:  # cases run shape-major: free the last
                if backends is not None:
                    backends.close()
                backends = Backends(groups.ctx, built_for, capacity=plan.capacity)
            names = [b for b in usable if b in case.backends]
            _sweep_group(plan, rec, groups, backends, case.label, case.shape, names, progress)
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
class Target:
    """Where the ranks record: the store, which run (`run_id` when the ranks restart on a known
    run, else the latest unfinished one with `resume`, else a new one) and as which writer.
    `launched_at`: when the command began, before any rank started: a new run's `launched_at`,
    a resumed one's `resumed_at` (a2a_tune.db's Run)."""

    db_url: str | None
    resume: bool
    run_id: int | None
    writer: Writer
    launched_at: _dt.datetime


class _Recorder:
    """Rank 0's side of the store, written under the sweep's writer (the run's lease, kept
    fresh by a LeaseHeartbeat thread); other ranks hold a recorder that writes nothing."""

    def __init__(
        self, ctx: RankContext, plan: SweepPlan, target: Target, heartbeat: Heartbeat, allow_mixed: bool = False
    ):
        self.is_writer = ctx.rank == 0
        self.heartbeat = heartbeat.of_rank(ctx.rank)  # each rank's own: the case a rank died in
        self.writer = target.writer
        self.store = None
        self.lease: LeaseHeartbeat | None = None
        self.world_size = ctx.world_size
        self.sizes = len(plan.sizes())
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

    def _open(self, plan: SweepPlan, target: Target, device_type: str, world: int) -> dict:
        """Open the store and take the run (see Target)."""
        self.store = open_store(target.db_url)
        topo = self.topology
        hw = self.store.get_or_create_hardware(topo.fingerprint, topo.facts_hash, topo.to_dict())
        config_hash = plan.config_hash(device_type, world)
        run_id = target.run_id
        resuming_none = None  # --resume found no run of this plan: why, said once the new run is open
        if run_id is None and target.resume:
            run_id = self.store.find_resumable_run(hw, config_hash)
            if run_id is None and (finished := self._completed_run(topo.fingerprint, hw, config_hash)) is not None:
                # --resume of a plan whose latest run completed: nothing to continue, nothing to write
                return {"run_id": finished, "completed": True, "done": self.store.done_keys(finished)}
            if run_id is None:
                resuming_none = self._nothing_to_resume(plan, device_type, world, topo.fingerprint, hw)
        if run_id is not None:  # refuses a run another live sweep holds; a --resume records when it began
            resumed_at = target.launched_at if target.run_id is None else None
            self.store.claim_run(run_id, self.writer, resumed_at=resumed_at)
        else:
            argv = [mask_secrets(arg) for arg in sys.argv[1:]]
            config = {**plan.to_dict(), "device_type": device_type, "world_size": world, "argv": argv}
            # every backend's engine literals, in registry order, so that `select` never needs to
            # import the out-of-tree modules (A2A_TUNE_BACKEND_MODULES) to write this run's table
            config["engine_names"] = [[name, spec] for name, spec in engine_names().items()]
            if device_type == "cuda":  # where the ranks really ran: select's `fabric` per EP size
                config["fabrics"] = self.view.fabrics(plan.sizes())
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
                launched_at=target.launched_at,
            )
            if resuming_none is not None:
                print(f"--resume: {resuming_none}; started run {run_id}", file=sys.stderr, flush=True)
        failures = self.store.failures(run_id)
        recorded = {(f.backend, f.kind, f.ep_size) for f in failures if f.key is None}
        medians = {m.key: m.median_us for m in self.store.measurements(run_id)}
        medians.update({f.key: None for f in failures if f.key is not None})
        # backends that hung or killed a rank earlier in this run: a resumed run goes on without them
        lost = {f.backend: left_out(f.kind, f.tokens_per_rank, f.reason) for f in failures if f.kind in LOST}
        return {
            "run_id": run_id,
            "done": self.store.done_keys(run_id),
            "recorded": recorded,
            "medians": medians,
            "lost": lost,
        }

    def _nothing_to_resume(self, plan: SweepPlan, device_type: str, world: int, fingerprint: str, hw: int) -> str:
        """--resume with no run of this plan here: ResumeRefused when this machine's latest run is
        unfinished (it is the run the operator meant, planned otherwise: resuming it needs its
        own options, and a new run would measure its stored points again); else why a new run
        starts (no run here, or the latest completed)."""
        latest = next((r for r in self.store.runs(fingerprint) if r.hardware_id == hw), None)
        if latest is None:
            return "no run on this machine to resume"
        if latest.status == "completed":
            return f"no unfinished run of this plan on this machine (the latest, run {latest.id}, completed)"
        why = plan_difference(latest.config, plan, device_type, world)
        raise ResumeRefused(
            f"--resume: this machine's latest run, run {latest.id} ({latest.status}), has another plan: {why}; "
            "rerun with its options to resume it, or without --resume to start a new run"
        )

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
