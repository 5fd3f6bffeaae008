"""``a2a-tune diff``: compare a baseline table or run (A) with a candidate (B).

Both sides are read as the lookup reads them (:mod:`.load`): a table the lookup refuses is
refused here too, so a candidate on which every engine would fall back never passes.

Design notes: docs/architecture.md, "Module notes", `tuner/views/diff.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..runtime.estimate import Winner
from ..runtime.table import SHAPE_KEYS
from .model import EN_DASH, ShapeView, TableView, clean, fmt_us, shape_label, token_range, when

__all__ = [
    "MIN_EFFECT",
    "DiffResult",
    "beyond_noise",
    "FailureChange",
    "PointChange",
    "WinnerChange",
    "diff_views",
    "render_diff",
]


@dataclass
class PointChange:
    """A backend slower (regression) or faster (improvement) beyond noise at one point."""

    shape: tuple
    backend: str
    tokens: int
    a_median: float
    b_median: float
    ratio: float  # b / a
    a_p10: float | None
    a_p90: float | None
    b_p10: float | None
    b_p90: float | None
    medians_only: bool
    dispatch_ratio: float | None = None  # B / A of the halves, where both sides timed them apart
    combine_ratio: float | None = None

    def halves(self) -> str:
        """' (dispatch 1.9x, combine 1.1x)', or '' without the halves on both sides."""
        if self.dispatch_ratio is None or self.combine_ratio is None:
            return ""
        return f" (dispatch {self.dispatch_ratio:.2f}x, combine {self.combine_ratio:.2f}x)"


@dataclass
class WinnerChange:
    shape: tuple
    tokens: int
    a_winner: str | None
    b_winner: str | None
    noise: bool
    why: str  # short: "1.52x faster in B", "spreads overlap in B", "old winner failed in B"
    speedup: float | None = None  # in B: old winner's median / new winner's median


@dataclass
class FailureChange:
    shape: tuple
    backend: str
    reason: str


@dataclass
class DiffResult:
    a: TableView
    b: TableView
    notes: list = field(default_factory=list)
    only_a: list = field(default_factory=list)  # shape keys
    only_b: list = field(default_factory=list)
    winner_changes: list = field(default_factory=list)
    regressions: list = field(default_factory=list)
    improvements: list = field(default_factory=list)
    new_failures: list = field(default_factory=list)
    fixed_failures: list = field(default_factory=list)
    compared_points: int = 0
    version_changes: dict = field(default_factory=dict)  # name -> (a, b)

    @property
    def clear_winner_changes(self) -> list:
        return [w for w in self.winner_changes if not w.noise]

    @property
    def regression_count(self) -> int:
        return len(self.regressions) + len(self.new_failures)

    def failing(self, fail_on: Iterable) -> list:
        """Which of ``fail_on`` ('regressions', 'winner-change') this diff trips."""
        hit = []
        fail_on = set(fail_on)
        if "regressions" in fail_on and self.regression_count:
            hit.append("regressions")
        if "winner-change" in fail_on and self.clear_winner_changes:
            hit.append("winner-change")
        return hit

    def to_dict(self) -> dict:
        def pc(p: PointChange) -> dict:
            d = dataclasses.asdict(p)
            d["shape"] = dict(zip(SHAPE_KEYS, p.shape))
            return d

        return {
            "a": {"source": self.a.label, "fingerprint": self.a.fingerprint, "run": self.a.run},
            "b": {"source": self.b.label, "fingerprint": self.b.fingerprint, "run": self.b.run},
            "version_changes": {k: list(v) for k, v in self.version_changes.items()},
            "notes": self.notes,
            "only_in_a": [dict(zip(SHAPE_KEYS, k)) for k in self.only_a],
            "only_in_b": [dict(zip(SHAPE_KEYS, k)) for k in self.only_b],
            "compared_points": self.compared_points,
            "winner_changes": [
                {**dataclasses.asdict(w), "shape": dict(zip(SHAPE_KEYS, w.shape))} for w in self.winner_changes
            ],
            "regressions": [pc(p) for p in self.regressions],
            "improvements": [pc(p) for p in self.improvements],
            "new_failures": [
                {**dataclasses.asdict(f), "shape": dict(zip(SHAPE_KEYS, f.shape))} for f in self.new_failures
            ],
            "fixed_failures": [
                {**dataclasses.asdict(f), "shape": dict(zip(SHAPE_KEYS, f.shape))} for f in self.fixed_failures
            ],
        }


#: The minimum effect of a regression or an improvement: B's median off A's by more than this
#: fraction (`diff --tolerance`). Two back-to-back runs of one plan do not trip it; a 20%
#: slowdown of one backend does (BENCHMARKS.md, "diff: change or noise").
MIN_EFFECT = 0.10


def beyond_noise(am: float, a10, a90, bm: float, b10, b90, min_effect: float = MIN_EFFECT) -> int:
    """+1 when B is slower than A beyond noise at one point, -1 when faster, 0 otherwise (the rule
    in docs/architecture.md, "Module notes"; without both spreads, the medians and the minimum
    effect alone)."""
    ratio = bm / am
    if None in (a10, a90, b10, b90):
        return 1 if ratio > 1 + min_effect else -1 if ratio < 1 / (1 + min_effect) else 0
    if ratio > 1 + min_effect and _separate(am, a10, a90, bm, b10, b90):
        return 1
    if ratio < 1 / (1 + min_effect) and _separate(bm, b10, b90, am, a10, a90):
        return -1
    return 0


def _separate(lm: float, l10: float, l90: float, hm: float, h10: float, h90: float) -> bool:
    """Whether the higher distribution (h) lies above the lower (l) beyond noise: its p10
    above l's p90, and either the shift of the medians beyond the wider spread or the gap
    between the two (in log) beyond the narrower spread (the rule in docs/architecture.md, "Module notes")."""
    if not h10 > l90 > 0 or min(l10, h10) <= 0:
        return False
    if hm - lm > max(l90 - l10, h90 - h10):
        return True
    gap = math.log(h10 / l90)
    return gap > min(math.log(l90 / l10), math.log(h90 / h10))


def diff_views(a: TableView, b: TableView, *, tolerance: float = MIN_EFFECT) -> DiffResult:
    """Compare baseline ``a`` with candidate ``b`` (rules: docs/architecture.md, "Module notes").
    ``tolerance``: the minimum effect, a fraction of A's median (0.10 = 10%)."""
    res = DiffResult(a=a, b=b)
    if a.fingerprint != b.fingerprint:
        res.notes.append(f"different hardware: A is {a.fingerprint or 'unknown'}, B is {b.fingerprint or 'unknown'}")
    elif a.facts_hash and b.facts_hash and a.facts_hash != b.facts_hash:
        res.notes.append(f"same fingerprint, different probe facts (hash {a.facts_hash} -> {b.facts_hash})")
    va, vb = a.run.get("versions") or {}, b.run.get("versions") or {}
    for k in sorted(set(va) | set(vb)):
        if va.get(k) != vb.get(k):
            res.version_changes[k] = (va.get(k), vb.get(k))
    a_keys = {s.key for s in a.shapes}
    b_keys = {s.key for s in b.shapes}
    res.only_a = [s.key for s in a.shapes if s.key not in b_keys]
    res.only_b = [s.key for s in b.shapes if s.key not in a_keys]
    timing_skips: dict = {}
    for sa in a.shapes:
        sb = b.shape(sa.key)
        if sb is None:
            continue
        # A backend A measured cleanly that fails in B is a regression; one A never ran
        # (e.g. newly added to the sweep, unavailable in B) is not.
        a_ok = set(sa.curves) - set(sa.failed)
        b_ok = set(sb.curves) - set(sb.failed)
        for backend, reason in sb.failed.items():
            if backend in a_ok:
                res.new_failures.append(FailureChange(sa.key, backend, str(reason)))
        for backend, reason in sa.failed.items():
            if backend in b_ok:
                res.fixed_failures.append(FailureChange(sa.key, backend, str(reason)))
        jb = {t: j for j, t in enumerate(sb.tokens)}
        for backend, ca in sa.curves.items():
            cb = sb.curves.get(backend)
            if cb is None:
                continue
            if ca.timing != cb.timing:
                skip = (backend, ca.timing, cb.timing)
                timing_skips[skip] = timing_skips.get(skip, 0) + 1
                continue
            for j, t in enumerate(sa.tokens):
                if t not in jb:
                    continue
                am, a10, a90 = ca.at(j)
                bm, b10, b90 = cb.at(jb[t])
                if am is None or bm is None:
                    continue
                res.compared_points += 1
                ratio = bm / am
                spread = None not in (a10, a90, b10, b90)
                pc = PointChange(
                    sa.key,
                    backend,
                    t,
                    am,
                    bm,
                    ratio,
                    a10,
                    a90,
                    b10,
                    b90,
                    medians_only=not spread,
                    dispatch_ratio=_half_ratio(ca, cb, "dispatch_us", j, jb[t]),
                    combine_ratio=_half_ratio(ca, cb, "combine_us", j, jb[t]),
                )
                moved = beyond_noise(am, a10, a90, bm, b10, b90, tolerance)
                if moved > 0:
                    res.regressions.append(pc)
                elif moved < 0:
                    res.improvements.append(pc)
        wa = {w.tokens: w for w in sa.winners}
        wb = {w.tokens: w for w in sb.winners}
        for t in sa.tokens:
            x, y = wa.get(t), wb.get(t)
            if t not in jb or (x is None and y is None):
                continue
            xa, yb = (x.backend if x else None), (y.backend if y else None)
            if xa == yb:
                continue
            res.winner_changes.append(_winner_change(sa.key, t, x, y, sb, jb[t]))
    for (backend, ta, tb), n in sorted(timing_skips.items()):
        res.notes.append(f"{backend}: timing mode {ta} in A, {tb} in B; {n} curve(s) not compared")
    return res


def _winner_change(key, t, x: Winner | None, y: Winner | None, sb: ShapeView, jb: int) -> WinnerChange:
    xa, yb = (x.backend if x else None), (y.backend if y else None)
    if xa is None:
        return WinnerChange(key, t, None, yb, False, "no winner in A")
    if yb is None:
        return WinnerChange(key, t, xa, None, False, "no winner in B")
    if xa in sb.failed:
        return WinnerChange(key, t, xa, yb, False, "old winner failed in B")
    old = sb.curves.get(xa)
    if old is None or old.at(jb)[0] is None:
        return WinnerChange(key, t, xa, yb, False, "old winner not measured in B")
    # Only B decides: a coin flip in A that B now settles clearly is a real change.
    tied = bool(y.tie and xa in (y.runner_up, y.fastest))
    om, o10, _ = old.at(jb)
    new = sb.curves.get(yb)
    nm, _, n90 = new.at(jb) if new else (y.median_us, None, None)
    overlap = o10 is not None and n90 is not None and o10 <= n90
    speedup = om / nm if nm else None
    if tied or overlap:
        why = "spreads overlap in B" if overlap else "marked a tie"
        return WinnerChange(key, t, xa, yb, True, why, speedup)
    return WinnerChange(key, t, xa, yb, False, "faster in B beyond noise", speedup)


def _runs(items: list, grid: Mapping, same) -> list:
    """Split ``items`` (each with .shape and .tokens, sorted) into runs of consecutive
    token counts of the shape's grid for which ``same(a, b)`` holds."""
    out: list = []
    for it in items:
        tokens = grid.get(it.shape, [])
        prev = out[-1][-1] if out else None
        if prev is not None and prev.shape == it.shape and same(prev, it) and prev.tokens in tokens:
            i = tokens.index(prev.tokens)
            if i + 1 < len(tokens) and tokens[i + 1] == it.tokens:
                out[-1].append(it)
                continue
        out.append([it])
    return out


def _ratio_range(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "-"
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}{EN_DASH}{hi:.2f}x"


def _half_ratio(ca, cb, name: str, ja: int, jb: int) -> float | None:
    a, b = ca.figure(name, ja), cb.figure(name, jb)
    return None if a is None or b is None else b / a


# The diff's tables: titled on the left, no box, indented under the shape's line.
_DIFF_TABLE = {"title_justify": "left", "box": None, "padding": (0, 1, 0, 2)}


def render_diff(res: DiffResult, console, *, fail_on: Iterable = ("regressions",)) -> None:
    """Print the diff with rich: what was compared, then per shape the winner changes,
    new failures and points slower / faster beyond noise, then one summary line."""
    from rich.table import Column
    from rich.text import Text

    from ..console import indented, print_fitted
    from .show import labelled

    def side(v: TableView) -> str:
        r = v.run
        bits = [v.label]
        if r.get("id") is not None and v.kind == "profile":
            bits.append(f"run {r['id']}")
        if r.get("started_at"):
            bits.append(when(r["started_at"]))
        return clean(", ".join(str(b) for b in bits))

    def line(text, style="", indent=2):  # wraps at spaces, indented on every line
        console.print(indented(Text(text, style=style), indent))

    console.print(Text("a2a-tune diff", style="bold"))
    heads = [("A (baseline)", side(res.a)), ("B (candidate)", side(res.b))]
    if res.version_changes:
        changes = clean("  ".join(f"{k} {a or '-'} -> {b or '-'}" for k, (a, b) in res.version_changes.items()))
        heads.append(("versions", changes))
    console.print(labelled(heads))
    for prefix, notes in (("note (A)", res.a.notes), ("note (B)", res.b.notes), ("note", res.notes)):
        for note in notes:
            line(f"{prefix}: {note}", "yellow")
    for k in res.only_a:
        line(f"only in A: {shape_label(k)}", "dim")
    for k in res.only_b:
        line(f"only in B: {shape_label(k)}", "dim")

    grid = {s.key: s.tokens for s in res.a.shapes}
    order = {s.key: i for i, s in enumerate(res.a.shapes)}
    keyed = lambda it: (order.get(it.shape, 0), getattr(it, "backend", ""), it.tokens)  # noqa: E731
    changed = sorted(
        {x.shape for x in [*res.winner_changes, *res.regressions, *res.improvements, *res.new_failures]},
        key=lambda k: order.get(k, 0),
    )
    for key in changed:
        console.print()
        line(shape_label(key), "bold cyan", 0)
        wcs = sorted((w for w in res.winner_changes if w.shape == key), key=keyed)
        if wcs:
            columns = [
                Column("tokens", justify="right", no_wrap=True),
                Column("A winner", no_wrap=True),
                Column("B winner", no_wrap=True),
                Column("in B", min_width=16),  # prose: wraps at spaces, a few words a line or under the names
            ]
            rows = []
            same = lambda p, q: (p.a_winner, p.b_winner, p.noise, p.why) == (q.a_winner, q.b_winner, q.noise, q.why)  # noqa: E731
            for run in _runs(wcs, grid, same):
                w = run[0]
                sp = [x.speedup for x in run if x.speedup]
                if w.noise:
                    detail = f"within noise ({w.why})"
                elif sp:
                    detail = f"new winner {_ratio_range(min(sp), max(sp))} faster"
                else:
                    detail = w.why
                dim = "dim" if w.noise else ""
                rows.append(  # Text cells: a backend name is never rich markup
                    (
                        Text(token_range(run[0].tokens, run[-1].tokens), style=dim),
                        Text(w.a_winner or "-", style=dim),
                        Text(w.b_winner or "-", style=dim),
                        Text(detail, style=dim),
                    )
                )
            print_fitted(  # too narrow for the prose beside two long names: it goes under them
                console,
                columns,
                rows,
                key=1,
                stack=(3,),
                title="winner changed",
                stacked_title="winner changed: in B",
                title_style="bold",
                **_DIFF_TABLE,
            )
        for f in (f for f in res.new_failures if f.shape == key):
            console.print(
                indented(Text.assemble(("newly failing in B: ", "bold red"), (f.backend, "bold"), f": {f.reason}"))
            )
        for name, pts, style in (
            ("slower beyond noise", res.regressions, "bold red"),
            ("faster beyond noise", res.improvements, "bold green"),
        ):
            pts = sorted((p for p in pts if p.shape == key), key=keyed)
            if not pts:
                continue
            columns = [
                Column("backend", no_wrap=True),
                Column("tokens", justify="right", no_wrap=True),
                Column("B/A", justify="right"),  # wraps at spaces: ratio, then how each half moved
                Column("A median µs", justify="right"),
                Column("B median µs", justify="right"),
            ]
            rows = []
            for run in _runs(pts, grid, lambda p, q: p.backend == q.backend):
                p = run[0]
                ratio = _ratio_range(min(x.ratio for x in run), max(x.ratio for x in run))
                if any(x.medians_only for x in run):
                    ratio += " (medians only)"
                if len(run) == 1:
                    ratio += p.halves()
                if len(run) == 1:
                    am = f"{fmt_us(p.a_median)} ({fmt_us(p.a_p10)}{EN_DASH}{fmt_us(p.a_p90)})"
                    bm = f"{fmt_us(p.b_median)} ({fmt_us(p.b_p10)}{EN_DASH}{fmt_us(p.b_p90)})"
                else:
                    am = f"{fmt_us(min(x.a_median for x in run))}{EN_DASH}{fmt_us(max(x.a_median for x in run))}"
                    bm = f"{fmt_us(min(x.b_median for x in run))}{EN_DASH}{fmt_us(max(x.b_median for x in run))}"
                rows.append((Text(p.backend), token_range(run[0].tokens, run[-1].tokens), ratio, am, bm))
            print_fitted(
                console,
                columns,
                rows,
                key=2,
                stack=(4, 3),
                title=name,
                stacked_title=f"{name}: medians (p10{EN_DASH}p90)",
                title_style=style,
                **_DIFF_TABLE,
            )
    for f in res.fixed_failures:
        line(f"no longer failing in B: {f.backend} at {shape_label(f.shape)} (was: {f.reason})", "green")
    console.print()
    summary = (
        f"{res.compared_points} point(s) compared: {len(res.regressions)} slower, {len(res.improvements)} faster, "
        f"{len(res.new_failures)} newly failing, {len(res.winner_changes)} winner change(s) "
        f"({len(res.clear_winner_changes)} beyond noise)"
    )
    hit = res.failing(fail_on)
    verdict = f" -> FAIL ({', '.join(hit)})" if hit else " -> OK"
    line(summary + verdict, "bold red" if hit else "bold green", 0)
