"""The glossary's point and shape as types, with the one set of bounds every reader checks.

A *shape* is what identifies a table entry: (ep_size, hidden, topk, num_experts, dtype,
routing). A *point* is a shape at one token count per rank. Both are named tuples in one
field order (:data:`SHAPE_FIELDS`, then ``tokens_per_rank``), so they are dictionary keys and
unpack like the tuples they replace. The command line builds them (``tuner.plans``), the plan
and the ranks carry them, the store keys its rows by :data:`POINT_FIELDS`
(``db.models.KEY_FIELDS`` is ``("backend",) + POINT_FIELDS``), tables hold entries by
:data:`SHAPE_FIELDS` (``runtime.table.Shape`` is :class:`Shape`) and lookup's request is a
shape plus a load.

The bounds are checked here and only here (:func:`check_count`, :func:`check_tokens`,
:meth:`Shape.problem`): the CLI, the store, the table reader and lookup call them. Two
levels: any shape (what lookup answers for: bounds, top-k <= experts) and a shape our
backends can measure (``measuring=True``: also experts divisible over the EP ranks, as the
backend contract requires, and "local" routing's top-k within one rank's experts; engines
such as TensorRT-LLM run uneven experts, so lookup does not refuse them).
The payload vocabulary (:data:`PAYLOADS`) lives here too: the dispatch formats engines send,
each with its bytes per row and the hidden sizes it can take (:meth:`Payload.problem`, checked
by :meth:`Shape.problem` for any shape: no engine can send NVFP4 rows of an odd block).
Standard library only: the engines' start-up path imports it.
"""

from __future__ import annotations

from typing import NamedTuple

from a2a_tune.tuner.runtime.text import one_line

__all__ = [
    "MAX_EP_SIZE",
    "MAX_EXPERTS",
    "MAX_HIDDEN",
    "MAX_MOE_LAYERS",
    "MAX_TPOT_MS",
    "MIN_TPOT_MS",
    "MAX_TOKENS_PER_RANK",
    "MAX_TOPK",
    "POINT_FIELDS",
    "SHAPE_FIELDS",
    "PAYLOADS",
    "Payload",
    "Point",
    "PointError",
    "Shape",
    "check_count",
    "check_tokens",
    "check_tpot_ms",
    "shape_label",
]

#: The fields that identify a table entry, in the one order used everywhere.
SHAPE_FIELDS = ("ep_size", "hidden", "topk", "num_experts", "dtype", "routing")
#: A point: a shape at a token count per rank.
POINT_FIELDS = SHAPE_FIELDS + ("tokens_per_rank",)

#: Tokens per rank of one step: 64x the default grid's largest (16384), far beyond any
#: engine step, and with top-k 8 on 64 ranks still inside int32 row indices.
MAX_TOKENS_PER_RANK = 1 << 20
#: Hidden size: 8x the largest published MoE (DeepSeek-V3's 7168 rounds up to 8192).
MAX_HIDDEN = 1 << 16
#: Routed experts: 16x the largest published count (DeepSeek-V3, Qwen3: 256 / 128).
MAX_EXPERTS = 1 << 12
#: Experts per token.
MAX_TOPK = 64
#: Ranks in one EP group: a GB200 NVL72 domain is 72; 1024 leaves room for larger domains.
MAX_EP_SIZE = 1024
#: MoE layers of one model (the saving per step): 10x the deepest published (Qwen3-235B: 94).
MAX_MOE_LAYERS = 1024
#: A time per output token in ms (the saving as a share of it): 1 us to 1000 s.
MIN_TPOT_MS, MAX_TPOT_MS = 1e-3, 1e6


class Payload(NamedTuple):
    """One dispatch format: what a row of `hidden` activations travels as (the combine carries
    ``activation``, the model dtype). Quantized formats pack ``value_bits`` per element and one
    scale of ``scale_bytes`` per ``block`` elements of a row; NVFP4 also has one FP32 global
    scale per tensor, a per-layer constant every rank holds (vLLM: the checkpoint's input
    scale), so it is not on the wire."""

    name: str
    activation: str  # torch dtype name of x, expert outputs and y
    value_bits: int  # bits per element on the wire
    block: int = 0  # elements per scale; 0: no scales
    scale_bytes: int = 0  # bytes of one scale
    scale_format: str = ""  # what a scale is: fp32, e4m3, e8m0
    exact_blocks: bool = False  # hidden must be a multiple of `block` (else: a short last block)
    wire: str | None = None  # torch dtype name a quantized row travels as; None: as `activation`

    @property
    def quantized(self) -> bool:
        return self.block > 0

    def scales(self, hidden: int) -> int:
        """Scales per row (a short last block has one too)."""
        return -(-hidden // self.block) if self.block else 0

    def value_bytes(self, hidden: int) -> int:
        return hidden * self.value_bits // 8

    def combine_row_bytes(self, hidden: int) -> int:
        """Bytes one combined row moves: H activations (the model dtype)."""
        return hidden * _ACTIVATION_BYTES[self.activation]

    def row_bytes(self, hidden: int) -> int:
        """Bytes one dispatched row moves: the packed values and their scales (NVFP4: H/2 + H/16;
        MXFP8: H + H/32; block-FP8: H + 4 x ceil(H/128))."""
        return self.value_bytes(hidden) + self.scales(hidden) * self.scale_bytes

    def problem(self, hidden: int) -> str | None:
        """Why rows of `hidden` cannot be this payload (one line), or None."""
        if self.exact_blocks and hidden % self.block:
            return f"--dtype {self.name} needs hidden divisible by its {self.block}-element block, got hidden={hidden}"
        return None


_ACTIVATION_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

#: The payload dtypes (``--dtype``, the store, tables, lookup), by name.
PAYLOADS = {
    p.name: p
    for p in (
        Payload("bf16", "bfloat16", 16),
        Payload("fp16", "float16", 16),
        Payload("fp32", "float32", 32),
        # block-FP8 (DeepSeek-V3's activations): e4m3 values, one fp32 scale per 1 x 128
        Payload("fp8_e4m3", "bfloat16", 8, 128, 4, "fp32", wire="float8_e4m3fn"),
        # OCP MX FP8: e4m3 values, one E8M0 (power of two) scale per 32
        Payload("mxfp8", "bfloat16", 8, 32, 1, "e8m0", exact_blocks=True, wire="float8_e4m3fn"),
        # NVFP4: e2m1 values two per byte, one E4M3 scale per 16, one FP32 global scale
        Payload("nvfp4", "bfloat16", 4, 16, 1, "e4m3", exact_blocks=True, wire="uint8"),
    )
}


class PointError(ValueError):
    """A shape or token count outside what a2a-tune measures or looks up (one line)."""


def check_count(value, name: str, upper: int) -> int:
    """``value`` as an int in ``1..upper``, or :class:`PointError` naming ``name``."""
    if type(value) is not int:
        raise PointError(f"{name} must be a whole number, got {_short(value)}")
    if not 1 <= value <= upper:
        raise PointError(f"{name} must be in 1..{upper}, got {_short(value)}")
    return value


def check_tokens(value, name: str = "tokens per rank") -> int:
    """A token count per rank in ``1..MAX_TOKENS_PER_RANK``."""
    return check_count(value, name, MAX_TOKENS_PER_RANK)


def check_tpot_ms(value, name: str = "TPOT") -> float:
    """A time per output token in ms, a number in ``MIN_TPOT_MS..MAX_TPOT_MS`` (never 0, inf or
    nan: a share of it must be a finite JSON number), or :class:`PointError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PointError(f"{name} must be a number of ms, got {_short(value)}")
    if not MIN_TPOT_MS <= value <= MAX_TPOT_MS:  # nan fails both
        raise PointError(f"{name} must be {MIN_TPOT_MS:g}..{MAX_TPOT_MS:g} ms, got {_short(value)}")
    return float(value)


_SHAPE_BOUNDS = (("ep_size", MAX_EP_SIZE), ("hidden", MAX_HIDDEN), ("topk", MAX_TOPK), ("num_experts", MAX_EXPERTS))


class Shape(NamedTuple):
    """One table entry's key. Build through :meth:`checked` where the values come from outside."""

    ep_size: int
    hidden: int
    topk: int
    num_experts: int
    dtype: str
    routing: str

    def problem(self, *, measuring: bool = False) -> str | None:
        """Why this shape is impossible (one line), or None. ``measuring``: also why our
        backends cannot measure it (the backend contract's E % W == 0; "local" routing needs
        top-k within one rank's experts)."""
        try:
            for name, upper in _SHAPE_BOUNDS:
                check_count(getattr(self, name), name, upper)
        except PointError as exc:
            return str(exc)
        if self.topk > self.num_experts:
            return f"topk {self.topk} is more than the {self.num_experts} experts"
        for name in ("dtype", "routing"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                return f"{name} must be a non-empty name, got {_short(value)}"
        payload = PAYLOADS.get(self.dtype)
        if payload is not None and (problem := payload.problem(self.hidden)):
            return problem
        if not measuring:
            return None
        if payload is None:
            return f"unknown payload dtype {_short(self.dtype)}; choose from {', '.join(PAYLOADS)}"
        if self.num_experts % self.ep_size:
            return f"{self.num_experts} experts do not divide over {self.ep_size} ranks"
        if self.routing == "local" and self.topk > self.num_experts // self.ep_size:
            return (
                f"'local' routing needs topk {self.topk} <= the {self.num_experts // self.ep_size} experts of one rank"
            )
        return None

    @staticmethod
    def plain(ep_size, hidden, topk, num_experts, dtype, routing) -> bool:
        """True when these values are a shape :meth:`problem` finds nothing wrong with (any
        shape, not ``measuring``): the same bounds, without building a message -- the engines'
        start-up path asks this first and :meth:`problem` only to say why not."""
        return (
            type(ep_size) is int
            and type(hidden) is int
            and type(topk) is int
            and type(num_experts) is int
            and 1 <= ep_size <= MAX_EP_SIZE
            and 1 <= hidden <= MAX_HIDDEN
            and 1 <= topk <= MAX_TOPK
            and topk <= num_experts <= MAX_EXPERTS
            and type(dtype) is str
            and dtype != ""
            and type(routing) is str
            and routing != ""
            and (dtype not in PAYLOADS or PAYLOADS[dtype].problem(hidden) is None)
        )

    def checked(self, *, measuring: bool = False) -> Shape:
        """This shape, or :class:`PointError` saying why it is impossible (see :meth:`problem`)."""
        problem = self.problem(measuring=measuring)
        if problem:
            raise PointError(problem)
        return self

    def describe(self) -> str:
        """``ep_size=2 hidden=7168 ...``: the shape in one line, every field named."""
        return " ".join(f"{name}={value}" for name, value in zip(SHAPE_FIELDS, self))

    def at(self, tokens_per_rank: int) -> Point:
        return Point(*self, tokens_per_rank)


class Point(NamedTuple("_Point", [*((n, Shape.__annotations__[n]) for n in SHAPE_FIELDS), ("tokens_per_rank", int)])):
    """One shape at one token count per rank (a case is one backend at one point): the shape's
    fields, then ``tokens_per_rank``."""

    __slots__ = ()

    @property
    def shape(self) -> Shape:
        return Shape(*self[: len(SHAPE_FIELDS)])

    def checked(self, *, measuring: bool = False) -> Point:
        """This point, or :class:`PointError` (its shape, then its token count)."""
        self.shape.checked(measuring=measuring)
        check_tokens(self.tokens_per_rank)
        return self


def shape_label(
    num_experts: int,
    topk: int,
    hidden: int,
    dtype: str | None = None,
    routing: str | None = None,
    ep_size: int | None = None,
    *,
    models: tuple[str, ...] = (),
) -> str:
    """How a shape is named to people, everywhere (views, messages, progress):
    ``deepseek-v3 E=256 k=8 H=7168 · bf16 · uniform · EP 2``; the parts not given are left out.
    ``models``: the models of that shape, all of them (two presets may share one)."""
    parts = [f"{'/'.join(models) + ' ' if models else ''}E={num_experts} k={topk} H={hidden}"]
    parts += [str(v) for v in (dtype, routing) if v is not None]
    if ep_size is not None:
        parts.append(f"EP {ep_size}")
    return " · ".join(parts)


def _short(value, limit: int = 40) -> str:
    """A value from outside, as the messages quote it: its repr, one bounded line."""
    try:
        text = repr(value)
    except Exception:  # an int beyond Python's digit limit, a broken __repr__
        text = value
    return one_line(text, limit=limit)
