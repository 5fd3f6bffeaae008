"""The sweep: every available backend, correctness-checked then timed, over a grid of cases.

One case = (model shape, payload dtype, routing, tokens per rank, backend). For each case,
on every rank together:
  1. the invariant check (a2a_tune.kernels.reference.check_invariant) on fresh inputs —
     a backend that fails it is recorded as "incorrect" and is not timed;
  2. warm-up, then timed round trips (tuner.timing): CUDA-graph replay for backends that
     can be captured (as engines run decode), eager launches for the others;
  3. rank 0 commits the measurement to the store at once, so an interrupted sweep loses
     nothing and `--resume` skips what is already there.
Unavailable backends (availability() says why), impossible shapes and backends that raise
are recorded with their one-line reason and the sweep goes on. Cases a backend declares
infeasible (feasibility(), e.g. beyond a fixed capacity) are skipped and reported.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from a2a_tune.db import Heartbeat, LeaseLostError, StoreError, Writer, check_url, mask_secrets, open_store
from a2a_tune.kernels import BackendEnv, MoEShape, ShapeError, get_backend, list_backends
from a2a_tune.kernels._flashinfer import flashinfer_version
from a2a_tune.kernels.reference import check_invariant, make_inputs

from .adaptive import AdaptiveSearch
from .launch import (
    PeerFailed,
    RankContext,
    RankFailed,
    RanksStalled,
    all_ranks_ok,
    launched_externally,
    one_line,
    run_ranks,
)
from .probe import Topology, cpu_topology, merge_nodes, probe
from .progress import progress_bar
from .shapes import ModelShape
from .timing import summarize, time_graph_round_trips, time_round_trips

DEFAULT_TOKENS = {
    # 1 .. 16384 tokens per rank (decode to prefill): powers of 2 and 3·2^k between them. The
    # 3·2^k points matter: capacity-sized kernels (FlashInfer's) are slower off powers of 2 than
    # interpolating between powers of 2 predicts, which cost the table up to 10% at held-out
    # counts on 2xH200 with a powers-of-2-only grid.
    "cuda": tuple(sorted({2**i for i in range(15)} | {3 * 2**i for i in range(13)})),
    "cpu": (1, 4, 16, 64, 256),  # gloo on CPU: enough to see a crossover in minutes
}
DEFAULT_ITERS = {"cuda": (10, 50), "cpu": (3, 15)}  # (warm-up, timed) round trips per case


def capacity_for(capacity: int | None, tokens: int) -> int:
    """max_tokens_per_rank a fixed-capacity backend is built with to carry `tokens`: the load's
    own (capacity None, their best case) or an engine's capacity."""
    return max(tokens, 1) if capacity is None else max(capacity, tokens, 1)


@dataclass(frozen=True)
class SweepPlan:
    shapes: tuple[ModelShape, ...]
    tokens: tuple[int, ...]
    dtypes: tuple[str, ...] = ("bf16",)
    routings: tuple[str, ...] = ("uniform",)
    backends: tuple[str, ...] = ()  # empty = every registered backend
    warmup: int = 10
    iters: int = 50
    input_sets: int = 3  # rotated so repeated iterations do not hit a warm cache
    seed: int = 0
    adaptive: bool = False  # tuner.adaptive: coarse grid + bisection at crossovers, not every point
    # Tokens per rank fixed-capacity backends are built for. None: each token count's own (their
    # best case); an engine's largest batch per rank: what that engine pays at every step.
    capacity: int | None = None
    # Refine crossovers and close races between neighbouring token counts (tuner.adaptive)
    # while they are more than this ratio apart; None: measure the grid only.
    refine_ratio: float | None = None

    def backend_names(self) -> list[str]:
        return list(self.backends) or list_backends()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["backends"] = self.backend_names()
        for optional in ("capacity", "refine_ratio"):
            if d[optional] is None:
                del d[optional]  # the default: plans (and resumable runs) from before it hash alike
        return d

    def capacity_for(self, tokens: int) -> int:
        return capacity_for(self.capacity, tokens)

    def config_hash(self, device_type: str, world_size: int) -> str:
        blob = json.dumps({"plan": self.to_dict(), "device": device_type, "world": world_size}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def groups(self) -> Iterator[tuple[ModelShape, str, str]]:
        for shape in self.shapes:
            for dtype in self.dtypes:
                for routing in self.routings:
                    yield shape, dtype, routing

    def total(self) -> int:
        return len(self.shapes) * len(self.dtypes) * len(self.routings) * len(self.tokens) * len(self.backend_names())


@dataclass
class SweepOutcome:
    run_id: int
    fingerprint: str
    world_size: int
    measured: int = 0
    skipped: int = 0  # already in the store (resume)
    failed: dict[str, int] = field(default_factory=dict)  # kind -> count
    unavailable: dict[str, str] = field(default_factory=dict)  # backend -> reason
    infeasible: dict[str, str] = field(default_factory=dict)  # backend -> why some cases were skipped
    adaptive_saved: int = 0  # grid points the adaptive search did not need to measure
    status: str = "completed"


def probe_for_device(device_type: str) -> Topology:
    """The hardware the sweep measures: the GPUs for cuda ranks; the CPU for gloo ranks, even on a GPU host."""
    return probe() if device_type == "cuda" else cpu_topology()


def library_versions(device_type: str, topology: Topology) -> dict[str, str | None]:
    def dist_version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    nccl = None
    if device_type == "cuda" and torch.cuda.is_available():
        nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
    return {
        "a2a_tune": dist_version("a2a-tune"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "driver": topology.driver_version,
        "triton": dist_version("triton"),
        "flashinfer": flashinfer_version(),  # also a staged copy (scripts/stage_flashinfer.py), no metadata
    }


DEFAULT_CASE_TIMEOUT_S = 600.0  # one case: gate + warm-up + timing (first cases also compile kernels)
MAX_RESTARTS = 8


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the sweep; its run (``run_id``, None if none was opened yet)
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
) -> SweepOutcome | None:
    """Run the sweep on `world_size` ranks (spawned here, or this process's torchrun job).
    Returns the outcome; None on the non-zero ranks of a torchrun/srun job.

    The run has one writer: this process (see a2a_tune.db, "One writer per run"). `resume`
    continues the latest unfinished run of the same plan unless another live process holds
    it (then `RankFailed` says who); a sweep that lost its run stops without changing it.

    Spawned ranks are watched: a case that makes no progress for `case_timeout` seconds (a
    hung collective or kernel) gets every rank killed — the only way to free a wedged NCCL
    communicator or GPU — is recorded as a "timeout" failure, its backend is left out of the
    rest of this sweep, and the ranks restart on the same run, skipping what is stored.
    Ctrl-C or SIGTERM stops every rank, marks the run "interrupted" and raises
    `SweepInterrupted`; after `kill -9` the run stays "running" and `resume` takes it over.
    """
    check_url(db_url, persistent=True)  # before any rank starts
    writer = Writer.this_process()
    skip: dict[str, str] = {}
    run_id: int | None = None  # known once rank 0 opened the run (its first heartbeat)
    with tempfile.TemporaryDirectory(prefix="a2a-tune-") as tmp:
        beat = Path(tmp) / "heartbeat.json"
        stalled = None if launched_externally() else (lambda: _stalled(beat, case_timeout))
        for _ in range(MAX_RESTARTS + 1):
            try:
                results = run_ranks(
                    _sweep_rank,
                    world_size,
                    device_type,
                    plan,
                    _Target(db_url, resume, run_id, writer),
                    progress,
                    str(beat),
                    dict(skip),
                    stalled=stalled,
                )
            except RanksStalled:
                run_id, key = _last_beat(beat)
                beat.unlink()  # the restarted ranks start a fresh heartbeat
                reason = f"no progress for {case_timeout:.0f} s; every rank was stopped"
                _record_timeout(db_url, run_id, key, reason, writer)
                skip[key[0]] = f"timed out at {key[6]} tokens/rank ({reason})"
                continue  # the same run, held by the same writer
            except KeyboardInterrupt as exc:
                run_id = run_id or _beat_run(beat)
                if run_id is not None and not launched_externally():
                    _mark_interrupted(db_url, run_id, writer)
                signal_name = "SIGTERM" if type(exc).__name__ == "Terminated" else "SIGINT"
                raise SweepInterrupted(run_id, signal_name) from None
            outcome = next((r for r in results if r is not None), None)
            if outcome is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports
                return None
            for backend, why in skip.items():
                outcome.failed["timeout"] = outcome.failed.get("timeout", 0) + 1
                outcome.infeasible[backend] = why
            return outcome
    raise RankFailed(f"gave up after {MAX_RESTARTS} restarts of stalled ranks")


def _beat_run(beat: Path) -> int | None:
    try:
        return int(json.loads(beat.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mark_interrupted(db_url: str | None, run_id: int, writer: Writer) -> None:
    """Mark `run_id` interrupted for `writer`; nothing when rank 0 already finished it (or the
    run is another's): the lease decides."""
    try:
        with open_store(db_url) as store:
            store.finish_run(run_id, "interrupted", writer=writer)
    except StoreError:
        pass


def _stalled(beat: Path, case_timeout: float) -> str | None:
    try:
        state = json.loads(beat.read_text())
    except (OSError, ValueError):
        return None
    if state.get("key") and time.time() - state["since"] > case_timeout:
        return f"case {state['key']} made no progress for {case_timeout:.0f} s"
    return None


def _last_beat(beat: Path) -> tuple[int, tuple]:
    state = json.loads(beat.read_text())
    return state["run_id"], tuple(state["key"])


def _record_timeout(db_url: str | None, run_id: int, key: tuple, reason: str, writer: Writer) -> None:
    backend, experts, topk, hidden, dtype, ep, tokens, routing = key
    with open_store(db_url) as store:
        store.add_failure(
            run_id,
            writer=writer,
            backend=backend,
            kind="timeout",
            reason=reason,
            num_experts=experts,
            topk=topk,
            hidden=hidden,
            dtype=dtype,
            ep_size=ep,
            tokens_per_rank=tokens,
            routing=routing,
        )


def _case_key(backend: str, shape: MoEShape, ep_size: int, tokens: int, routing: str) -> tuple:
    # Must match the key order of Store.done_keys().
    return (backend, shape.num_experts, shape.topk, shape.hidden, shape.dtype, ep_size, tokens, routing)


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
    fresh by a heartbeat thread); other ranks hold a recorder that writes nothing."""

    def __init__(self, ctx: RankContext, plan: SweepPlan, target: _Target, device_type: str, beat: str):
        self.is_writer = ctx.rank == 0
        self.beat_path = beat
        self.writer = target.writer
        self.store = None
        self.heartbeat: Heartbeat | None = None
        topologies: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(topologies, probe_for_device(device_type).to_dict())
        self.topology = merge_nodes([Topology.from_dict(t) for t in topologies])
        header: list[Any] = [None]
        error: Exception | None = None
        if self.is_writer:
            try:
                header[0] = self._open(plan, target, device_type, ctx.world_size)
            except Exception as exc:  # every rank must learn of it, or they wait forever
                error, header[0] = exc, {"error": one_line(exc)}
        dist.broadcast_object_list(header, src=0)
        if error is not None:
            raise error
        if "error" in header[0]:
            raise PeerFailed(f"rank 0 could not open the run: {header[0]['error']}")
        self.run_id: int = header[0]["run_id"]
        self.done: set[tuple] = header[0]["done"]
        self.unavailable_recorded: set[str] = header[0]["unavailable_recorded"]  # a resumed run has them
        self.medians: dict[tuple, float | None] = header[0]["medians"]  # stored results, for a resumed search
        self.outcome = SweepOutcome(self.run_id, self.topology.fingerprint, ctx.world_size)
        if self.is_writer:
            self.heartbeat = Heartbeat(self.store, self.run_id, self.writer).__enter__()
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
        if run_id is not None:
            self.store.claim_run(run_id, self.writer)  # refuses a run another live sweep holds
        else:
            run_id = self.store.start_run(
                hw,
                device_type=device_type,
                world_size=world,
                versions=library_versions(device_type, topo),
                git_sha=None,
                config={
                    **plan.to_dict(),
                    "device_type": device_type,
                    "world_size": world,
                    "argv": [mask_secrets(a) for a in sys.argv[1:]],
                },
                config_hash=config_hash,
                writer=self.writer,
            )
        failures = self.store.failures(run_id)
        recorded = {f.backend for f in failures if f.kind == "unavailable"}
        medians = {tuple(m.key): m.median_us for m in self.store.measurements(run_id)}
        medians.update({tuple(f.key): None for f in failures if f.key is not None})
        return {
            "run_id": run_id,
            "done": self.store.done_keys(run_id),
            "unavailable_recorded": recorded,
            "medians": medians,
        }

    def measurement(self, key: tuple, timing: str, device_us: list[float], host_us: list[float], knobs: dict) -> None:
        self.outcome.measured += 1
        self.medians[key] = summarize(device_us).median_us
        if not self.is_writer:
            return
        stats = summarize(device_us)
        backend, experts, topk, hidden, dtype, ep, tokens, routing = key
        self.store.add_measurement(
            self.run_id,
            backend=backend,
            num_experts=experts,
            topk=topk,
            hidden=hidden,
            dtype=dtype,
            ep_size=ep,
            tokens_per_rank=tokens,
            routing=routing,
            timing=timing,
            median_us=stats.median_us,
            p10_us=stats.p10_us,
            p90_us=stats.p90_us,
            ci_low_us=stats.ci_low_us,
            ci_high_us=stats.ci_high_us,
            n=stats.n,
            host_median_us=summarize(host_us).median_us,
            samples=[round(s, 3) for s in device_us],
            knobs=knobs,
            writer=self.writer,
        )

    def beat(self, key: tuple | None) -> None:
        """Tell the watching parent which case runs now (None: between cases)."""
        if not self.is_writer or not self.beat_path:
            return
        tmp = self.beat_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"run_id": self.run_id, "key": list(key) if key else None, "since": time.time()}, f)
        os.replace(tmp, self.beat_path)

    def infeasible(self, backend: str, reason: str) -> None:
        self.outcome.infeasible[backend] = reason

    def failure(self, backend: str, kind: str, reason: str, key: tuple | None = None) -> None:
        self.outcome.failed[kind] = self.outcome.failed.get(kind, 0) + 1
        if not self.is_writer:
            return
        shape_fields: dict[str, Any] = {}
        if key is not None:
            _, experts, topk, hidden, dtype, ep, tokens, routing = key
            shape_fields = dict(
                num_experts=experts,
                topk=topk,
                hidden=hidden,
                dtype=dtype,
                ep_size=ep,
                tokens_per_rank=tokens,
                routing=routing,
            )
        self.store.add_failure(
            self.run_id, backend=backend, kind=kind, reason=reason[:500], writer=self.writer, **shape_fields
        )

    def finish(self, status: str) -> None:
        """Record the run's end and release it. Raises when that fails (LeaseLostError: the run
        was taken over; nothing is changed then); `abandon` is the quiet form for error paths."""
        self.outcome.status = status
        if self.store is None:
            return
        if self.heartbeat is not None:
            self.heartbeat.__exit__(None, None, None)
            self.heartbeat = None
        summary = {
            "measured": self.outcome.measured,
            "skipped": self.outcome.skipped,
            "failed": self.outcome.failed,
        }
        try:
            self.store.finish_run(self.run_id, status, summary=summary, writer=self.writer)
        finally:
            self.store.close()
            self.store = None

    def abandon(self, status: str) -> None:
        """`finish` on the way out of an error: the error that got us here is the one to report,
        so a store that fails too (disk full, the run taken over) does not replace it."""
        try:
            self.finish(status)
        except (StoreError, LeaseLostError):
            pass


def _sweep_rank(ctx: RankContext, plan: SweepPlan, target: _Target, show_progress: bool, beat: str, skip: dict):
    device_type = ctx.device.type
    rec = _Recorder(ctx, plan, target, device_type, beat)
    env = BackendEnv.local(ctx.world_size, device_type)
    usable: list[str] = []
    for name in plan.backend_names():
        ok, reason = get_backend(name).availability(env)
        if name in skip:  # timed out earlier in this sweep
            rec.infeasible(name, skip[name])
        elif ok:
            usable.append(name)
        else:
            rec.outcome.unavailable[name] = reason
            if name not in rec.unavailable_recorded:
                rec.failure(name, "unavailable", reason)
    try:
        with progress_bar(show_progress and rec.is_writer, "sweep") as bar:
            task = bar.add_task("", total=plan.total()) if bar else None
            _sweep_cases(ctx, plan, rec, usable, bar, task)
    except KeyboardInterrupt:
        rec.abandon("interrupted")
        raise
    except BaseException:
        rec.abandon("failed")
        raise
    rec.finish("completed")
    return rec.outcome if rec.is_writer else None


def _sweep_cases(ctx: RankContext, plan: SweepPlan, rec: _Recorder, usable: list[str], bar, task) -> None:
    built: dict[tuple, dict[str, Any]] = {}  # (shape, dtype) -> backend instances, built once per shape

    def advance(n: int, text: str) -> None:
        if bar is not None:
            bar.update(task, advance=n, description=text)

    skipped_backends = len(plan.backend_names()) - len(usable)
    for model, dtype, routing in plan.groups():
        for other in [k for k in built if k != (model, dtype)]:  # groups run shape-major: free the last
            for backend in built.pop(other).values():
                if backend is not None:
                    backend.close()
        instances = built.setdefault((model, dtype), {})
        label = f"{model.name} {dtype} {routing}"

        def measure(search: AdaptiveSearch, model=model, dtype=dtype, routing=routing, instances=instances) -> int:
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
                        if bar is not None:  # beyond the grid's total
                            bar.update(task, total=next(t.total for t in bar.tasks if t.id == task) + len(names))
                    for b, median in _run_point(
                        ctx,
                        plan,
                        rec,
                        model,
                        dtype,
                        routing,
                        tokens,
                        names,
                        instances,
                        advance,
                    ).items():
                        search.observe(tokens, b, median)
                    points += len(names) if tokens in plan.tokens else 0
            return points

        if not plan.adaptive:
            # the whole grid is the coarse pass; the search then only refines crossovers and races
            search = AdaptiveSearch(plan.tokens, tuple(usable), coarse_step=1, refine_ratio=plan.refine_ratio)
            for tokens in plan.tokens:
                advance(skipped_backends, f"{label} T={tokens}")
                for b, median in _run_point(
                    ctx, plan, rec, model, dtype, routing, tokens, usable, instances, advance
                ).items():
                    search.observe(tokens, b, median)
            if plan.refine_ratio is not None:
                measure(search)
            continue
        search = AdaptiveSearch(plan.tokens, tuple(usable), refine_ratio=plan.refine_ratio)
        _observe_stored(search, rec, model, dtype, routing, usable, plan.tokens)  # a resumed run: what is stored counts
        points = measure(search)
        rec.outcome.adaptive_saved += len(plan.tokens) * len(usable) - points
        advance(len(plan.tokens) * len(plan.backend_names()) - points, label)
    for instances in built.values():
        for backend in instances.values():
            if backend is not None:
                backend.close()


def _observe_stored(search: AdaptiveSearch, rec, model, dtype: str, routing: str, usable: list[str], grid) -> None:
    """Feed `search` the medians a resumed run stored for one shape group, refinement counts
    between the grid's ends included."""
    group = (model.num_experts, model.topk, model.hidden, dtype, routing)
    for (backend, experts, topk, hidden, dt, _, tokens, rt), median in rec.medians.items():
        if (experts, topk, hidden, dt, rt) == group and backend in usable and grid[0] <= tokens <= grid[-1]:
            search.observe(tokens, backend, median)


def _run_point(ctx, plan, rec, model, dtype, routing, tokens, names, instances, advance) -> dict[str, float | None]:
    """Every backend of `names` at one token count: median µs, or None (failed / infeasible)."""
    world = ctx.world_size
    shape = MoEShape(model.num_experts, model.topk, model.hidden, max(plan.tokens), dtype)
    label = f"{model.name} {dtype} {routing} T={tokens}"
    keys = {name: _case_key(name, shape, world, tokens, routing) for name in names}
    result = {name: rec.medians.get(keys[name]) for name in names if keys[name] in rec.done}
    todo = [name for name in names if keys[name] not in rec.done]
    rec.outcome.skipped += len(names) - len(todo)
    advance(len(names) - len(todo), label)
    if not todo:
        return result
    try:
        shape.validate(world)
        inputs = [
            make_inputs(
                shape, tokens, rank=ctx.rank, world_size=world, routing=routing, seed=plan.seed + i, device=ctx.device
            )
            for i in range(plan.input_sets)
        ]
    except ShapeError as exc:
        for name in todo:
            rec.failure(name, "error", str(exc), keys[name])
            result[name] = None
        advance(len(todo), label)
        return result
    for name in todo:
        advance(0, f"{label} {name}")
        rec.beat(keys[name])
        result[name] = _measure_case(ctx, plan, rec, name, shape, instances, inputs, keys[name])
        rec.beat(None)
        advance(1, label)
    return result


def _measure_case(
    ctx, plan: SweepPlan, rec: _Recorder, name: str, shape: MoEShape, instances: dict, inputs, key
) -> float | None:
    """Gate, then time one case; returns its median µs (the same on every rank) or None."""
    cls = get_backend(name)
    slot = name
    tokens = inputs[0].x.shape[0]  # on every rank: the step's max over ranks
    if cls.capacity_bound:
        # Fixed-capacity backends cost what their capacity costs: by default sized to this load,
        # not to the sweep's largest token count. That is their best case: an engine that
        # allocates one workspace for its largest batch pays that capacity at every smaller
        # step, which `plan.capacity` (--capacity) measures -- except in the backends that take
        # the step's size at run time (`step_sized`), told it below as an engine tells them.
        shape = MoEShape(shape.num_experts, shape.topk, shape.hidden, plan.capacity_for(tokens), shape.dtype)
        slot = (name, shape.max_tokens_per_rank)
        for old in [k for k in instances if isinstance(k, tuple) and k[0] == name and k != slot]:
            if instances[old] is not None:
                instances[old].close()
            del instances[old]
    feasible, why = cls.feasibility(shape, ctx.world_size)
    if not feasible:  # e.g. beyond a fixed-capacity backend's slots: not measured, not a failure
        rec.infeasible(name, why)
        return None
    if slot not in instances:
        error = ""
        try:
            instances[slot] = cls(ctx.group, shape, ctx.device)
        except Exception as exc:
            instances[slot], error = None, one_line(exc)
        if not all_ranks_ok(not error, ctx):
            instances[slot] = None
            rec.failure(name, "error", f"construction failed: {error or 'on another rank'}", key)
            return None
    backend = instances[slot]
    if backend is None:  # construction failed earlier for this shape
        rec.failure(name, "error", "construction failed (see the first failure of this shape)", key)
        return None
    if tokens:
        backend.set_step_tokens(tokens)
    gate = check_invariant(backend, inputs[0])
    if not gate.ok:
        rec.failure(name, "error" if gate.crashed else "incorrect", gate.reason, key)
        return None
    # Graph-capturable backends are timed as engines run them in decode: CUDA-graph replay.
    graph = cls.graph_capturable and ctx.device.type == "cuda"
    timer = time_graph_round_trips if graph else time_round_trips
    error = ""
    try:
        device_us, host_us = timer(backend, inputs, warmup=plan.warmup, iters=plan.iters)
        if backend.gave_up():  # a flag wait timed out: the samples are garbage
            error = "a flag wait timed out (a peer never signalled); timings discarded"
    except Exception as exc:
        error = one_line(exc)
    if not all_ranks_ok(not error, ctx):
        rec.failure(name, "error", error or "failed on another rank", key)
        return None
    rec.measurement(key, "graph" if graph else "eager", device_us, host_us, backend.knobs())
    return summarize(device_us).median_us
