"""What the operator typed -> the sweep plan, checked whole before any rank starts.

`sweep` and `run` share one options object (:class:`SweepOptions`, the CLI builds it once for
both); :func:`build_plan` turns it into a :class:`~a2a_tune.tuner.sweep.SweepPlan` with the
device and the number of ranks, and refuses in one line (:class:`PlanError`, the CLI's exit
code 2) what no rank could measure:

* options that name nothing: an unknown preset, dtype, routing or backend, a token count or
  capacity outside the point's bound (:func:`~a2a_tune.tuner.runtime.point.check_tokens`);
* impossible shapes: each number within the point's bounds, top-k <= experts, experts
  divisible over the EP ranks (:meth:`Shape.problem <a2a_tune.tuner.runtime.point.Shape.problem>`);
* cases that cannot fit: the bytes a case would allocate per rank
  (:func:`a2a_tune.kernels.base.case_bytes`) against what a rank has here
  (:func:`memory_per_rank`) -- so an absurd hidden size never reaches an allocator, and a
  shared machine's OOM killer never picks someone else's process.

Standard library at import (the CLI imports it for every sweep command); torch and the
backends are imported by the functions that need them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .runtime.environ import MAX_SECONDS
from .runtime.point import PAYLOADS, PointError, Shape, check_tokens
from .runtime.text import quoted
from .shapes import ModelShape

#: GPU memory a rank holds beside its case: its CUDA context, NCCL's buffers, the allocator's slack.
GPU_RANK_RESERVE_BYTES = 2 * 1024**3


DEFAULT_TOKENS = {
    # 1 .. 16384 tokens per rank (decode to prefill): powers of 2 and 3·2^k between them. The
    # 3·2^k points matter: capacity-sized kernels (FlashInfer's) are slower off powers of 2 than
    # interpolating between powers of 2 predicts (BENCHMARKS.md, "Figures moved from the code").
    "cuda": tuple(sorted({2**i for i in range(15)} | {3 * 2**i for i in range(13)})),
    "cpu": (1, 4, 16, 64, 256),  # gloo on CPU: enough to see a crossover in minutes
}
DEFAULT_ITERS = {"cuda": (10, 50), "cpu": (3, 15)}  # (warm-up, timed) round trips per case


@dataclass(frozen=True)
class Case:
    """One shape at one EP size, as the ranks measure it: at every token count of the grid, on
    each backend the plan names (the ranks leave out those that cannot run on their groups)."""

    ep_size: int
    model: str  # the model's name, for people
    shape: Shape
    tokens: tuple[int, ...]
    backends: tuple[str, ...]

    @property
    def label(self) -> str:
        """The progress bar's (+ T=: one line of the bar at 80 columns; uniform routing unsaid)."""
        routing = "" if self.shape.routing == "uniform" else f" {self.shape.routing}"
        return f"EP {self.ep_size} {self.model} {self.shape.dtype}{routing}"


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep measures: the models, token counts, dtypes, routings and backends, and how.
    Its dict (:meth:`to_dict`) is stored with the run and hashed to find the run to resume."""

    shapes: tuple[ModelShape, ...]
    tokens: tuple[int, ...]
    # EP sizes to measure, each dividing the world and on groups of consecutive ranks (tuner.groups)
    ep_sizes: tuple[int, ...]
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

    def sizes(self) -> tuple[int, ...]:
        """The EP sizes this plan measures, smallest first."""
        return tuple(sorted(self.ep_sizes))

    def backend_names(self) -> list[str]:
        if self.backends:
            return list(self.backends)
        from a2a_tune.kernels import list_backends

        return list_backends()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["backends"] = self.backend_names()
        d["ep_sizes"] = list(self.sizes())
        for optional in ("capacity", "refine_ratio"):
            if d[optional] is None:
                del d[optional]  # the default: plans (and resumable runs) from before it hash alike
        return d

    def capacity_for(self, tokens: int) -> int:
        from .measure import capacity_for

        return capacity_for(self.capacity, tokens)

    def config_hash(self, device_type: str, world_size: int) -> str:
        """What finds this plan's run to resume. Compatibility: a plan of the world alone
        (ep_sizes == (world_size,)) hashes without its ep_sizes, as every plan did before EP
        sizes existed and as runs stored since then recorded it, so those runs stay resumable."""
        plan = self.to_dict()
        if plan["ep_sizes"] == [world_size]:
            del plan["ep_sizes"]
        blob = json.dumps({"plan": plan, "device": device_type, "world": world_size}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def all_shapes_at(self, ep_size: int) -> Iterator[tuple[str, Shape]]:
        """Each (model name, shape) of the plan on `ep_size` ranks, shape-major: the models in
        order, each with every dtype, each dtype with every routing; measurable or not."""
        for model in self.shapes:
            for dtype in self.dtypes:
                for routing in self.routings:
                    yield model.name, model.at(ep_size, dtype, routing)

    def shapes_at(self, ep_size: int) -> Iterator[tuple[str, Shape]]:
        """The shapes of `all_shapes_at` that can be measured at `ep_size` (see `skipped_at`)."""
        for name, shape in self.all_shapes_at(ep_size):
            if shape.problem(measuring=True) is None:
                yield name, shape

    def skipped_at(self, ep_size: int) -> list[str]:
        """Why some shapes are not measured at `ep_size` (one line each): experts that do not
        divide over the group, 'local' routing with top-k beyond one rank's experts."""
        return [
            f"{name} {shape.dtype} {shape.routing} at EP {ep_size}: {problem}"
            for name, shape in self.all_shapes_at(ep_size)
            if (problem := shape.problem(measuring=True))
        ]

    def cases(self) -> Iterator[Case]:
        """The plan, enumerated once: each measurable shape at each EP size, smallest size
        first, shape-major within a size (see `all_shapes_at`)."""
        backends = tuple(self.backend_names())
        for size in self.sizes():
            for name, shape in self.shapes_at(size):
                yield Case(size, name, shape, self.tokens, backends)

    def total(self) -> int:
        """Measurements of the plan (every backend) over its EP sizes."""
        return sum(len(c.tokens) * len(c.backends) for c in self.cases())


@dataclass(frozen=True)
class SizePlan:
    """What a plan measures at one EP size, before any rank starts (`plan_sizes`)."""

    ep_size: int
    groups: int
    shapes: int  # measurable at this size
    skipped: list[str]  # why the others are not (SweepPlan.skipped_at)
    tokens: int
    backends: int  # available here at this size
    unavailable: int

    @property
    def cases(self) -> int:
        return self.shapes * self.tokens * self.backends


def plan_sizes(plan: SweepPlan, device: str, world: int) -> list[SizePlan]:
    """Per EP size: its groups, shapes, token counts and the backends that can run here (as far
    as this process can tell: a group's reach is known once the ranks gathered the cluster)."""
    from a2a_tune.kernels import BackendEnv, UnknownBackendError, availability_of, get_backend

    rows = []
    for size in plan.sizes():
        env = BackendEnv.local(size, device)
        usable = 0
        for name in plan.backend_names():
            try:
                cls = get_backend(name)
            except UnknownBackendError:  # registered in the ranks only: counted as able to run
                usable += 1
                continue
            sub_group = world > size and cls.sub_group_reason
            usable += bool(availability_of(cls, env).ok and not sub_group)
        shapes = sum(1 for _ in plan.shapes_at(size))
        names = len(plan.backend_names())
        rows.append(
            SizePlan(size, world // size, shapes, plan.skipped_at(size), len(plan.tokens), usable, names - usable)
        )
    return rows


def world_left_out(plan: SweepPlan, world: int) -> str | None:
    """Why the plan does not measure EP = the world (one line) when no model's experts divide
    over it; None when it does, or leaves it out only because --ep-sizes did."""
    counts = sorted({model.num_experts for model in plan.shapes}, reverse=True)
    if world in plan.sizes() or any(c % world == 0 for c in counts):
        return None
    return f"EP {world} (the world): not measured, no model's experts ({', '.join(map(str, counts))}) divide over it"


def plan_difference(stored: dict[str, Any], plan: SweepPlan, device: str, world: int) -> str:
    """What differs between a stored run's config and `plan` on `world` `device` ranks (one line)."""
    now = json.loads(json.dumps({**plan.to_dict(), "device_type": device, "world_size": world}))  # as stored
    stored = {"ep_sizes": [stored.get("world_size")], **stored}  # stored without: the world alone
    said = []
    for key in [*now, *(k for k in ("capacity", "refine_ratio") if k not in now)]:
        was, is_ = stored.get(key), now.get(key)
        if was != is_:
            if key == "shapes":
                was, is_ = ([m.get("name") for m in v or ()] for v in (was, is_))
            said.append(f"{key} {_short(is_)} here, {_short(was)} there")
    return "; ".join(said) or "its plan hashes otherwise (written by another a2a-tune version?)"


def _short(value: Any) -> str:
    text = "-" if value is None else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class PlanError(ValueError):
    """Options that give no plan, or a plan no rank could run (one line)."""


@dataclass(frozen=True)
class SweepOptions:
    """The options `sweep` and `run` share, named as the command line names them (`out_dir`
    is run's --out; sweep leaves it None). Defaults are the command line's."""

    device: str = "auto"
    world: int | None = None
    preset: Sequence[str] = ()
    model_config: Sequence[Path] = ()
    tokens: str | None = None
    ep_sizes: str | None = None
    dtype: Sequence[str] = ()
    routing: Sequence[str] = ()
    backend: Sequence[str] = ()
    warmup: int | None = None
    iters: int | None = None
    db: str | None = None
    resume: bool = False
    progress: bool = True
    case_timeout: float = 600.0
    adaptive: bool = False
    capacity: int | None = None
    refine: bool | None = None
    allow_mixed: bool = False
    out_dir: Path | None = field(default=None)
    dry_run: bool = False  # print the plan and stop: no rank starts
    as_json: bool = False  # the outcome (or the plan) as JSON on standard output


def _integers(text: str, option: str) -> list[int]:
    """Comma-separated integers of ASCII digits (not `2_0`, `٢` or an empty `1,,8`), sorted and
    deduplicated; PlanError naming `option` otherwise."""
    items = [v.strip() for v in text.split(",")]
    try:
        if all(v.isascii() and v.isdigit() for v in items):
            return sorted({int(v) for v in items})
    except ValueError:  # beyond int()'s digits
        pass
    raise PlanError(f"{option} must be comma-separated integers (digits 0-9), got {quoted(text)}")


def parse_tokens(text: str, option: str = "--tokens") -> tuple[int, ...]:
    """Comma-separated tokens per rank, sorted and deduplicated, each within the point's bound."""
    values = _integers(text, option)
    try:
        for v in (values[0], values[-1]):
            check_tokens(v)
    except PointError as exc:
        raise PlanError(f"{option}: {exc}") from None
    return tuple(values)


def parse_ep_sizes(text: str | None, world: int, shapes: Sequence[ModelShape]) -> tuple[int, ...]:
    """--ep-sizes: comma-separated EP sizes, each dividing the world and every model's experts;
    without it the default (tuner.groups.default_ep_sizes): the sizes that divide the world and
    some model's experts, each model skipped at those its experts do not divide
    (`SweepPlan.skipped_at`)."""
    from .groups import default_ep_sizes

    if text is None:
        # none: the world alone, which check_plan refuses naming the model, before any rank starts
        return default_ep_sizes(world, [model.num_experts for model in shapes]) or (world,)
    sizes = _integers(text, "--ep-sizes")
    for size in sizes:
        if size < 2 or world % size:
            raise PlanError(f"--ep-sizes {size}: an EP size must be at least 2 and divide the {world} ranks")
        for model in shapes:
            if model.num_experts % size:
                raise PlanError(f"--ep-sizes {size}: {model.name}'s {model.num_experts} experts do not divide over it")
    return tuple(sizes)


def resolve_device(device: str, *, launched: bool = False, gpu_ranks: int = 2) -> tuple[str, int]:
    """--device: "cuda" or "cpu", and how many GPUs are visible; auto is cuda where `gpu_ranks`
    GPUs are visible (one each in a torchrun/srun job: `launched`)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus >= (1 if launched else gpu_ranks) else "cpu"
    if device == "cuda" and gpus == 0:
        raise PlanError("--device cuda: no CUDA GPU is visible (use --device cpu to sweep CPU ranks over gloo)")
    if device not in ("cuda", "cpu"):
        raise PlanError(f"--device must be auto, cuda or cpu, got {quoted(device)}")
    return device, gpus


def _gpu_name() -> str | None:
    import torch

    try:
        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - the name only decorates a message
        return None


def resolve_ranks(
    device: str, world: int | None, *, virtual_hint: bool = False, note: Callable[[str], None] | None = None
) -> tuple[str, int]:
    """--device and --world: the device type and the ranks to run (a torchrun/srun job's own).
    A host with one GPU is refused GPU ranks (and auto) in one line saying what it can do;
    CPU ranks on a GPU host are told (`note`, one line) they rehearse, not measure the host."""
    from .launch import RankFailed, cpu_rank_limit, cpu_rehearsal_note, job_rank, one_gpu_refusal

    try:
        job = job_rank()  # torchrun / srun: the job's size, whatever --world says
    except RankFailed as exc:
        raise PlanError(str(exc)) from None
    requested = device
    device, gpus = resolve_device(device, launched=job is not None)
    if job is None and gpus == 1 and requested in ("auto", "cuda"):
        raise PlanError(one_gpu_refusal(gpus, _gpu_name(), virtual_hint=virtual_hint))
    if job is not None:
        world = job.world_size
    elif world is None:
        world = gpus if device == "cuda" else 2
    if device == "cuda" and job is None and world > gpus:
        raise PlanError(
            f"--world {world} needs {world} GPUs; {gpus} visible (several nodes: launch with torchrun/srun)"
        )
    if device == "cpu" and gpus and job is None and note is not None:
        note(cpu_rehearsal_note(gpus))
    if world < 2:
        raise PlanError(f"--world must be at least 2 (all2all needs peers), got {world}")
    if device == "cpu" and job is None:
        limit, why = cpu_rank_limit()
        if world > limit:
            raise PlanError(f"--world {world} on cpu: this machine holds at most {limit} CPU ranks ({why})")
    return device, world


def resolve_virtual(device: str, world: int | None) -> tuple[str, int]:
    """--device and --world for --virtual: one process holds every rank (on one GPU, or on CPU)."""
    from a2a_tune.kernels.virtual import MAX_VIRTUAL_RANKS

    from .launch import launched_externally

    if launched_externally():
        raise PlanError("--virtual runs every rank in one process: start it without torchrun/srun")
    device, _ = resolve_device(device, gpu_ranks=1)
    world = 2 if world is None else world
    if not 2 <= world <= MAX_VIRTUAL_RANKS:
        raise PlanError(f"--world must be 2..{MAX_VIRTUAL_RANKS} with --virtual, got {world}")
    return device, world


def model_shapes(presets: Sequence[str], model_configs: Sequence[Path]) -> list:
    """--preset and --model-config: the model shapes [default: shapes.DEFAULT_PRESETS]."""
    from .shapes import DEFAULT_PRESETS, ShapeSpecError, from_model_config, preset

    try:
        shapes = [preset(p) for p in presets] + [from_model_config(p) for p in model_configs]
    except ShapeSpecError as exc:
        raise PlanError(str(exc)) from None
    return shapes or [preset(p) for p in DEFAULT_PRESETS]


def check_backends(names: Sequence[str], dtypes: Sequence[str] = ()) -> None:
    """Each named backend exists and carries at least one of the payloads asked for (a backend
    asked for by name that would measure nothing is a mistake, said before any rank starts)."""
    from a2a_tune.kernels import UnknownBackendError, get_backend

    try:
        classes = [get_backend(b) for b in names]
    except UnknownBackendError as exc:
        raise PlanError(str(exc)) from None
    for cls in classes:
        if dtypes and not set(dtypes) & cls.payloads:
            carried = ", ".join(d for d in PAYLOADS if d in cls.payloads)
            raise PlanError(f"{cls.name} does not carry {' or '.join(dtypes)} (it carries {carried})")


def check_capacity(capacity: int | None, token_counts, table_capacity: int | None = None) -> int | None:
    """--capacity, or without it the capacity a table was measured with (its run.capacity),
    checked against the token counts to measure; None: each load's own."""
    source = None
    if capacity is None and table_capacity is not None:
        capacity = table_capacity
        source = f"the table's run.capacity {capacity}"
    if capacity is not None:
        try:
            check_tokens(capacity, "a capacity in tokens per rank")
        except PointError as exc:
            raise PlanError(f"{source or '--capacity'}: {exc}") from None
    if capacity is not None and token_counts and capacity < max(token_counts):
        raise PlanError(
            f"{source or f'--capacity {capacity}'} is below the largest token count {max(token_counts)}: "
            "a fixed-capacity backend cannot carry more tokens than it was built for"
        )
    return capacity


def check_seconds(value: float, option: str) -> float:
    """`value` if it is a duration an option may set: finite, more than 0, at most a week
    (NaN would disable a watchdog, 0 or less time every case out); else PlanError."""
    if not (isinstance(value, (int, float)) and 0 < value <= MAX_SECONDS):
        raise PlanError(f"{option} must be a number of seconds more than 0 and at most {MAX_SECONDS:g}, got {value}")
    return float(value)


def check_fraction(value: float, option: str) -> float:
    """`value` if it is a finite number in (0, 1]; else PlanError."""
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise PlanError(f"{option} must be a number more than 0 and at most 1, got {value}")
    return float(value)


def once(shapes: Sequence[ModelShape], options: SweepOptions) -> tuple[list[ModelShape], dict[str, tuple], str | None]:
    """Each shape, dtype, routing and backend once (first kept): two presets of one shape, or a
    repeated option, would measure one case twice. The note says what was folded, in one line."""
    kept: dict[tuple[int, int, int], ModelShape] = {}
    said = []
    for model in shapes:
        first = kept.setdefault((model.num_experts, model.topk, model.hidden), model)
        if first is not model:
            said.append(f"{model.name} (the shape of {first.name})")
    values = {}
    for option in ("dtype", "routing", "backend"):
        given = tuple(getattr(options, option))
        values[option] = tuple(dict.fromkeys(given))
        said += [f"--{option} {v} (repeated)" for v in values[option] if given.count(v) > 1]
    return list(kept.values()), values, (f"note: measured once: {', '.join(said)}" if said else None)


def build_plan(options: SweepOptions, *, note: Callable[[str], None] | None = None):
    """(plan, device, world) for `options`, checked whole (:func:`check_plan`): PlanError
    when there is none, before any rank starts. `note`: where a note on the way goes
    (:func:`resolve_ranks`)."""
    from a2a_tune.kernels.reference import ROUTINGS

    from .adaptive import REFINE_RATIO

    check_seconds(options.case_timeout, "--case-timeout")
    device, world = resolve_ranks(options.device, options.world, note=note)
    shapes, given, folded = once(model_shapes(options.preset, options.model_config), options)
    if folded and note is not None:
        note(folded)
    for d in given["dtype"]:
        if d not in PAYLOADS:
            raise PlanError(f"unknown --dtype {quoted(d)}; choose from {', '.join(PAYLOADS)}")
    for r in given["routing"]:
        if r not in ROUTINGS:
            raise PlanError(f"unknown --routing {quoted(r)}; choose from {', '.join(ROUTINGS)}")
    check_backends(given["backend"], given["dtype"])
    token_counts = parse_tokens(options.tokens) if options.tokens else DEFAULT_TOKENS[device]
    check_capacity(options.capacity, token_counts)
    default_warmup, default_iters = DEFAULT_ITERS[device]
    refine = options.refine
    ep_sizes = parse_ep_sizes(options.ep_sizes, world, shapes)
    plan = SweepPlan(
        shapes=tuple(shapes),
        tokens=token_counts,
        dtypes=given["dtype"] or ("bf16",),
        routings=given["routing"] or ("uniform",),
        backends=given["backend"],
        warmup=default_warmup if options.warmup is None else options.warmup,
        iters=default_iters if options.iters is None else options.iters,
        adaptive=options.adaptive,
        capacity=options.capacity,
        # on by default where timings resolve few-% differences (GPUs); gloo noise would chase flips
        refine_ratio=REFINE_RATIO if (device == "cuda" if refine is None else refine) else None,
        ep_sizes=ep_sizes,
    )
    check_plan(plan, device, world)
    return plan, device, world


def check_plan(plan, device: str, world: int, *, budget: tuple[int | None, str] | None = None) -> None:
    """PlanError (one line) unless every shape of `plan` can be measured on `world` ranks and
    every case fits in what a rank has here (`budget`: (bytes, why); default
    :func:`memory_per_rank`)."""
    sizes = plan.sizes()
    for named in zip(*(list(plan.all_shapes_at(s)) for s in sizes)):  # one shape at each EP size
        problems = [(shape, problem) for _, shape in named if (problem := shape.problem(measuring=True))]
        if len(problems) == len(sizes):  # measurable at no EP size: refused (at some: skipped there)
            shape, problem = problems[0]
            raise PlanError(f"{named[0][0]} ({shape.describe()}): {problem}")
    largest, at = largest_case(plan, device, world)
    if not largest:
        return
    limit, why = memory_per_rank(device, world) if budget is None else budget
    if limit is not None and largest > limit:
        (name, shape), tokens, backend = at
        raise PlanError(
            f"{name} {shape.dtype} {shape.routing} at {tokens} tokens/rank: {backend} would allocate about "
            f"{_gib(largest)} per rank, more than the {_gib(limit)} a rank has here ({why}); "
            "measure fewer tokens per rank or a smaller shape"
        )


def largest_case(plan, device: str, world: int) -> tuple[int, tuple | None]:
    """The most bytes one rank would allocate for one case of `plan`, and which case
    ((name, shape), tokens, backend); (0, None) when no backend can run any.

    The backends counted: on CPU those available there; on CUDA every feasible one (asking
    availability there would set up CUDA in this process, which the ranks need alone); not
    those this process cannot load (a module only the ranks are told to import)."""
    from a2a_tune.kernels import BackendEnv, MoEShape, UnknownBackendError, availability_of, feasibility_of, get_backend
    from a2a_tune.kernels.base import case_bytes

    from .measure import capacity_of

    classes = []
    for name in plan.backend_names():
        try:
            classes.append(get_backend(name))
        except UnknownBackendError:  # registered in the ranks only (A2A_TUNE_BACKEND_MODULES set for them)
            continue
    if device != "cuda":
        env = BackendEnv.local(world, device)
        classes = [cls for cls in classes if availability_of(cls, env).ok]
    top = max(plan.tokens)
    largest, at = 0, None
    for case in plan.cases():
        for t in case.tokens:
            for cls in classes:
                moe = MoEShape.of(case.shape, capacity_of(cls, t, capacity=plan.capacity, largest=top))
                if not feasibility_of(cls, moe, case.ep_size).ok:
                    continue
                need = case_bytes(cls, moe, case.ep_size, t, input_sets=plan.input_sets)
                if need > largest:
                    largest, at = need, ((case.model, case.shape), t, cls.name)
    return largest, at


def memory_per_rank(device: str, world: int) -> tuple[int | None, str]:
    """(bytes one rank may allocate here, why), or (None, why) when this host cannot say.

    CPU ranks: the host's available memory (MemAvailable, or a cgroup limit below it) shared
    by the ranks on this host, less what each rank costs before its first case. GPUs: the
    least free memory of the GPUs the ranks use, read through NVML (no CUDA context in this
    process), less a reserve for the rank's context and communicators."""
    from .launch import CPU_RANK_MEMORY_BYTES, host_memory_available

    local = _local_ranks(world)
    if device != "cuda":
        available = host_memory_available()
        if available is None:
            return None, "no /proc/meminfo"
        share = available // local - CPU_RANK_MEMORY_BYTES
        return max(share, 0), f"{_gib(available)} available over {local} CPU rank(s) on this host"
    from .nvml import free_memory_bytes

    free = free_memory_bytes(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not free:
        return None, "NVML cannot say how much GPU memory is free"
    least = min(free[:local] if len(free) >= local else free)
    return max(least - GPU_RANK_RESERVE_BYTES, 0), f"{_gib(least)} free on the fullest GPU, per NVML"


def _local_ranks(world: int) -> int:
    """Ranks on this host: the launcher's LOCAL_WORLD_SIZE (torchrun) or tasks per node (srun),
    else every rank (a2a-tune spawns them all here)."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        # not "²" (a digit to isdigit, yet no int) nor 5,000 digits (beyond int()'s limit)
        if value.isascii() and value.isdigit() and len(value) < 10 and int(value) > 0:
            return min(int(value), world)
    return world


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
