"""The backend contract: what every all2all backend is, does, and guarantees.

Expert-parallel (EP) group of W ranks; E experts, E % W == 0; rank r owns the experts
[r*E/W, (r+1)*E/W). Rank r holds T_r tokens (T_r may differ per rank, and may be 0):

    x             [T_r, H]   activation dtype (bf16 / fp16 / fp32; quantized payloads: bf16)
    topk_ids      [T_r, k]   int32/int64 global expert ids, distinct within a row
    topk_weights  [T_r, k]   fp32 router weights

    d = backend.dispatch(x, topk_ids, topk_weights)
        d.x             [N, H]   rows this rank received (N depends on the backend's layout)
        d.topk_ids      [N, k]   global expert ids; -1 where the expert is not on this rank
        d.topk_weights  [N, k]   fp32
        d.handle                 backend-private state that combine needs
    y = backend.combine(expert_out, d)
        expert_out      [N, H]   out[n] = sum_{j: ids[n,j] >= 0} w[n,j] * f(ids[n,j], d.x[n])
        y               [T_r, H] on the token's source rank

The invariant (checked by `a2a_tune.kernels.reference.check_invariant` before any timing):
for every source token t on every rank, y[t] == sum_j topk_weights[t,j] * f(topk_ids[t,j], x[t])
within the payload dtype's tolerance, whatever the backend's internal layout.

Design notes: docs/architecture.md, "Module notes", `kernels/base.py`.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from a2a_tune.tuner.runtime import point as _point
from a2a_tune.tuner.runtime.point import Shape, check_tokens, shape_label
from a2a_tune.tuner.runtime.table import FABRICS

from .errors import KnobError, ShapeError

if TYPE_CHECKING:  # torch is imported lazily so `availability` stays cheap to call
    import torch
    import torch.distributed as dist

#: The payload vocabulary (``runtime.point.PAYLOADS``: name -> format): what x, the expert
#: outputs and y are in (``activation``, also what combine carries), and what a dispatched row
#: travels as (``wire``: a quantized payload's dtype -- NVFP4: bytes of two e2m1 values -- with
#: its block scales beside it, quantized before dispatch).
PAYLOADS = _point.PAYLOADS
#: Unquantized payloads: every backend carries these.
PLAIN_PAYLOADS = frozenset(name for name, p in PAYLOADS.items() if not p.quantized)
#: Bytes per element of the payloads' activation and wire dtypes, known without importing torch.
ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1}
FP8_BLOCK = PAYLOADS["fp8_e4m3"].block  # elements per scale (kernels/quant.py; _quant_kernels.py on CUDA)
FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
FP4_E2M1_MAX = 6.0  # the largest e2m1 magnitude
#: The NVFP4 global scale of our cases: 448 x 6 / 8, as a checkpoint calibrated on activations
#: of amax 8 sets it (reference.make_inputs draws N(0, 1) rows: beyond 8 sigma never happens).
NVFP4_GLOBAL_SCALE = FP8_E4M3_MAX * FP4_E2M1_MAX / 8.0


def torch_dtype(name: str) -> torch.dtype:
    """The activation dtype of payload `name` (x, expert outputs, y); a name of
    :data:`PAYLOADS` (checked where the shape came in: :meth:`MoEShape.validate`)."""
    import torch

    return getattr(torch, PAYLOADS[name].activation)


def wire_dtype(name: str) -> torch.dtype | None:
    """The quantized dtype payload `name` travels in, or None when it travels as is."""
    import torch

    wire = PAYLOADS[name].wire
    return getattr(torch, wire) if wire else None


@dataclass(frozen=True)
class MoEShape:
    """The MoE layer geometry a backend instance is built for (its workspaces size from it):
    a point's shape less what the group (ep_size) and the inputs (routing) carry, plus the
    capacity the backend is built for."""

    num_experts: int
    topk: int
    hidden: int
    max_tokens_per_rank: int
    dtype: str = "bf16"

    @classmethod
    def of(cls, shape: Shape, max_tokens_per_rank: int) -> MoEShape:
        """The geometry to build a backend for `shape` (a point's shape) at that capacity."""
        return cls(shape.num_experts, shape.topk, shape.hidden, max_tokens_per_rank, shape.dtype)

    def validate(self, world_size: int) -> None:
        """Raise ShapeError (one line) if this shape cannot run on `world_size` ranks: the
        point's rules for a shape to measure (`Shape.problem`: a payload dtype we know among
        them), a capacity within the token bound."""
        if min(self.num_experts, self.topk, self.hidden, self.max_tokens_per_rank) <= 0:
            raise ShapeError(f"{self}: experts, topk, hidden and max_tokens_per_rank must be positive")
        problem = Shape(world_size, self.hidden, self.topk, self.num_experts, self.dtype, "uniform").problem(
            measuring=True
        )
        if problem:
            raise ShapeError(f"{self.label()}: {problem}")
        try:
            check_tokens(self.max_tokens_per_rank, "max_tokens_per_rank")
        except ValueError as exc:
            raise ShapeError(f"{self.label()}: {exc}") from None

    def experts_per_rank(self, world_size: int) -> int:
        return self.num_experts // world_size

    def label(self) -> str:
        return shape_label(self.num_experts, self.topk, self.hidden, self.dtype)


def case_bytes(cls: type[All2AllBackend], shape: MoEShape, world_size: int, tokens: int, *, input_sets: int = 1) -> int:
    """At most how many bytes one rank allocates to run `cls`, built for `shape`, at `tokens`
    per rank on `world_size` ranks: a bound to refuse a case before anything is allocated,
    not a measurement (it counts generously: every buffer of the widest layout at once).

    Inputs (`reference.make_inputs`): per set x [T, H] + ids and weights [T, k]; drawing them
    holds router scores [T, E] fp32 (three such for skewed routing) and x in fp32. Received:
    `cls.received_rows` rows of H (the received x, the workspace or padded copy a combine
    reduces, combine's staging and the expert outputs, once in fp32 for the reference compute)
    with their 2k words of routing twice. Plus the check's reference and result, [T, H] each.
    """
    payload = PAYLOADS[shape.dtype]
    a = payload.combine_row_bytes(1)
    t, h, k = tokens, shape.hidden, shape.topk
    inputs = input_sets * t * (h * a + 8 * k) + t * max(3 * 4 * shape.num_experts, 4 * h)
    rows = cls.received_rows(shape, world_size)
    received = rows * (payload.row_bytes(h) + h * (3 * a + 4) + 2 * 8 * k)
    check = t * h * (4 + a)
    return inputs + received + check


# Where a backend's transport works, narrowest first; and what joins an EP group's ranks,
# in the same order ("network": anything beyond one NVLink domain, PCIe-only GPUs included).
REACHES = ("island", "domain", "anywhere")
SPANS = FABRICS  # what joins an EP group's ranks: the table's ``fabric`` vocabulary
REACH_TEXT = {
    "island": "one NVLink island on one node",
    "domain": "one NVLink domain (also across nodes)",
    "anywhere": "any ranks torch.distributed connects",
}


def reaches(reach: str, span: str) -> bool:
    """Whether a backend of `reach` (REACHES) can carry an EP group of `span` (SPANS)."""
    return REACHES.index(reach) >= SPANS.index(span)


class Availability(NamedTuple):
    """`ok, reason = cls.availability(env)`; reason is one line, empty when ok."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class BackendEnv:
    """What a backend may ask about the place it would run, gathered without collectives."""

    world_size: int
    device_type: str  # "cuda" or "cpu"
    dist_backend: str  # "nccl" or "gloo"
    gpu_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    peer_access: bool = False  # every local GPU pair can access each other's memory
    extra: dict[str, Any] = field(default_factory=dict)
    gpus: int = 0  # CUDA GPUs this host shows, whatever device the ranks run on

    @staticmethod
    def has_package(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    def needs_cuda(self, what: str) -> str:
        """The reason a backend that runs on CUDA ranks gives on other ranks, true for this host:
        a GPU host running CPU ranks is not a host without GPUs."""
        if self.gpus:
            return f"needs CUDA ranks ({what}); these ranks run on the CPU"
        return f"needs CUDA GPUs ({what}); none visible here"

    @classmethod
    def local(cls, world_size: int, device_type: str) -> BackendEnv:
        """Describe this process's machine for `world_size` ranks on `device_type`."""
        import torch

        n = torch.cuda.device_count()
        if device_type != "cuda":
            return cls(world_size=world_size, device_type="cpu", dist_backend="gloo", gpus=n)
        peer = n >= 2 and all(torch.cuda.can_device_access_peer(a, b) for a in range(n) for b in range(n) if a != b)
        return cls(
            world_size=world_size,
            device_type="cuda",
            dist_backend="nccl",
            gpu_name=torch.cuda.get_device_name(0) if n else None,
            compute_capability=torch.cuda.get_device_capability(0) if n else None,
            peer_access=peer,
            gpus=n,
        )


def virtual_world(group: Any) -> Any:
    """The `kernels.virtual.VirtualWorld` whose rank `group` stands for, or None for a process group."""
    return getattr(group, "virtual_world", None)


def group_position(group: Any) -> tuple[int, int]:
    """(rank, world size) of this process in `group`, or of the virtual rank `group` is."""
    world = virtual_world(group)
    if world is not None:
        return group.rank, world.size
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group)


@dataclass
class Dispatched:
    """What `dispatch` returns: the received rows and what `combine` needs to send them back."""

    x: torch.Tensor  # [N, H] payload dtype
    topk_ids: torch.Tensor  # [N, k] global expert ids, -1 where not local
    topk_weights: torch.Tensor  # [N, k] fp32
    handle: Any = None
    x_scale: torch.Tensor | None = None  # quantized payloads only


class All2AllBackend(ABC):
    """Base class of every backend; subclasses register with `@register_backend`.

    Subclasses set `name` (our registry name) and `engine_names = {engine: literal}`, the engines'
    literals the backend stands for, keyed by `a2a_tune.tuner.runtime.engines.ENGINES` (None or
    absent: the engine has no equivalent; then `closest_names = {engine: literal}` may name the
    engine's nearest backend, written into tables for operators). A table records both maps;
    `engine_options` where an engine needs more than the literal.
    """

    name: ClassVar[str]
    # engine -> literal (e.g. {"vllm": "deepep_low_latency", "sglang": "deepep", "trtllm": ...}),
    # and engine -> the literal of the engine's backend that does the same job, for those
    # without one (lookup for that engine never returns it in this backend's place).
    engine_names: ClassVar[dict[str, str | None]] = {}
    closest_names: ClassVar[dict[str, str]] = {}
    # Options an engine needs beside the literal to run this backend, e.g. SGLang's
    # {"sglang": ("--deepep-mode", "low_latency")}: one literal, two backends.
    engine_options: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Which EP groups the transport can join (REACHES); the default: whatever the process
    # group connects, as the torch.distributed collectives do.
    reach: ClassVar[str] = "anywhere"
    # Backends whose dispatch needs a host read of data-dependent sizes cannot be captured
    # in a CUDA graph; the sweep times those eagerly.
    graph_capturable: ClassVar[bool] = False
    # Whether a backend that is not capturable reads the device from the host in its dispatch
    # (one timed eagerly for another reason says False): its eager dispatch and combine are then
    # not timed apart on a GPU (tuner/timing.unsplit_reason). A capturable one never does.
    reads_host: ClassVar[bool] = True
    # The payload dtypes (PAYLOADS) the backend carries in the engine: what it would be given
    # there. Another is "does not carry": never built, never timed, never a failure. Quantized
    # ones travel as the wire rows with `x_scale` beside them.
    # The quantize is part of `dispatch` (timed with it) for every backend: vLLM quantizes in
    # its prepare() for every all2all backend (prepare_finalize/*.py), DeepEP's low-latency
    # kernel inside itself (docs/architecture.md, "Payloads").
    payloads: ClassVar[frozenset[str]] = PLAIN_PAYLOADS
    # Fixed-capacity backends cost what their capacity costs: the sweep builds them with
    # max_tokens_per_rank = the load being timed, or the engine's capacity (--capacity).
    capacity_bound: ClassVar[bool] = False
    # Fixed-capacity backends whose kernels take the step's size at run time (FlashInfer's
    # runtime_max_tokens_per_rank, which vLLM sets to its max over DP ranks each step): after
    # `set_step_tokens(n)` their layout and work scale with n, not with the capacity.
    step_sized: ClassVar[bool] = False
    # Tunable launch parameters: name -> the values allowed (a categorical search space), and
    # the value of each the backend runs with unless `set_knobs` says otherwise.
    knob_space: ClassVar[dict[str, tuple]] = {}
    knob_defaults: ClassVar[dict[str, Any]] = {}
    # Whether W instances can run as virtual ranks of one process on one device (`group` a
    # `kernels.virtual.VirtualRank`): backends that reach peers only through memory they map
    # themselves. Collective-based ones (torch.distributed, NCCL, NVSHMEM) need real ranks.
    virtual_ranks: ClassVar[bool] = False
    # Why the backend cannot run on a sub-group of the ranks (an EP size below the world, its
    # groups side by side: tuner.groups), or None when it is built on any group it is given.
    sub_group_reason: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        stale = sorted(f for f in ("vllm_name", "sglang_name", "trtllm_name", "vllm_closest") if f in cls.__dict__)
        if stale:  # the spelling before the maps: refused, or its literals would be lost silently
            raise TypeError(
                f"backend class {cls.__name__} declares {', '.join(stale)}: declare "
                "engine_names = {engine: literal} and closest_names instead"
            )

    def __init__(self, group: dist.ProcessGroup | None, shape: MoEShape, device: torch.device) -> None:
        self.group = group
        self.shape = shape
        self.device = device
        self.rank, self.world_size = group_position(group)
        shape.validate(self.world_size)
        ok, reason = type(self).feasibility(shape, self.world_size)
        if not ok:  # the one place a constructor checks the shape against this backend's limits
            raise ShapeError(reason)
        self.experts_per_rank = shape.experts_per_rank(self.world_size)
        self.dtype = torch_dtype(shape.dtype)  # activations
        self.wire_dtype = wire_dtype(shape.dtype)  # None unless the payload is quantized
        self._step_tokens: int | None = None  # set_step_tokens

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        """Whether this backend can run in `env`; never raises, does no collective work.

        Default: any torch.distributed backend with at least 2 ranks (what an all2all over
        the process group needs); backends with more needs override it."""
        if env.world_size < 2:
            return Availability(False, "needs at least 2 ranks")
        return Availability(True)

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        """Whether this backend can take `shape` (e.g. a capacity limit); default: any valid shape.

        Per shape, unlike `availability`: the sweep skips infeasible cases without failing them.
        The constructor raises ShapeError with the reason; subclasses do not re-check."""
        if shape.dtype not in cls.payloads:
            return Availability(False, f"does not carry {shape.dtype}")
        return Availability(True)

    @classmethod
    def received_rows(cls, shape: MoEShape, world_size: int) -> int:
        """The most rows of H one rank holds for a dispatch: by default W x capacity (every
        source's tokens once: the all-gather, padded and one-sided layouts, and the most an
        all2allv can receive). Layouts with more slots (expert-major low-latency) override it.
        Feeds `case_bytes`."""
        return world_size * shape.max_tokens_per_rank

    @abstractmethod
    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """Send every token to the ranks owning its experts (see the module docstring)."""

    @abstractmethod
    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        """Return y[T_r, H]: the sum of the expert outputs of each source token."""

    def combine_buffer(self, dispatched: Dispatched) -> torch.Tensor | None:
        """[N, H] activation-dtype buffer the expert computation may write its output into, so
        that `combine` skips a staging copy (FlashInfer's workspace); None (default): combine
        reads expert outputs wherever they are. Valid between this dispatch and its combine."""
        return None

    def knobs(self) -> dict[str, Any]:
        """Settings in effect that change this backend's speed (block sizes, SM counts...),
        recorded with each measurement: the applied knobs (defaults until `set_knobs`)."""
        return dict(getattr(self, "_knobs", None) or self.knob_defaults)

    @classmethod
    def check_knobs(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        """The full setting `knobs` asks for (defaults filled in); KnobError (one line) on a
        name outside `knob_space` or a value it does not allow."""
        for name, value in knobs.items():
            if name not in cls.knob_space:
                known = ", ".join(cls.knob_space) or "none"
                raise KnobError(f"{cls.name}: unknown knob {name!r} (knobs: {known})")
            allowed = cls.knob_space[name]
            if value not in allowed or type(value) is not type(cls.knob_defaults[name]):
                raise KnobError(
                    f"{cls.name}: knob {name}={value!r} not allowed (one of {', '.join(map(repr, allowed))})"
                )
        return {**cls.knob_defaults, **knobs}

    def set_knobs(self, knobs: dict[str, Any]) -> None:
        """Run the following dispatch/combine calls with `knobs` (names of `knob_space`; the
        others keep their defaults). Validated first (KnobError); `{}` restores the defaults."""
        self._knobs = type(self).check_knobs(knobs)
        self.apply_knobs(self._knobs)

    def apply_knobs(self, knobs: dict[str, Any]) -> None:  # noqa: B027
        """Backends with a `knob_space`: make the validated full setting `knobs` take effect."""

    def set_step_tokens(self, tokens: int | None) -> None:
        """The most tokens any rank passes to the following dispatch calls (an engine's step
        maximum over ranks; the same on every rank), or None: `max_tokens_per_rank`. A
        `step_sized` backend then moves [W * tokens] received rows instead of [W * capacity];
        the others keep their layout. Every backend refuses a dispatch of more tokens than
        this (ShapeError). Set it between round trips, never between a dispatch and its combine."""
        cap = self.shape.max_tokens_per_rank
        if tokens is not None and not 1 <= tokens <= cap:
            raise ShapeError(f"step of {tokens} tokens per rank outside 1..{cap} (max_tokens_per_rank)")
        self._step_tokens = tokens

    @property
    def step_capacity(self) -> int:
        """Slots per source rank this step: the step's size if set, else the capacity."""
        return self._step_tokens or self.shape.max_tokens_per_rank

    def gave_up(self) -> bool:
        """Whether a device-side wait timed out since construction (a peer never signalled):
        results since then are garbage. Host-synchronising; backends without such waits: False."""
        return False

    def close(self) -> None:  # noqa: B027
        """Free workspaces. Safe to call twice."""

    def local_expert_range(self) -> tuple[int, int]:
        lo = self.rank * self.experts_per_rank
        return lo, lo + self.experts_per_rank

    def check_inputs(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> int:
        """Validate one rank's inputs against the shape; return T_r."""
        t = x.shape[0]
        s = self.shape
        if x.dim() != 2 or x.shape[1] != s.hidden:
            raise ShapeError(f"x must be [T, {s.hidden}], got {list(x.shape)}")
        if tuple(topk_ids.shape) != (t, s.topk) or tuple(topk_weights.shape) != (t, s.topk):
            raise ShapeError(
                f"topk_ids/topk_weights must be [{t}, {s.topk}], got {list(topk_ids.shape)} / {list(topk_weights.shape)}"
            )
        if t > s.max_tokens_per_rank:
            raise ShapeError(f"{t} tokens exceed max_tokens_per_rank {s.max_tokens_per_rank}")
        if t > self.step_capacity:
            raise ShapeError(f"{t} tokens exceed this step's {self.step_capacity} (set_step_tokens)")
        if x.dtype != self.dtype:
            raise ShapeError(f"x is {x.dtype}, backend built for {self.dtype}")
        return t

    def __enter__(self) -> All2AllBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
