"""`a2a-tune plot`: one PNG per shape -- latency vs tokens per rank, one line per backend.

Each figure (log-log axes): every backend's median round trip with its p10-p90 band, and
where the table has them (schema 3) its dispatch and combine medians as thin dashed and
dotted lines in the same colour;
backends failed for the shape drawn dotted and named so; the winner per token bucket
shaded along the x axis (a colour strip at the bottom, the same colour faintly over the
whole height, hatched where the winner is a tie); and the physical limit as a dashed
line when it is known.

The physical limit is the copy bound: the bytes each rank must send to the others in one
dispatch + combine round trip, over the bandwidth one rank can send at::

    bytes(T) = 2 (dispatch + combine) x T x H x bytes(dtype) x remote(E, k, W)
    remote   = (W - 1) x (1 - C(E - E/W, k) / C(E, k))   # expected other ranks a token
                                                        # has an expert on (uniform routing)

matplotlib (``pip install a2a-tune[plot]``) is imported lazily, with the Agg backend.

Design notes: docs/architecture.md, "Module notes", `tuner/views/plot.py`.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

from ..figures import link_bandwidth, row_bytes
from ..runtime.point import PAYLOADS
from .model import ShapeView, TableView, ViewError, shape_label, shape_slug, write_output
from .show import timing_summary

__all__ = [
    "CopyBound",
    "copy_bound",
    "plot_view",
    "plots_unavailable",
    "render_png",
    "backend_colors",
    "PlotUnavailable",
]

#: Bytes per element of dtypes older tables may name outside a2a-tune's payloads (whose rows,
#: packed values and scales, figures.row_bytes counts); a dtype in neither gets no bound.
DTYPE_BYTES = {"fp8": 1, "fp8_e5m2": 1, "int8": 1}

# Backend colours: tab10 without its grey (reserved for failed backends and the bound).
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]


class PlotUnavailable(ViewError):
    """matplotlib is not installed."""


class CopyBound:
    """The copy bound of one shape: ``us(tokens)``, plus the words that say what it assumes."""

    def __init__(self, gbs: float, bytes_per_token: float, assumption: str) -> None:
        self.gbs = gbs
        self.bytes_per_token = bytes_per_token
        self.assumption = assumption

    def us(self, tokens: float) -> float:
        return tokens * self.bytes_per_token / (self.gbs * 1e9) * 1e6


def remote_ranks(num_experts: int, topk: int, world: int) -> float:
    """Expected number of other ranks a token has at least one of its top-k experts on,
    with top-k distinct experts drawn uniformly and E/W experts per rank."""
    if world < 2 or num_experts % world or topk > num_experts:
        return float(world - 1)
    local = num_experts // world
    p_none = math.comb(num_experts - local, topk) / math.comb(num_experts, topk)
    return (world - 1) * (1 - p_none)


def copy_bound(view: TableView, shape: ShapeView, link_gbs: float | None = None) -> tuple:
    """(CopyBound, None) or (None, why there is no line)."""
    dtype = str(shape.dtype).lower()
    if dtype in PAYLOADS:
        rows = row_bytes(dtype, shape.hidden)  # dispatch (packed values + scales), combine (model dtype)
    elif dtype in DTYPE_BYTES:
        rows = (shape.hidden * DTYPE_BYTES[dtype],) * 2
    else:
        return None, f"no copy bound: bytes per element of {shape.dtype} unknown"
    if shape.routing != "uniform":
        return None, f"no copy bound: it is derived for uniform routing, this shape is {shape.routing}"
    if link_gbs is not None:
        gbs, source = float(link_gbs), "(given with --link-gbs)"
    else:
        found = link_bandwidth(view.facts, shape.ep_size)
        if found is None:
            return None, (
                f"no copy bound: the probe facts show no NVLink island or PCIe link of {shape.ep_size} GPUs; "
                "pass --link-gbs to draw one"
            )
        gbs, source = found.gbps, f"= {found.how} per GPU, from the probe facts"
    remote = remote_ranks(shape.num_experts, shape.topk, shape.ep_size)
    per_token = sum(rows) * remote
    assumption = (
        f"copy bound = bytes each rank sends (dispatch + combine: T x ({rows[0]} + {rows[1]}) B x "
        f"{remote:.3g} other ranks per token, uniform routing) / {gbs:.0f} GB/s {source}"
    )
    return CopyBound(gbs, per_token, assumption), None


# The architecture's backends keep one colour in every plot and report, so figures of two
# machines (or of last month's run) compare at a glance; others take what is left.
_FIXED = {
    "allgather_reducescatter": "#1f77b4",
    "nccl_all2allv": "#ff7f0e",
    "nvlink_one_sided": "#2ca02c",
    "nvlink_low_latency": "#d62728",
    "flashinfer_nvlink_one_sided": "#9467bd",
    "flashinfer_nvlink_two_sided": "#8c564b",
    "deepep_low_latency": "#e377c2",
    "deepep_high_throughput": "#bcbd22",
}


def backend_colors(names) -> dict:
    """backend -> colour: fixed for the known backends, the rest of the palette in name order."""
    names = sorted(set(names))
    out = {n: _FIXED[n] for n in names if n in _FIXED}
    free = [c for c in _PALETTE if c not in out.values()] or _PALETTE
    for i, n in enumerate(n for n in names if n not in out):
        out[n] = free[i % len(free)]
    return out


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("plotting needs matplotlib: pip install 'a2a-tune[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plots_unavailable() -> str | None:
    """Why no plot can be drawn here (matplotlib is not installed), or None."""
    try:
        _pyplot()
    except PlotUnavailable as exc:
        return str(exc)
    return None


def _tok_label(t: float) -> str:
    t = int(round(t))
    if t >= 1024 and t % 1024 == 0:
        return f"{t // 1024}k"
    return str(t)


def _us_tick(v: float) -> str:
    """Tick labels on a log µs axis: 0.05, 0.1, 2, 50, 1,000, 20,000."""
    if v >= 1:
        return f"{v:,.0f}"
    return f"{v:.3g}"


_HALF_STYLES = {"dispatch_us": (0, (5, 2)), "combine_us": (0, (1, 1.5))}


def _plot_halves(ax, curve, tokens: list, color: str) -> list:
    """Dispatch and combine medians of one backend as thin lines; returns the values drawn."""
    drawn = []
    for name, style in _HALF_STYLES.items():
        pts = [(t, curve.figure(name, j)) for j, t in enumerate(tokens) if curve.figure(name, j) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=style, lw=1.1, color=color, alpha=0.9, zorder=3)
            drawn += [p[1] for p in pts]
    return drawn


def _edges(tokens: list) -> list:
    """Bucket edges on a log axis: geometric midpoints; the ends extend half a step."""
    if len(tokens) == 1:
        return [tokens[0] / 1.5, tokens[0] * 1.5]
    mids = [math.sqrt(a * b) for a, b in zip(tokens, tokens[1:])]
    first = tokens[0] ** 2 / mids[0]
    last = tokens[-1] ** 2 / mids[-1]
    return [first, *mids, last]


def rehearsal_label(view: TableView) -> str | None:
    """The label a CPU rehearsal's figures carry (None for a machine's measurements)."""
    from .load import REHEARSAL_NOTE

    return "CPU rehearsal: not a machine's figures" if REHEARSAL_NOTE in view.notes else None


def render_png(
    view: TableView, shape: ShapeView, *, link_gbs: float | None = None, colors: dict | None = None, dpi: int = 110
) -> bytes:
    """The figure of one shape as PNG bytes."""
    plt = _pyplot()
    # Names and reasons come from tables: a "$" in them is text, never matplotlib math.
    with plt.rc_context({"text.parse_math": False}):
        return _figure(plt, view, shape, link_gbs, colors, dpi)


def _figure(plt, view: TableView, shape: ShapeView, link_gbs, colors, dpi: int) -> bytes:
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    colors = colors or backend_colors(c.backend for c in shape.curves.values())
    fig, ax = plt.subplots(figsize=(10.5, 6.4), dpi=dpi)  # height set below, once the legend is known
    tokens = shape.tokens
    edges = _edges(tokens)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(edges[0], edges[-1])

    mixed = len({c.timing for c in shape.curves.values()}) > 1  # schema 2: say each curve's mode
    handles = []
    ys = []
    med_all = []  # medians of backends not failed: what the frame is for
    halves = []  # dispatch and combine medians drawn: in the frame too
    for label, c in shape.curves.items():
        pts = [(t, *c.at(j)) for j, t in enumerate(tokens) if c.at(j)[0] is not None]
        if not pts:
            continue
        failed = c.backend in shape.failed
        color = "#7f7f7f" if failed else colors.get(c.backend, "#333333")
        xs = [p[0] for p in pts]
        med = [p[1] for p in pts]
        ys += med
        if not failed:
            med_all += med
        name = label + (f" ({c.timing})" if mixed and c.timing else "")
        name += f"  (failed: {shape.failed[c.backend].kind}; never selected)" if failed else ""
        (line,) = ax.plot(
            xs,
            med,
            marker="o",
            ms=4,
            lw=2 if not failed else 1.3,
            color=color,
            ls=":" if failed else "-",
            label=name,
            zorder=3,
        )
        handles.append(line)
        if not failed:
            halves += _plot_halves(ax, c, tokens, color)
        band = [(p[0], p[2], p[3]) for p in pts if p[2] is not None and p[3] is not None]
        if band and not failed:
            ax.fill_between(
                [b[0] for b in band],
                [b[1] for b in band],
                [b[2] for b in band],
                color=color,
                alpha=0.18,
                lw=0,
                zorder=2,
            )
            ys += [b[1] for b in band] + [b[2] for b in band]

    ys += halves
    if halves:
        from matplotlib.lines import Line2D

        handles += [
            Line2D([], [], color="#555555", lw=1, ls=_HALF_STYLES["dispatch_us"], label="dispatch (timed apart)"),
            Line2D([], [], color="#555555", lw=1, ls=_HALF_STYLES["combine_us"], label="combine (timed apart)"),
        ]

    bound, why_not = copy_bound(view, shape, link_gbs)
    if bound is not None:
        xs = [edges[0], *tokens, edges[-1]]
        bl = [bound.us(x) for x in xs]
        (bline,) = ax.plot(
            xs,
            bl,
            ls="--",
            color="black",
            lw=1.4,
            zorder=4,
            label=f"copy bound at {bound.gbs:.0f} GB/s (physical limit)",
        )
        handles.append(bline)
        ys += [v for v in bl if v > 0]

    if ys:
        # Keep the measured curves readable: the bound may sit decades below them at
        # small T (it then enters the frame from below); show at most ~2.5 decades under
        # the fastest measurement.
        lo, hi = min(ys), max(ys)
        if med_all:
            lo = max(lo, min(med_all) / 300)
        ax.set_ylim(lo / 1.6, hi * 1.5)

    # Winner bands: a strip along the x axis, the same colour faintly over the height.
    winners = {w.tokens: w for w in shape.winners}
    seen = {}
    for j, t in enumerate(tokens):
        w = winners.get(t)
        if w is None:
            continue
        backend = shape.curves[w.backend].backend if w.backend in shape.curves else w.backend
        color = colors.get(backend, "#333333")
        ax.axvspan(edges[j], edges[j + 1], ymin=0, ymax=1, color=color, alpha=0.06, lw=0, zorder=0)
        ax.axvspan(
            edges[j],
            edges[j + 1],
            ymin=0,
            ymax=0.035,
            facecolor=color,
            alpha=0.85 if not w.tie else 0.45,
            hatch="///" if w.tie else None,
            edgecolor="white",
            lw=0.6,
            zorder=1,
        )
        seen.setdefault(w.backend, color)
    strip = [Patch(facecolor=c, alpha=0.85, label=f"winner: {b}") for b, c in seen.items()]
    if any(w.tie for w in shape.winners):
        strip.append(Patch(facecolor="white", edgecolor="#555555", hatch="///", label="winner within noise (tie)"))

    ax.xaxis.set_major_locator(FixedLocator(tokens))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tok_label(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _us_tick(v)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: _us_tick(v) if f"{v:.0e}"[0] in "25" else ""))
    ax.tick_params(axis="both", labelsize=9)
    ax.tick_params(axis="y", which="minor", labelsize=8)
    ax.grid(True, which="major", color="#dddddd", lw=0.7)
    ax.grid(True, which="minor", axis="y", color="#eeeeee", lw=0.5)
    ax.set_xlabel("tokens per rank (log scale)", fontsize=10)
    ax.set_ylabel("dispatch + combine round trip, µs (log scale)", fontsize=10)

    # Layout in inches, so the plot area keeps its size however long the legend is:
    # title block, axes, x label, legend rows (two columns), footnote.
    rows = math.ceil(len(handles + strip) / 2)
    top_in, axes_in, xlabel_in, legend_in, foot_in = 0.95, 3.9, 0.55, 0.2 * rows + 0.1, 0.42
    height = top_in + axes_in + xlabel_in + legend_in + foot_in
    fig.set_size_inches(10.5, height)
    fig.subplots_adjust(
        left=0.085, right=0.985, top=1 - top_in / height, bottom=(xlabel_in + legend_in + foot_in) / height
    )

    fig.suptitle(
        shape_label(shape) + ("  [predicted]" if shape.source != "measured" else ""),
        fontsize=13,
        fontweight="bold",
        x=0.085,
        ha="left",
        y=1 - 0.22 / height,
    )
    run = view.run
    sub = [view.fingerprint or "unknown hardware"]
    if run.get("id") is not None:
        sub.append(f"run {run['id']}")
    if run.get("started_at"):
        sub.append(str(run["started_at"])[:10])
    timing = timing_summary(view)
    if timing and ";" not in timing:
        sub.append(f"{timing} timing")
    versions = run.get("versions") or {}
    sub += [f"{k} {versions[k]}" for k in ("torch", "nccl") if versions.get(k)]
    sub.append("lines: median, bands: p10-p90")
    fig.text(0.085, 1 - 0.58 / height, "  ·  ".join(sub), fontsize=9, color="#444444", ha="left")
    rehearsal = rehearsal_label(view)
    if rehearsal:  # a CPU rehearsal's picture must not pass for a machine's figures
        fig.text(0.985, 1 - 0.22 / height, rehearsal, fontsize=10, color="#b00020", ha="right", fontweight="bold")

    fig.legend(
        handles=handles + strip,
        loc="lower left",
        bbox_to_anchor=(0.085, foot_in / height),
        ncol=2,
        fontsize=8.5,
        frameon=False,
        handlelength=2.4,
        columnspacing=2.0,
        borderaxespad=0,
    )
    note = bound.assumption if bound is not None else why_not
    fig.text(0.085, 0.06 / height, note, fontsize=7.5, color="#555555", ha="left", va="bottom", wrap=True)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Description": rehearsal or shape_label(shape)})
    plt.close(fig)
    return buf.getvalue()


def source_tag(view: TableView) -> str:
    """What names a view's source in its file names: ``run<id>`` for a run of a store, the
    table file's name for a table (``table`` when it is the fingerprint's own): another run or
    another table of one machine plotted into one folder never overwrites these."""
    if view.kind == "run":
        return f"run{view.run.get('id', '')}"
    stem = Path(view.label).name.removesuffix(".json")
    return "table" if stem == view.fingerprint else re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip(".-") or "table"


def plot_view(view: TableView, out_dir, *, link_gbs: float | None = None) -> list:
    """Write one PNG per shape into ``out_dir``; returns the paths, in table order."""
    if not view.shapes:
        raise ViewError(f"{view.label}: nothing to plot (no shapes with measurements)")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ViewError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    colors = backend_colors(c.backend for s in view.shapes for c in s.curves.values())
    prefix = f"{view.fingerprint or 'unknown'}.{source_tag(view)}".replace("/", "-")
    paths = []
    for s in view.shapes:
        data = render_png(view, s, link_gbs=link_gbs, colors=colors)
        path = out_dir / f"{prefix}.{shape_slug(s)}.png"
        paths.append(write_output(path, data))
    return paths
