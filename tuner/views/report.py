"""`a2a-tune report`: ONE self-contained HTML file for review -- probe facts, run
provenance, winners per shape and token range, failures with reasons, and one plot per
shape embedded as a base64 PNG. Inline CSS, no script, no external resource (no font,
image or stylesheet link), so the file can be mailed, attached to a ticket or archived
and still reads the same. Every value from the table is HTML-escaped.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
from pathlib import Path

from .model import (
    EN_DASH,
    FABRIC_WORDS,
    FIGURE_LABELS,
    ShapeView,
    TableView,
    fmt_gbps,
    fmt_mib,
    fmt_share,
    fmt_us,
    point_figures,
    shape_label,
    shape_link,
    shape_slug,
    suspect_groups,
    suspect_line,
    write_output,
)
from .show import figures_note, group_failures, has_figures, provenance_lines, timing_summary, winner_ranges

__all__ = ["render_report", "write_report"]

_CSS = """
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d1d1f;
  margin:0;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:18px;margin:32px 0 10px;padding-bottom:4px;border-bottom:2px solid #d8dce3}
h3{font-size:15px;margin:20px 0 6px}
.sub{color:#555;margin:0 0 16px}
section,.card{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:14px 18px;margin:12px 0}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #eceef2;vertical-align:top}
th{background:#f0f2f5;font-weight:600;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kv th{width:170px;background:none;color:#555;font-weight:500}
code,.mono{font-family:SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.winner{font-weight:600;color:#0b6e2f}
.tie{color:#9a6700;font-size:12px}
.fail{color:#b42318;font-weight:600}
.note{background:#fff8e5;border:1px solid #f0d58c;border-radius:6px;padding:8px 12px;margin:8px 0;color:#6b4e00}
.ok{color:#0b6e2f}
.muted{color:#666}
figure{margin:8px 0 20px;background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:8px}
figure img{width:100%;height:auto;display:block}
figcaption{color:#555;font-size:12.5px;padding:4px 6px 0}
nav{font-size:13px;margin:6px 0 0}
nav a{margin-right:14px;color:#1f5fbf;text-decoration:none}
table.winners{table-layout:fixed}
.ver{display:inline-block;margin:0 16px 4px 0;white-space:nowrap}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;background:#eef2f7;font-size:12px;margin-left:6px}
"""


def _e(v) -> str:
    return html.escape("-" if v is None else str(v), quote=True)


def _kv(rows) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _gib(b) -> str:
    return f"{b / 2**30:.1f}" if isinstance(b, (int, float)) and b > 0 else "-"


def _facts_section(view: TableView) -> str:
    f = view.facts or {}
    if not f:
        return '<p class="muted">No probe facts recorded with this table.</p>'
    gpus = [g for g in f.get("gpus") or [] if isinstance(g, dict)]
    hostnames = f.get("hostnames") or []
    multi = (f.get("node_count") or 1) > 1
    parts = []
    if gpus:
        head = ("<th>node</th>" if multi else "") + (
            '<th class="num">GPU</th><th>name</th><th class="num">memory GiB</th><th>CC</th><th>bus id</th>'
            "<th>active NVLinks</th><th>fabric</th>"
        )
        rows = []
        for g in gpus:
            links = [link for link in g.get("links") or [] if isinstance(link, dict)]
            active = [link for link in links if link.get("active")]
            speeds = sorted(
                {link.get("speed_mbps") for link in active if isinstance(link.get("speed_mbps"), (int, float))}
            )
            link_txt = (
                f"{len(active)}/{len(links)}" + (f" × {speeds[0] / 1000:g} GB/s" if len(speeds) == 1 else "")
                if links
                else "-"
            )
            cc = g.get("compute_capability")
            cc_txt = ".".join(str(x) for x in cc) if isinstance(cc, list) else cc
            fab = g.get("fabric") if isinstance(g.get("fabric"), dict) else {}
            fab_txt = f"{fab.get('state', '-')}, clique {fab.get('clique_id', '-')}" if fab else "-"
            node = g.get("node")
            node_txt = hostnames[node] if multi and isinstance(node, int) and node < len(hostnames) else node
            rows.append(
                "<tr>"
                + (f"<td>{_e(node_txt)}</td>" if multi else "")
                + f'<td class="num">{_e(g.get("index"))}</td><td>{_e(g.get("name"))}</td>'
                f'<td class="num">{_gib(g.get("memory_total_bytes"))}</td><td>{_e(cc_txt)}</td>'
                f'<td class="mono">{_e(g.get("pci_bus_id"))}</td><td>{_e(link_txt)}</td><td>{_e(fab_txt)}</td></tr>'
            )
        parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")
    islands = []
    for isl in f.get("islands") or []:
        if not isinstance(isl, dict):
            continue
        members = ", ".join(f"GPU{g}" for g in isl.get("gpus") or [])
        counts = [c for c in isl.get("link_counts") or [] if isinstance(c, int)]
        speed = isl.get("speed_mbps")
        how = "via NVSwitch" if isl.get("via_switch") else "direct NVLink"
        text = f"{members} {how}"
        if counts:
            text += f": {min(counts)} links/GPU"
            if isinstance(speed, (int, float)) and speed > 0:
                text += f" × {speed / 1000:g} GB/s = {min(counts) * speed / 1000:.0f} GB/s per GPU"
        islands.append(_e(text))
    domains = [
        _e(f"cluster {d.get('cluster_uuid')} clique {d.get('clique_id')}: {len(d.get('gpus') or [])} GPUs")
        for d in f.get("fabric_domains") or []
        if isinstance(d, dict)
    ]
    degraded = []
    for d in f.get("degraded") or []:
        if isinstance(d, dict):
            degraded.append(_e(f"GPU{d.get('gpu')}: {d.get('active_links')}/{d.get('expected_links')} links active"))
        else:
            degraded.append(_e(d))
    pcie = ", ".join(
        f"GPU{p[0]}–GPU{p[1]}" for p in f.get("pcie_only_pairs") or [] if isinstance(p, list) and len(p) == 2
    )
    drivers = ", ".join(sorted({str(d) for d in f.get("driver_versions") or [] if d})) or "-"
    kv = [
        ("fingerprint", f"<code>{_e(view.fingerprint)}</code>"),
        ("facts hash", f"<code>{_e(view.facts_hash)}</code>"),
        ("nodes", _e(f"{f.get('node_count', '-')}" + (f" ({', '.join(map(str, hostnames))})" if hostnames else ""))),
        ("GPUs", _e(len(gpus))),
        ("driver", _e(drivers)),
        ("NVLink islands", "<br>".join(islands) or "none"),
        ("fabric domains", "<br>".join(domains) or "none"),
        (
            "degraded links",
            ('<span class="fail">' + "<br>".join(degraded) + "</span>") if degraded else '<span class="ok">none</span>',
        ),
        ("PCIe-only pairs", _e(pcie or "none")),
    ]
    return _kv(kv) + "".join(parts)


def _provenance_section(view: TableView) -> str:
    rows = [(k, _e(v)) for k, v in provenance_lines(view) if k != "versions"]
    versions = view.run.get("versions") or {}
    if versions:
        chips = "".join(f'<span class="ver"><b>{_e(k)}</b> <code>{_e(v)}</code></span>' for k, v in versions.items())
        rows.append(("versions", chips))
    return _kv(rows)


def _summary(view: TableView) -> str:
    """The few lines a reviewer reads first: what machine, which run, which software."""
    f = view.facts or {}
    gpus = [g for g in f.get("gpus") or [] if isinstance(g, dict)]
    names = sorted({str(g.get("name")) for g in gpus if g.get("name")})
    hw = f"{len(gpus)}× {', '.join(names)}" if gpus else "no GPUs in the probe facts"
    if f.get("node_count"):
        hw += f" on {f['node_count']} node(s)"
    run = view.run
    run_bits = [
        f"run {run['id']}" if run.get("id") is not None else None,
        run.get("status"),
        f"{run.get('world_size')} {run.get('device_type')} rank(s)" if run.get("device_type") else None,
        f"timing {timing_summary(view)}" if timing_summary(view) else None,
        str(run.get("started_at") or "")[:16].replace("T", " "),
    ]
    versions = run.get("versions") or {}
    sw = " · ".join(f"{k} {versions[k]}" for k in ("torch", "nccl", "cuda", "driver") if versions.get(k))
    kv = [("hardware", _e(hw)), ("run", _e(" · ".join(b for b in run_bits if b) or "-")), ("software", _e(sw or "-"))]
    return f'<section class="card">{_kv(kv)}</section>'


def _winners_section(view: TableView) -> str:
    out = []
    for s in view.shapes:
        rows = []
        for r in winner_ranges(s):
            if r.backend is None:
                rows.append(
                    f'<tr><td class="num">{_e(r.tokens)}</td><td colspan="4" class="muted">no backend measured</td></tr>'
                )
                continue
            tie = f' <span class="tie">tie at {_e(", ".join(map(str, r.ties)))}</span>' if r.ties else ""
            med = (
                fmt_us(r.median_lo)
                if r.median_lo == r.median_hi
                else f"{fmt_us(r.median_lo)}{EN_DASH}{fmt_us(r.median_hi)}"
            )
            rows.append(
                f'<tr><td class="num">{_e(r.tokens)}</td><td class="winner">{_e(r.backend)}</td>'
                f'<td class="num">{_e(r.margin)}{tie}</td><td>{_e(", ".join(r.runners_up) or "none (only backend)")}</td>'
                f'<td class="num">{_e(med)}</td></tr>'
            )
        failed = ""
        if s.failed:
            failed = (
                '<p><span class="fail">never selected here:</span> ' + _e(", ".join(s.failed)) + " (see failures)</p>"
            )
        src = "" if s.source == "measured" else f'<span class="pill">{_e(s.source)}</span>'
        if s.fabric:
            src += f'<span class="pill">EP groups span {_e(FABRIC_WORDS.get(s.fabric, s.fabric))}</span>'
        out.append(
            f'<h3 id="w-{_e(shape_slug(s))}">{_e(shape_label(s))}{src}</h3>'
            '<table class="winners"><colgroup><col style="width:13%"><col style="width:27%"><col style="width:20%">'
            '<col style="width:26%"><col style="width:14%"></colgroup><tr><th class="num">tokens/rank</th><th>winner</th><th class="num">margin over runner-up</th>'
            f'<th>runner-up</th><th class="num">winner median µs</th></tr>{"".join(rows)}</table>{failed}'
            + _vs_default(view, s)
            + _figures_table(view, s)
        )
    return "".join(out) or '<p class="muted">No shapes.</p>'


#: The decode steps the report states the saving for: 1..this many tokens per rank (vLLM's
#: max_num_seqs default is 256), log-uniform, as the plugin asks for a decode engine.
DECODE_MAX_BATCH = 256


def _vs_default(view: TableView, s: ShapeView) -> str:
    """One line: what the table's choice for vLLM saves against vLLM's default in decode, per
    MoE layer and, for a preset model, per decode step (runtime.savings); "" when not measured."""
    from ..runtime.estimate import bridge_gaps, expected
    from ..runtime.savings import default_backends, in_engine_units, sentence
    from ..runtime.table import BackendNames
    from ..shapes import presets

    names = {b: BackendNames.of(n.get("engines")) for b, n in view.backends.items()}
    grid = tuple(s.tokens)
    # a refinement count's gaps bridged (bridge_gaps: None when there is none)
    curves = {b: bridge_gaps(grid, tuple(c.median_us)) or tuple(c.median_us) for b, c in s.curves.items()}
    curves = {b: c for b, c in curves.items() if b not in s.failed and b in names}
    dist = ("log-uniform", 1, max(1, min(DECODE_MAX_BATCH, max(s.tokens, default=1))))
    told = {b: c for b, c in curves.items() if names[b].literal("vllm")}  # what vLLM can be told
    label, pool = default_backends("vllm", names, list(curves), s.num_experts, s.ep_size)
    ours, default = expected(grid, told, dist), expected(grid, {b: curves[b] for b in pool}, dist)
    if not ours or not default:
        return ""
    per_layer = {"engine": "vllm", "engine_default": label, "default_us": min(default.values())}
    per_layer["saving_us_per_layer"] = min(default.values()) - min(ours.values())
    model = next((p for p in presets().values() if (p.num_experts, p.topk, p.hidden) == s.key[3:0:-1]), None)
    text = sentence(in_engine_units(per_layer, model.moe_layers if model else None), "decode")
    return f'<p class="muted">decode 1..{dist[2]} tokens/rank, vLLM\'s fastest told: {_e(text)}</p>'


# The figures table's columns (model.FIGURE_NAMES, headed by their labels) and their formats.
_FIGURE_COLUMNS = (
    ("round_trip_us", fmt_us),
    ("dispatch_us", fmt_us),
    ("combine_us", fmt_us),
    ("logical_gbps", fmt_gbps),
    ("combine_logical_gbps", fmt_gbps),
    ("link_pct", fmt_share),
    ("combine_link_pct", fmt_share),
    ("workspace_mib", fmt_mib),
)


def _figures_table(view: TableView, s: ShapeView) -> str:
    """Every measured (token count, backend) of the shape: round trip, dispatch, combine, GB/s of
    each half, % of link, MiB; '' for a shape without figures (the round trip alone)."""
    if not has_figures(s):
        return ""
    link = shape_link(view, s)
    per_backend = {b: point_figures(c, s.tokens, link) for b, c in s.curves.items()}
    rows = []
    for j, t in enumerate(s.tokens):
        for b, figs in per_backend.items():
            f = figs[j]
            if f["round_trip_us"] is None:
                continue
            cells = [fmt(f[name]) for name, fmt in _FIGURE_COLUMNS]
            rows.append(
                f'<tr><td class="num">{_e(t)}</td><td class="mono">{_e(b)}</td>'
                + "".join(f'<td class="num">{_e(c)}</td>' for c in cells)
                + "</tr>"
            )
    head = "".join(f'<th class="num">{FIGURE_LABELS[name]}</th>' for name, _ in _FIGURE_COLUMNS)
    return (
        f'<details open><summary>dispatch and combine, bytes, GB/s, % of link, memory</summary><table><tr><th class="num">'
        f"tokens/rank</th><th>backend</th>{head}</tr>{''.join(rows)}</table>"
        f'<p class="muted">{_e(figures_note(view, s))}</p></details>'
    )


def _failures_section(view: TableView) -> str:
    rows = group_failures(view)
    if not rows:
        return '<p class="ok">No failures recorded: every backend that ran passed its correctness check.</p>'
    body = "".join(
        f'<tr><td class="mono">{_e(b)}</td><td class="fail">{_e(k)}</td><td>{_e(w)}</td><td>{_e(r)}</td></tr>'
        for b, k, w, r in rows
    )
    return f"<table><tr><th>backend</th><th>kind</th><th>where</th><th>reason</th></tr>{body}</table>"


def _engines_section(view: TableView) -> str:
    """Per engine, which of this table's backends it cannot start with, and when (engine_rules)."""
    from ..runtime.engine_rules import describe
    from ..runtime.engines import NAMES

    literals = {lit for n in view.backends.values() for lit in (n.get("engines") or {}).values() if lit}
    rows = describe(literals)
    if not rows:
        return '<p class="muted">No engine start-up rule concerns the backends of this table.</p>'
    body = "".join(
        f"<tr><td>{_e(NAMES[r['engine']])} {_e(r['version'])}</td><td>{_e('cannot start' if r['kind'] == 'refuses' else 'note')}</td>"
        f'<td class="mono">{_e(", ".join(r["backends"]))}</td><td>{_e(r["when"])}</td><td>{_e(r["why"])}</td>'
        f'<td class="mono">{_e(r["source"])}</td></tr>'
        for r in rows
    )
    return (
        '<p class="muted">The engine runs in its own environment: lookup and the vLLM plugin never answer a '
        "backend the engine cannot start with in the deployment they are told (or, for the plugin, read).</p>"
        "<table><tr><th>engine</th><th></th><th>backends</th><th>when</th><th>why</th><th>source</th></tr>"
        f"{body}</table>"
    )


def render_report(view: TableView, *, link_gbs: float | None = None, plots: bool = True) -> str:
    """The whole HTML document as a string."""
    figures = []
    if plots and view.shapes:
        from .plot import PlotUnavailable, backend_colors, render_png

        colors = backend_colors(c.backend for s in view.shapes for c in s.curves.values())
        for s in view.shapes:
            try:
                data = render_png(view, s, link_gbs=link_gbs, colors=colors)
            except PlotUnavailable as exc:  # the rest of the report is still worth having
                figures = [f'<div class="note">Plots left out: {_e(exc)}</div>']
                break
            png = base64.b64encode(data).decode("ascii")
            # The figure's own footnote states the copy bound's assumptions: no caption needed.
            figures.append(
                f'<figure id="p-{_e(shape_slug(s))}"><img alt="{_e(shape_label(s))}: latency vs tokens per rank" '
                f'src="data:image/png;base64,{png}"></figure>'
            )
    notes = "".join(f'<div class="note">{_e(n)}</div>' for n in view.notes)
    notes += "".join(f'<div class="note">{_e(suspect_line(f))}</div>' for f in suspect_groups(view))
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    what = "selection table" if view.kind == "profile" else "sweep run"
    title = f"a2a-tune report: {view.fingerprint or 'unknown hardware'}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style></head>
<body><main>
<h1>{_e(title)}</h1>
<p class="sub">{_e(what)} <code>{_e(view.label)}</code> · {_e(len(view.shapes))} shape(s) · report written {_e(now)}</p>
<nav><a href="#winners">winners</a><a href="#failures">failures</a><a href="#engines">engines</a><a href="#facts">probe facts</a><a href="#provenance">run provenance</a><a href="#plots">plots</a></nav>
{notes}
{_summary(view)}
<h2 id="winners">Winners per shape and token range</h2>
<p class="muted">Margin: how much slower the runner-up's median is than the fastest's. "tie": the
runner-up's median lies inside the fastest backend's p10–p90 spread there and within 3% of its median,
so the measurement cannot tell them apart (the table then prefers the engine default).</p>
<section>{_winners_section(view)}</section>
<h2 id="failures">Failures</h2><section>{_failures_section(view)}</section>
<h2 id="engines">What each engine can start with</h2><section>{_engines_section(view)}</section>
<h2 id="facts">Probe facts</h2><section>{_facts_section(view)}</section>
<h2 id="provenance">Run provenance</h2><section>{_provenance_section(view)}</section>
<h2 id="plots">Plots</h2>
{"".join(figures) or '<p class="muted">No plots.</p>'}
</main></body></html>
"""


def write_report(view: TableView, path, *, link_gbs: float | None = None) -> Path:
    """Render and write the report; returns the path."""
    text = render_report(view, link_gbs=link_gbs)
    return write_output(path, text)
