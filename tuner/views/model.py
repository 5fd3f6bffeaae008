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
import statistics
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..figures import LinkBandwidth, gbps, is_cpu, link_bandwidth, link_pct
from ..runtime.measurement import FIGURE, FIGURES
from ..runtime.point import Shape
from ..runtime.point import shape_label as point_label
from ..runtime.table import SHAPE_KEYS
from ..runtime.text import one_line

__all__ = [
    "EN_DASH",
    "FIGURE_LABELS",
    "FIGURE_NAMES",
    "RATES",
    "RUN_TIMES",
    "Curve",
    "FailureView",
    "ShapeView",
    "TableView",
    "ViewError",
    "clean",
    "fmt_pct",
    "fmt_us",
    "point_figures",
    "shape_link",
    "rank_hosts",
    "shape_label",
    "shape_slug",
    "suspect_groups",
    "suspect_line",
    "token_range",
    "when",
]

EN_DASH = "\u2013"
#: A run's times (ISO strings in a view; a2a_tune.db's Run says what each is): when its ranks
#: opened it and it ended, when its command began and its latest --resume (those two: None
#: when not recorded, as before revision 0006).
RUN_TIMES = ("started_at", "finished_at", "launched_at", "resumed_at")


def write_output(path, data: str | bytes):
    """Write a report or a figure to ``path`` atomically (a temporary file in the same directory,
    renamed over it: a reader never sees half a file). A path that names something other than a
    regular file -- a FIFO would block the write until a reader comes, a device would take the
    bytes -- is refused with a :class:`ViewError`, as is a failed write. A symlink's target is
    the file written. Returns the path."""
    import os
    import stat
    from pathlib import Path

    from ..runtime.profiles import replace_file

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ViewError(f"cannot write {clean(path)}: {exc.strerror or exc}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ViewError(f"cannot write {clean(path)}: not a regular file (a FIFO, device or directory is not replaced)")
    try:
        replace_file(path, data)  # a symlink: its target is replaced, the link kept
    except OSError as exc:
        raise ViewError(f"cannot write {clean(path)}: {exc.strerror or exc}") from None
    return path


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
    figures: dict = field(default_factory=dict)  # schema 3: figure name -> list aligned with tokens
    # runs: each EP group's median per token count (None where not stored; tuner.groups)
    group_us: list = field(default_factory=list)
    # the tuned launch setting per token count (None: the backend's defaults): the table's
    # ``knobs``, or for a run what tune-knobs stored for its machine
    knobs: list = field(default_factory=list)

    def at(self, j: int) -> tuple:
        """(median, p10, p90) at token index j, each None when missing."""
        return self.median_us[j], self.p10_us[j], self.p90_us[j]

    def figure(self, name: str, j: int):
        """Figure `name` (a table key of runtime.measurement.FIGURES) at token index j, or None."""
        values = self.figures.get(name)
        return values[j] if values is not None else None


@dataclass
class FailureView:
    backend: str
    kind: str
    reason: str
    shape: tuple | None  # None: not about one shape (e.g. "unavailable")
    tokens: int | None


#: How the views word an entry's fabric (:data:`~a2a_tune.tuner.runtime.table.FABRICS`).
FABRIC_WORDS = {
    "island": "one NVLink island",
    "domain": "one multi-node NVLink domain",
    "network": "nodes without NVLink between them",
}


@dataclass
class ShapeView:
    """One table entry as the views show it. Its shape's fields read through: ``view.hidden``
    is ``view.shape.hidden``."""

    shape: Shape
    source: str  # "measured" | "predicted"
    tokens: list
    curves: dict  # backend -> Curve
    winners: list  # [Winner], ascending tokens
    failed: dict  # backend -> runtime.table.Failed (kind, tokens, reason; str(): one line); never a winner
    fabric: str | None = None  # what its EP groups span (runtime.table.FABRICS); None: not recorded
    # the runs its measurements come from, newest first: {run, date, facts_hash, status}
    provenance: list = field(default_factory=list)

    def sources(self) -> str:
        """Its runs in one line, e.g. "run 5 (2026-12-01, completed), run 3 (...)"."""
        return ", ".join(
            f"run {p['run']} ({', '.join(str(p[k]) for k in ('date', 'status') if p.get(k))})" for p in self.provenance
        )

    @property
    def key(self) -> tuple:
        return tuple(self.shape)

    def __getattr__(self, name: str):
        if name in SHAPE_KEYS:  # only the shape's fields; a missing attribute stays an AttributeError
            return getattr(self.shape, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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
    run: dict  # id, status, device_type, world_size, versions, timing, RUN_TIMES, git_sha, config
    backends: dict  # backend -> {"engines": {engine: literal}, ...} as the table writes it
    shapes: list  # [ShapeView]
    failures: list  # [FailureView]
    notes: list = field(default_factory=list)  # what the reader tolerated, one line each

    def shape(self, key: tuple) -> ShapeView | None:
        for s in self.shapes:
            if s.key == key:
                return s
        return None


# ----------------------------------------------------------------------------- figures


class Rate(NamedTuple):
    """A figure the views compute from two declared ones (``tuner.figures``): the bytes figure
    `nbytes` moved in the time figure `time`, as GB/s, or as % of the link (`share`)."""

    name: str
    label: str
    nbytes: str
    time: str
    share: bool = False


#: What the views compute beside the declared figures.
RATES = (
    Rate("logical_gbps", "dispatch GB/s", "dispatch_logical_bytes", "dispatch_us"),
    Rate("link_pct", "dispatch % link", "dispatch_link_bytes", "dispatch_us", share=True),
    Rate("combine_logical_gbps", "combine GB/s", "combine_logical_bytes", "combine_us"),
    Rate("combine_link_pct", "combine % link", "combine_link_bytes", "combine_us", share=True),
)
# The declared figures the views show: those a table holds and the views name.
_SHOWN = tuple(f for f in FIGURES if f.table and f.view)

#: The names `show --json` gives each backend's figures per token count (checks read them):
#: the token count, the round trip, every declared figure the views name, then the rates.
FIGURE_NAMES = ("tokens", "round_trip_us") + tuple(f.view for f in _SHOWN) + tuple(r.name for r in RATES)
#: Each figure's heading in the views' tables, by its name in :data:`FIGURE_NAMES`.
FIGURE_LABELS = {
    "tokens": "tokens/rank",
    "round_trip_us": "round trip µs",
    **{f.view: f.label for f in _SHOWN},
    **{r.name: r.label for r in RATES},
}


# ----------------------------------------------------------------------------- EP groups


def rank_hosts(view: TableView) -> dict:
    """rank -> host name, from the run's cluster record (several nodes) or the probe facts
    (one node: every rank on its host); {} when neither says."""
    nodes = ((view.run.get("config") or {}).get("cluster") or {}).get("nodes") or []
    hosts = {r: clean(n.get("host")) for n in nodes for r in n.get("ranks") or []}
    names = view.facts.get("hostnames") or []
    if not hosts and len(names) == 1:
        hosts = {r: clean(names[0]) for r in range(view.run.get("world_size") or 0)}
    return hosts


def suspect_groups(view: TableView) -> list:
    """The EP groups more than 10% slower than their size's median group (a suspect GPU, link or
    NIC), one dict per (EP size, group): its ranks and hosts, in how many of the size's cases
    with every group's median stored it was slow, and the worst of them."""
    from ..groups import SLOW_GROUP_RATIO, group_ranks, slow_groups

    found: dict = {}
    cases: dict = {}
    for s in view.shapes:
        for c in s.curves.values():
            for j, per_group in enumerate(c.group_us):
                if not per_group or len(per_group) < 2:
                    continue
                cases[s.ep_size] = cases.get(s.ep_size, 0) + 1
                middle = statistics.median(per_group)
                for g in slow_groups(per_group):
                    slower = per_group[g] / middle - 1
                    f = found.setdefault((s.ep_size, g), {"cases": 0, "worst": None})
                    f["cases"] += 1
                    if f["worst"] is None or slower > f["worst"][0]:
                        f["worst"] = (slower, c.backend, s.tokens[j], shape_label(s))
    hosts = rank_hosts(view)
    cpu = is_cpu(view.facts)
    out = []
    for (ep, g), f in sorted(found.items()):
        ranks = group_ranks(ep, g)
        slower, backend, tokens, label = f["worst"]
        out.append(
            {
                "ep_size": ep,
                "group": g,
                "ranks": list(ranks),
                "hosts": sorted({hosts[r] for r in ranks if r in hosts}),
                "slow_cases": f["cases"],
                "cases": cases[ep],
                "worst_pct": round(100 * slower, 1),
                "worst_at": {"backend": backend, "tokens": tokens, "shape": label},
                "threshold_pct": round(100 * (SLOW_GROUP_RATIO - 1)),
                # CPU ranks share the host's cores: a slow group there is load, never a GPU, link or NIC
                "cause": "shared cores" if cpu else "hardware",
            }
        )
    return out


def suspect_line(found: dict) -> str:
    """One slow group in one line, for people, prefixed with what it suggests: "suspect:" a GPU,
    link or NIC; on CPU ranks, which share the host's cores, "note:" (load, not hardware)."""
    r = found["ranks"]
    where = f" on {', '.join(found['hosts'])}" if found["hosts"] else ""
    w = found["worst_at"]
    cpu = found.get("cause") == "shared cores"
    why = "CPU ranks share the host's cores: load, not a GPU, link or NIC" if cpu else "suspect a GPU, link or NIC"
    return ("note: " if cpu else "suspect: ") + (
        f"EP {found['ep_size']} group {found['group']} (ranks {r[0]}-{r[-1]}{where}) is more than "
        f"{found['threshold_pct']}% slower than the median group in {found['slow_cases']} of {found['cases']} cases "
        f"(worst +{found['worst_pct']:.0f}%: {w['backend']} at {w['tokens']} tokens/rank): {why}"
    )


def shape_link(view: TableView, shape: ShapeView) -> LinkBandwidth | None:
    """The link bandwidth per direction of one rank of the shape's EP group (tuner.figures)."""
    return link_bandwidth(view.facts, shape.ep_size)


def point_figures(curve: Curve, tokens: list, link: LinkBandwidth | None) -> list:
    """Per token count, one dict of :data:`FIGURE_NAMES` for `curve` (None where not measured)."""
    rows = []
    for j, t in enumerate(tokens):
        row = {"tokens": t, "round_trip_us": curve.median_us[j]}
        row.update({f.view: curve.figure(f.table, j) for f in _SHOWN})
        for r in RATES:
            nbytes, us = curve.figure(FIGURE[r.nbytes].table, j), curve.figure(FIGURE[r.time].table, j)
            row[r.name] = link_pct(nbytes, us, link) if r.share else gbps(nbytes, us)
        rows.append(row)
    return rows


def fmt_gbps(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.3f}")


def fmt_share(v: float | None) -> str:
    """A % of link: 0.4%, 12%."""
    return "-" if v is None else (f"{v:.0f}%" if v >= 10 else f"{v:.1f}%")


def fmt_mib(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 10 else f"{v:.1f}")


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
    """(experts, top-k, hidden) -> the names of every preset of that shape (two may share one:
    deepseek-v3 and deepseek-v3.2), in the presets' order."""
    try:
        from ..shapes import presets

        names: dict = {}
        for name, p in presets().items():
            names.setdefault((p.num_experts, p.topk, p.hidden), []).append(name)
        return {k: tuple(v) for k, v in names.items()}
    except Exception:  # the view works without preset names
        return {}


def shape_label(shape, *, with_model: bool = True) -> str:
    """``deepseek-v3/deepseek-v3.2 E=256 k=8 H=7168 · bf16 · uniform · EP 2``: the shape named
    by every preset of it (a table does not say which of them was run)."""
    ep, hidden, topk, ne, dtype, routing = shape.key if hasattr(shape, "key") else shape
    models = _preset_names().get((ne, topk, hidden), ()) if with_model else ()
    return point_label(ne, topk, hidden, dtype, routing, ep, models=models)


def shape_slug(shape) -> str:
    """A file-name-safe shape key: ``ep2_e256_k8_h7168_bf16_uniform``."""
    ep, hidden, topk, ne, dtype, routing = shape.key if hasattr(shape, "key") else shape
    raw = f"ep{ep}_e{ne}_k{topk}_h{hidden}_{dtype}_{routing}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)
