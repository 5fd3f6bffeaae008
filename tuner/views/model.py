"""What every view shows: one table (a profile file, or a run read from the store) as a
:class:`TableView`, and the few formatting rules all views share.

A :class:`TableView` holds per shape each backend's curve over tokens per rank (median,
p10, p90), the winners per token count (:class:`~a2a_tune.tuner.runtime.estimate.Winner`,
by the one tie rule) and the failures with their reasons; plus the run's provenance and the
probe facts. Every string in it that came from a table or a store is one line of
terminal-safe text (:func:`clean`): a view never passes an escape sequence from a table to
the terminal.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any

from ..runtime.table import SHAPE_KEYS
from ..runtime.text import one_line

__all__ = [
    "EN_DASH",
    "Curve",
    "FailureView",
    "ShapeView",
    "TableView",
    "ViewError",
    "clean",
    "fmt_pct",
    "fmt_us",
    "shape_label",
    "shape_slug",
    "token_range",
    "when",
]

EN_DASH = "\u2013"


def clean(text) -> str:
    """One line of terminal-safe text (:func:`~a2a_tune.tuner.runtime.text.one_line`: runs of
    whitespace become one space, other non-printable characters their escape, e.g.
    ``\\x1b``), never cut: names are what people copy."""
    return one_line(str(text), None)


class ViewError(Exception):
    """An input that cannot be shown; ``str()`` is one line for the terminal."""

    def __init__(self, message: str) -> None:
        super().__init__(clean(message))


@dataclass
class Curve:
    """One backend's measurements over a shape's token counts (lists align with
    ``ShapeView.tokens``; None where not measured)."""

    backend: str
    timing: str | None
    median_us: list
    p10_us: list
    p90_us: list

    def at(self, j: int) -> tuple:
        """(median, p10, p90) at token index j, each None when missing."""
        return self.median_us[j], self.p10_us[j], self.p90_us[j]


@dataclass
class FailureView:
    backend: str
    kind: str
    reason: str
    shape: tuple | None  # None: not about one shape (e.g. "unavailable")
    tokens: int | None


@dataclass
class ShapeView:
    ep_size: int
    hidden: int
    topk: int
    num_experts: int
    dtype: str
    routing: str
    source: str  # "measured" | "predicted"
    tokens: list
    curves: dict  # backend -> Curve
    winners: list  # [Winner], ascending tokens
    failed: dict  # backend -> one-line reason; never a winner

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, k) for k in SHAPE_KEYS)


@dataclass
class TableView:
    """Everything a view shows about one table (profile file) or one sweep run."""

    kind: str  # "profile" | "run"
    label: str  # where it came from, e.g. "profiles/h200.json" or "sqlite:///a.db run 3"
    fingerprint: str | None
    schema: Any  # the profile's schema version; None for a run
    generated_at: str | None
    generated_by: str | None
    facts_hash: str | None
    facts: dict  # probe facts ({} when unknown)
    run: dict  # id, status, device_type, world_size, versions, timing, started_at, finished_at, git_sha
    backends: dict  # backend -> {"vllm_name":..., "sglang_name":...}
    shapes: list  # [ShapeView]
    failures: list  # [FailureView]
    notes: list = field(default_factory=list)  # what the reader tolerated, one line each

    def shape(self, key: tuple) -> ShapeView | None:
        for s in self.shapes:
            if s.key == key:
                return s
        return None


# ----------------------------------------------------------------------------- formatting


def parse_time(v) -> _dt.datetime | None:
    if not isinstance(v, str) or not v:
        return None
    try:
        return _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None


def when(v) -> str | None:
    """A timestamp as ``2026-11-30 22:30 UTC`` (unparseable: as given)."""
    t = parse_time(v) if isinstance(v, str) else v
    if t is None:
        return v
    if t.tzinfo is not None:
        t = t.astimezone(_dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M UTC")


def fmt_us(v: float | None) -> str:
    """µs with 3 significant figures at most: 0.412, 41.2, 412, 4120."""
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_pct(m: float | None) -> str:
    return "-" if m is None else f"{m * 100:.0f}%"


def token_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}{EN_DASH}{hi}"


def _preset_names() -> dict:
    try:
        from ..shapes import presets

        return {(p.num_experts, p.topk, p.hidden): name for name, p in presets().items()}
    except Exception:  # the view works without preset names
        return {}


def shape_label(shape, *, with_model: bool = True) -> str:
    """``deepseek-v3 E=256 k=8 H=7168 · bf16 · uniform · EP 2`` (model name when a preset matches)."""
    ep, hidden, topk, ne, dtype, routing = shape.key if hasattr(shape, "key") else shape
    model = _preset_names().get((ne, topk, hidden)) if with_model else None
    core = f"E={ne} k={topk} H={hidden}"
    return f"{model + ' ' if model else ''}{core} · {dtype} · {routing} · EP {ep}"


def shape_slug(shape) -> str:
    """A file-name-safe shape key: ``ep2_e256_k8_h7168_bf16_uniform``."""
    ep, hidden, topk, ne, dtype, routing = shape.key if hasattr(shape, "key") else shape
    raw = f"ep{ep}_e{ne}_k{topk}_h{hidden}_{dtype}_{routing}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)
