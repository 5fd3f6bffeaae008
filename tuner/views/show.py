"""``a2a-tune show``: what a table or a run says, per shape: consecutive token counts with
the same winner collapsed into ranges (margins, runners-up, ties), the failures grouped with
their reasons, and where the numbers come from.

The winners are what the lookup answers at each measured token count (see :mod:`.load`);
a '*' marks a tie: the fastest's p10..p90 spread, capped at 3% above its median, holds
another backend's median, and the table's tie preference chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..figures import NO_LINK, is_cpu, link_text
from ..runtime.table import SHAPE_KEYS
from .model import (
    EN_DASH,
    FABRIC_WORDS,
    ShapeView,
    TableView,
    clean,
    fmt_gbps,
    fmt_mib,
    fmt_pct,
    fmt_share,
    fmt_us,
    parse_time,
    point_figures,
    shape_label,
    shape_link,
    suspect_groups,
    suspect_line,
    token_range,
    when,
)

__all__ = [
    "WinnerRange",
    "figure_rows",
    "group_failures",
    "labelled",
    "provenance_lines",
    "render_show",
    "show_data",
    "timing_summary",
    "winner_ranges",
]


@dataclass
class WinnerRange:
    """Consecutive token counts of one shape with the same winner."""

    lo: int
    hi: int
    backend: str | None  # None: nothing measured there
    points: int
    margin_lo: float | None
    margin_hi: float | None
    runners_up: list  # distinct runner-ups, in order
    ties: list  # token counts where the table marks a tie
    median_lo: float | None
    median_hi: float | None

    @property
    def tokens(self) -> str:
        return token_range(self.lo, self.hi)

    @property
    def margin(self) -> str:
        if self.margin_lo is None:
            return "-"
        if fmt_pct(self.margin_lo) == fmt_pct(self.margin_hi):
            return fmt_pct(self.margin_lo)
        return f"{self.margin_lo * 100:.0f}{EN_DASH}{self.margin_hi * 100:.0f}%"

    def line(self) -> str:
        """``1–64: allgather_reducescatter (margin 12–80%)``."""
        if self.backend is None:
            return f"{self.tokens}: no backend measured"
        extra = f"margin {self.margin}" if self.margin_lo is not None else "only backend"
        if self.ties:
            extra += f"; tie at {_list_tokens(self.ties)}"
        return f"{self.tokens}: {self.backend} ({extra})"


def _list_tokens(ts: list) -> str:
    return ", ".join(str(t) for t in ts) if len(ts) <= 4 else f"{len(ts)} token counts"


def _tie_phrase(ts: list) -> str:
    """'1, 2 tokens/rank' or '7 token counts' (the count already names its unit)."""
    return _list_tokens(ts) + (" tokens/rank" if len(ts) <= 4 else "")


def winner_ranges(shape: ShapeView) -> list:
    """Collapse consecutive token buckets with the same winner into ranges."""
    by_t = {w.tokens: w for w in shape.winners}
    ranges: list = []
    for t in shape.tokens:
        w = by_t.get(t)
        b = w.backend if w else None
        cur = ranges[-1] if ranges else None
        if cur is None or cur.backend != b:
            cur = WinnerRange(t, t, b, 0, None, None, [], [], None, None)
            ranges.append(cur)
        cur.hi = t
        cur.points += 1
        if w is None:
            continue
        if w.margin is not None:
            cur.margin_lo = w.margin if cur.margin_lo is None else min(cur.margin_lo, w.margin)
            cur.margin_hi = w.margin if cur.margin_hi is None else max(cur.margin_hi, w.margin)
        if w.other and w.other not in cur.runners_up:
            cur.runners_up.append(w.other)
        if w.tie:
            cur.ties.append(t)
        if w.median_us is not None:
            cur.median_lo = w.median_us if cur.median_lo is None else min(cur.median_lo, w.median_us)
            cur.median_hi = w.median_us if cur.median_hi is None else max(cur.median_hi, w.median_us)
    return ranges


def _duration(start, end) -> str | None:
    a, b = parse_time(start), parse_time(end)
    if a is None or b is None:
        return None
    s = (b - a).total_seconds()
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h")


def _run_span(run: Mapping) -> str:
    """When the run began and how long it took, start to end (blank while it has not ended).

    The start is when its command began (``launched_at``), its ranks' start-up included. A
    resumed run keeps its first command's start and says when it was resumed: its duration is
    from the latest resume to the end (the pause before it is no part of the run). A run stored
    before the command's start was recorded has only the moment its ranks opened it: that span
    is the measuring alone, and the line says so."""
    launched, end = run.get("launched_at"), run.get("finished_at")
    start = launched or run["started_at"]
    text = when(start)
    if run.get("resumed_at"):
        dur = _duration(run["resumed_at"], end)
        return f"{text}, resumed {when(run['resumed_at'])}" + (f" ({dur} from the resume to the end)" if dur else "")
    dur = _duration(start, end)
    if dur is None:
        return text
    return (
        f"{text} ({dur})" if launched else f"{text} ({dur} of measuring; the ranks' start-up before it is not recorded)"
    )


def timing_summary(view: TableView) -> str | None:
    """'eager', or per mode the backends timed that way when a table mixes modes
    (schema 2: a timing mode per backend per entry)."""
    per_mode: dict = {}
    for s in view.shapes:
        for c in s.curves.values():
            per_mode.setdefault(c.timing or "unknown", set()).add(c.backend)
    if not per_mode:
        return view.run.get("timing")
    if len(per_mode) == 1:
        mode = next(iter(per_mode))
        return None if mode == "unknown" else mode
    return "; ".join(f"{mode}: {', '.join(sorted(bs))}" for mode, bs in sorted(per_mode.items()))


def provenance_lines(view: TableView) -> list:
    """(label, value) pairs saying where the numbers come from (the view's strings are
    terminal-safe already; the run's free-form config is made so here)."""
    run = view.run
    rows = [
        (
            "fingerprint",
            f"{view.fingerprint or 'unknown'}" + (f"  (facts hash {view.facts_hash})" if view.facts_hash else ""),
        )
    ]
    rows.append(("source", view.label + (f"  (profile schema {view.schema})" if view.kind == "profile" else "")))
    bits = []
    if run.get("id") is not None:
        bits.append(f"run {run['id']}" + (f" ({run['status']})" if run.get("status") else ""))
    if run.get("device_type"):
        bits.append(f"{run.get('world_size') or '?'} {run['device_type']} rank(s)")
    timing = timing_summary(view)
    if timing:
        bits.append(f"timing {timing}")
    if bits:
        rows.append(("run", ", ".join(bits)))
    if run.get("started_at"):
        rows.append(("measured", _run_span(run)))
    versions = run.get("versions") or {}
    if versions:
        order = ["torch", "nccl", "cuda", "driver", "triton", "flashinfer", "python", "a2a_tune"]
        keys = [k for k in order if k in versions] + sorted(k for k in versions if k not in order)
        rows.append(("versions", "  ".join(f"{k} {versions[k] if versions[k] is not None else '-'}" for k in keys)))
    if run.get("git_sha"):
        rows.append(("git", str(run["git_sha"])))
    config = run.get("config") or {}
    if isinstance(config.get("iters"), int):
        timed = f"{clean(config.get('warmup', '?'))} warm-up + {config['iters']} timed round trips per point"
        if isinstance(config.get("input_sets"), int):
            timed += f", {config['input_sets']} rotated input sets"
        rows.append(("timed", timed))
    if isinstance(config.get("argv"), list) and config["argv"]:
        from a2a_tune.db import mask_secrets  # again: a store another tool or version wrote may hold them

        rows.append(("command", "a2a-tune " + " ".join(clean(mask_secrets(str(a))) for a in config["argv"])))
    if view.generated_at or view.generated_by:
        rows.append(
            (
                "table written",
                " ".join(
                    x for x in (when(view.generated_at), f"by {view.generated_by}" if view.generated_by else None) if x
                ),
            )
        )
    return rows


def group_failures(view: TableView) -> list:
    """Failures grouped by (backend, kind, tokens, reason) -> (backend, kind, where, reason),
    where = 'every shape', 'no shape' (not about one point) or the shape labels."""
    groups: dict = {}
    for f in view.failures:
        groups.setdefault((f.backend, f.kind, f.tokens, f.reason), []).append(f.shape)
    all_keys = {s.key for s in view.shapes}
    rows = []
    for (backend, kind, tokens, reason), shapes in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)
    ):
        keys = {s for s in shapes if s is not None}
        if not keys:
            where = "every shape" if view.kind == "run" else "-"
        elif len(all_keys) > 1 and keys == all_keys:
            where = "every shape"
        else:
            where = "; ".join(shape_label(k) for k in sorted(keys, key=lambda k: tuple(str(x) for x in k)))
        if tokens is not None:
            where += f", {tokens} tokens/rank"
        rows.append((backend, kind, where, reason))
    return rows


def has_figures(shape: ShapeView) -> bool:
    """Whether any backend of the shape carries figures beside its round trip (schema 3)."""
    return any(c.figures for c in shape.curves.values())


def figure_rows(view: TableView, shape: ShapeView) -> list:
    """Per winner range, the winner's figures at the range's largest token count:
    (tokens, backend, figures dict of model.FIGURE_NAMES); ranges without a winner left out."""
    link = shape_link(view, shape)
    rows = []
    for r in winner_ranges(shape):
        curve = shape.curves.get(r.backend) if r.backend else None
        if curve is None:
            continue
        j = shape.tokens.index(r.hi)
        rows.append((r.hi, r.backend, point_figures(curve, shape.tokens, link)[j]))
    return rows


def figures_note(view: TableView, shape: ShapeView) -> str:
    """The line under a figures table: what GB/s and link % count, and the link they compare with."""
    text = link_text(view.facts, shape.ep_size)
    link = f"link: link bytes / dispatch time vs {text}" if text != NO_LINK else "link: no link (CPU ranks)"
    mib = "; MiB: not measured on CPU ranks" if is_cpu(view.facts) else ""
    eager = [c for c in shape.curves.values() if c.timing == "eager"]
    unsplit = not is_cpu(view.facts) and any(all(v is None for v in c.figures.get("dispatch_us") or []) for c in eager)
    halves = f"; {EAGER_HALVES_GPU if unsplit else EAGER_HALVES}" if eager else ""
    return f"GB/s: dispatch logical bytes (every token-rank pair) / dispatch time; {link}{mib}{halves}"


#: What eager dispatch and combine figures are (tuner/timing.py): said wherever they are shown.
EAGER_HALVES = "eager disp/comb µs: each half timed alone, so their sum can exceed the round trip"
#: ... and on a GPU, where an eager backend's halves are missing: it reads the device from the host
#: (timing.unsplit_reason).
EAGER_HALVES_GPU = "eager on a GPU: disp/comb not timed apart (the dispatch reads the device from the host)"


def show_data(view: TableView) -> dict:
    """What ``show --json`` prints: provenance, collapsed winner ranges, failures, notes, and
    per shape each backend's figures per token count (``figures``: model.FIGURE_NAMES, null
    where not measured)."""
    return {
        "source": view.label,
        "kind": view.kind,
        "fingerprint": view.fingerprint,
        "facts_hash": view.facts_hash,
        "schema": view.schema,
        "run": view.run,
        "shapes": [
            {
                **dict(zip(SHAPE_KEYS, s.key)),
                "source": s.source,
                "tokens": s.tokens,
                "ranges": [
                    {
                        "tokens": [r.lo, r.hi],
                        "winner": r.backend,
                        "margin": [r.margin_lo, r.margin_hi],
                        "runners_up": r.runners_up,
                        "ties": r.ties,
                        "median_us": [r.median_lo, r.median_hi],
                        "text": r.line(),
                    }
                    for r in winner_ranges(s)
                ],
                "failed": {b: str(f) for b, f in s.failed.items()},
                "fabric": s.fabric,
                "provenance": s.provenance,
                "not_carried": not_carried(s.dtype),
                "link": _link_data(view, s),
                "figures": {b: point_figures(c, s.tokens, shape_link(view, s)) for b, c in s.curves.items()},
                # each EP group's median per token count, in group order (null: not stored)
                "group_us": {b: c.group_us for b, c in s.curves.items() if c.group_us},
                # the tuned launch setting per token count (null: the backend's defaults)
                "knobs": {b: c.knobs for b, c in s.curves.items() if c.knobs},
            }
            for s in view.shapes
        ],
        "suspect_groups": suspect_groups(view),
        "failures": [{"backend": b, "kind": k, "where": w, "reason": r} for b, k, w, r in group_failures(view)],
        "notes": view.notes,
    }


def _link_data(view: TableView, shape: ShapeView) -> dict:
    link = shape_link(view, shape)
    return {
        "gbps": None if link is None else link.gbps,
        "how": None if link is None else link.how,
        "text": link_text(view.facts, shape.ep_size),
    }


def _figures_table(view: TableView, shape: ShapeView):
    """The winner's dispatch, combine, GB/s, % of link and MiB per range (80 columns)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 1), show_edge=False, pad_edge=False, collapse_padding=True)
    for name in ("at T", "winner", "disp µs", "comb µs", "GB/s", "link", "MiB"):
        t.add_column(name, justify="left" if name == "winner" else "right", no_wrap=True)
    for tokens, backend, f in figure_rows(view, shape):
        t.add_row(
            str(tokens),
            Text(backend, style="green"),
            fmt_us(f["dispatch_us"]),
            fmt_us(f["combine_us"]),
            fmt_gbps(f["logical_gbps"]),
            fmt_share(f["link_pct"]),
            fmt_mib(f["workspace_mib"]),
        )
    return t


def labelled(rows):
    """(label, value) pairs as a rich grid: the labels in one column, each value wrapping at
    its spaces in the next (a long value's later lines start under its first)."""
    from rich.table import Column, Table
    from rich.text import Text

    from ..console import indented

    grid = Table.grid(Column(no_wrap=True, style="dim"), Column(overflow="fold"), padding=(0, 1))
    for label, value in rows:
        grid.add_row(label, Text(value))
    return indented(grid)


def render_show(view: TableView, console) -> None:
    """Print the view with rich: provenance, one winners table per shape, failures."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from ..console import indented

    kind = "table" if view.kind == "profile" else "run"
    console.print(Text(f"a2a-tune {kind}: {view.fingerprint or 'unknown hardware'}", style="bold"))
    console.print(labelled(provenance_lines(view)))
    for note in view.notes:
        console.print(indented(Text(f"note: {note}", style="yellow")))
    for found in suspect_groups(view):
        line = suspect_line(found)
        console.print(indented(Text(line, style="bold yellow" if line.startswith("suspect") else "dim")))
    if not view.shapes:
        console.print("no shapes in this table", style="yellow")
    merged = len({s.sources() for s in view.shapes}) > 1  # a table across runs: say each entry's
    for s in view.shapes:
        console.print()
        title = shape_label(s) + ("  (predicted)" if s.source != "measured" else "")
        console.print(Text(title, style="bold cyan"))
        if s.fabric:
            console.print(Text(f"  EP groups span: {FABRIC_WORDS.get(s.fabric, s.fabric)}", style="dim"))
        if merged and s.provenance:
            console.print(Text(f"  measured by: {s.sources()}", style="dim"))
        # The runners-up go under the winner, so one column holds the names: 80 columns take the
        # longest names whole (a name is wrapped only at the spaces between names, never cut).
        t = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 1), show_edge=False, pad_edge=False, collapse_padding=True)
        t.add_column("tokens", justify="right", no_wrap=True)
        t.add_column("winner, then runner-up")
        t.add_column("margin", justify="right", no_wrap=True)
        t.add_column("winner µs", justify="right", no_wrap=True)
        for r in winner_ranges(s):
            if r.backend is None:
                t.add_row(r.tokens, Text("no backend measured", style="yellow"), "-", "-")
                continue
            margin = Text(r.margin)
            if r.ties:
                margin.append("*", style="bold yellow")
            med = (
                fmt_us(r.median_lo)
                if r.median_lo == r.median_hi
                else f"{fmt_us(r.median_lo)}{EN_DASH}{fmt_us(r.median_hi)}"
            )
            names = Text.assemble(  # Text: never markup
                (r.backend, "green"), "\n  ", (", ".join(r.runners_up) or "none (only backend)", "dim")
            )
            t.add_row(r.tokens, names, margin, med)
        console.print(t)
        if has_figures(s):  # tables from before the figures: the round trip alone
            console.print(_figures_table(view, s))
            console.print(indented(Text(figures_note(view, s), style="dim")))
        ties = [t_ for r in winner_ranges(s) for t_ in r.ties]
        if ties:
            console.print(
                indented(
                    Text.assemble(
                        ("* tie at ", "yellow"), _tie_phrase(ties), (": the runner-up is within noise there", "dim")
                    )
                )
            )
        for line in knob_lines(s):
            console.print(indented(Text(line, style="dim")))
        if s.failed:
            console.print(
                indented(Text.assemble(("never selected here: ", "red"), ", ".join(s.failed), " (see failures)"))
            )
        if missing := not_carried(s.dtype):
            console.print(  # wrapped at spaces: the names stay whole
                indented(Text.assemble(("not measured: ", "dim"), ", ".join(missing), f" (does not carry {s.dtype})"))
            )
    console.print()
    rows = group_failures(view)
    if rows:
        # One failure per two lines (what, then why): long reasons wrap cleanly in a terminal.
        console.print(Text(f"failures ({len(rows)})", style="bold red"))
        for backend, kind, where, reason in rows:
            console.print(indented(Text.assemble((backend, "bold"), " ", (kind, "red"), f"  ({where})")))
            console.print(indented(Text(reason), 6))
    else:
        console.print("no failures recorded", style="green")


def knob_lines(shape: ShapeView) -> list[str]:
    """``tuned knobs: nccl_all2allv at 64: chunk=2``: one line per backend with a tuned setting."""
    lines = []
    for backend, curve in shape.curves.items():
        tuned = [
            f"at {t}: " + " ".join(f"{clean(k)}={clean(str(v))}" for k, v in sorted(knobs.items()))
            for t, knobs in zip(shape.tokens, curve.knobs)
            if knobs
        ]
        if tuned:
            lines.append(f"tuned knobs: {backend} " + "; ".join(tuned))
    return lines


def not_carried(dtype: str) -> list[str]:
    """The registered backends that do not carry payload `dtype` (never timed with it: not a
    failure). Plain payloads: none asked (every backend carries them, registry not imported)."""
    from a2a_tune.tuner.runtime.point import PAYLOADS

    if dtype not in PAYLOADS or not PAYLOADS[dtype].quantized:
        return []
    from a2a_tune.kernels import get_backend, list_backends

    return [name for name in list_backends() if dtype not in get_backend(name).payloads]
