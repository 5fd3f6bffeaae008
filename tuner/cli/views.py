"""show, diff, plot, report: what operators read."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import typer

from ..runtime.environ import env_text
from .common import _fail, _help, app, emit_json, json_output, out

# ------------------------------------------------------------------------------ ops views
# show / diff / plot / report: read-only views of a table (profile JSON) or of a sweep run
# in a database (tuner/views/). They never create or change a store.
# Help texts avoid bare square brackets: the rich help renderer takes "[...]" for markup.

_profile_in_opt = typer.Option(None, "--profile", help="A profile JSON (selection table) to read.")
_db_in_opt = typer.Option(
    None,
    "--db",
    help="Read a sweep run from this database instead: SQLAlchemy URL or SQLite file path "
    "(env A2A_TUNE_DB; default sqlite:///a2a_tune.db). Never created or changed here.",
)
_run_in_opt = typer.Option(None, "--run", help="Run id in --db (default: the latest completed run).")
_link_opt = typer.Option(
    None,
    "--link-gbs",
    min=0.001,
    help="GB/s one rank can send to the others (all its links together), for the copy-bound line "
    "(default: NVLink links x per-link speed from the probe facts; no line when unknown).",
)


def _view_fail(exc: Exception) -> typer.Exit:
    """Exit 2 with the one-line message (`_fail` escapes it: paths and reasons may hold "[...]")."""
    return _fail(str(exc), 2)


def _views_dir(name: str) -> Path:
    """Where plot and report write unless told: `name`/ in the directory tables are written to."""
    from ..runtime.profiles import table_dir

    return table_dir() / name


@contextmanager
def _viewing(profile: Path | None, db: str | None, run_id: int | None):
    """The view of --profile, or of --db's --run; a ViewError on the way in or inside (an
    unreadable input, a table the lookup refuses) is a one-line error, exit code 2."""
    from ..views.load import load_view
    from ..views.model import ViewError

    try:
        yield load_view(profile=profile, db=db, run=run_id)
    except ViewError as exc:
        raise _view_fail(exc) from None


@app.command(
    help=_help(
        "Winners per shape and token range, margins, failures with reasons, and where the numbers come from.",
        "Reads a profile (--profile FILE) or a run in a database (--db URL, --run ID). Consecutive token counts "
        "with the same winner are shown as one range, e.g. '1–64: allgather_reducescatter, margin 12–80%'. "
        "A '*' on a margin marks a tie: the runner-up's median lies inside the fastest's p10–p90 spread there "
        "and within 3% of it. Winners are what the lookup answers at each measured token count.",
        "Exit code 2 when the input cannot be read (missing file, not JSON, not a database, no such run) "
        "or is a table the lookup refuses.",
    )
)
@json_output(lambda o: o.get("as_json"))
def show(
    profile: Path | None = _profile_in_opt,
    db: str | None = _db_in_opt,
    run: int | None = _run_in_opt,
    as_json: bool = typer.Option(False, "--json", help="Print the same content as JSON."),
) -> None:
    from ..views.show import render_show, show_data

    with _viewing(profile, db, run) as view:
        engines = _engine_scores_of(profile)
        if as_json:
            data = show_data(view)
            if engines is not None:
                from ..policies import scores_data

                data["engines"] = scores_data(engines)
            emit_json(data)
        else:
            render_show(view, out)
            if engines is not None:
                from ..policies import render_scores

                render_scores(engines, out, f"{profile.name}, its measured points")


def _engine_scores_of(profile: Path | None):
    """Each engine's own rule vs the table on the table's points (a profile only: a run is
    no table; `a2a-tune evaluate --profile T --run N` scores a table on it)."""
    if profile is None:
        return None
    from ..policies import score_table

    return score_table(str(profile))


def _min_effect() -> float:
    from ..views.diff import MIN_EFFECT

    return MIN_EFFECT


@app.command(
    help=_help(
        "Compare A (baseline) with B (candidate): where the winner changed and which backends got slower beyond noise.",
        "Inputs: two profiles (diff old.json new.json), two SQLite databases (their latest completed runs), "
        "two runs of one database (diff --db URL --run 3 --run 5), or a run and a profile "
        "(diff --db URL --run 3 new.json).",
        "Slower beyond noise: at the same shape and tokens per rank, B's p10 is above A's p90, then B's median is above "
        "A's by more than either run's p10–p90 spread, or the gap between the two (B's p10 / A's p90) is wider "
        "than the narrower run's own p90 / p10 (a slower run is often a noisier one), and B is slower by more "
        "than --tolerance (10% by default: two "
        "back-to-back runs of one plan on one machine do not trip it, a 20% slowdown does); the ratio of the "
        "medians is reported. A backend that ran cleanly in A and fails in B counts as a regression. A winner "
        "change is 'within noise' when B's spreads of the old and the new winner overlap; those never fail "
        "the command.",
        "Exit code: 0 when nothing that --fail-on names happened; 1 on regressions (and on clear winner changes "
        "with --fail-on winner-change); 2 on bad input, a table the lookup refuses included. In a cluster's CI: "
        "a2a-tune diff last-month.json this-month.json --fail-on regressions",
    )
)
@json_output(lambda o: o.get("as_json"))
def diff(
    sources: list[str] = typer.Argument(
        None,
        metavar="A B",
        show_default=False,
        help="Profile JSON files or SQLite database files (a database: its latest completed run).",
    ),
    db: str | None = typer.Option(
        None, "--db", help="Database for --run: SQLAlchemy URL or SQLite file path (env A2A_TUNE_DB)."
    ),
    runs: list[int] = typer.Option([], "--run", help="Run id in --db, repeatable: --run 3 --run 5 (the first is A)."),
    fail_on: list[str] = typer.Option(
        ["regressions"], "--fail-on", help="What makes the exit code 1, repeatable: regressions | winner-change | none."
    ),
    tolerance: float = typer.Option(
        _min_effect(),
        "--tolerance",
        min=0.0,
        help="The minimum effect: a slowdown must also exceed this fraction of A's median (0.10 = 10%) to count.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
) -> None:
    import math

    from ..views.diff import diff_views, render_diff
    from ..views.load import load_run_view, load_source
    from ..views.model import ViewError

    if not math.isfinite(tolerance):
        raise _fail(f"--tolerance must be a finite fraction >= 0, got {tolerance}", 2)

    modes = set(fail_on) or {"regressions"}
    bad = modes - {"regressions", "winner-change", "none"}
    if bad:
        raise _fail(f"--fail-on must be regressions, winner-change or none, got {', '.join(sorted(bad))}", 2)
    if "none" in modes:
        modes = set()
    sources = list(sources or [])
    if runs and db is None and not env_text("A2A_TUNE_DB"):
        raise _fail("--run needs --db URL (or $A2A_TUNE_DB)", 2)
    if len(runs) + len(sources) != 2:
        raise _fail(
            f"diff needs exactly two inputs (A and B), got {len(runs) + len(sources)}: "
            "two files, --db URL --run A --run B, or --db URL --run A FILE",
            2,
        )
    try:
        views = [load_run_view(db, r) for r in runs] + [load_source(s) for s in sources]
    except ViewError as exc:
        raise _view_fail(exc) from None
    a, b = views
    for name, v in (("A", a), ("B", b)):
        if not v.shapes:
            raise _view_fail(ViewError(f"{name} ({v.label}) has no shapes with measurements to compare"))
    res = diff_views(a, b, tolerance=tolerance)
    if as_json:
        data = res.to_dict()
        data["min_effect"] = tolerance  # the rule's minimum effect (--tolerance)
        data["failing"] = res.failing(modes)
        emit_json(data)
    else:
        render_diff(res, out, fail_on=modes)
    if res.failing(modes):  # the last line of the report already says FAIL and why
        raise typer.Exit(1)


@app.command(
    help=_help(
        "One PNG per shape: latency vs tokens per rank, one line per backend (median, with its p10–p90 band).",
        "Log-log axes; the winner per token bucket shaded along the x axis (hatched where it is a tie); the "
        "physical limit as a dashed line when the link bandwidth is known: the bytes each rank sends in "
        "dispatch + combine over --link-gbs or the NVLink bandwidth in the probe facts. Each figure states "
        "what the line assumes.",
        "Files: OUT/<fingerprint>.<source>.<shape>.png (source: run<id> for a run, else the table file's name), one path printed per line; OUT defaults to plots/ in the "
        "directory tables are written to ($A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles), never "
        "the current directory unasked. A CPU rehearsal's figures say so. Needs matplotlib "
        "(pip install 'a2a-tune[plot]').",
    )
)
def plot(
    profile: Path | None = _profile_in_opt,
    db: str | None = _db_in_opt,
    run: int | None = _run_in_opt,
    out_dir: Path | None = typer.Option(
        None, "--out", help="Directory for the PNG files (created if needed) [default: plots/ beside the tables]."
    ),
    link_gbs: float | None = _link_opt,
) -> None:
    from ..views.plot import plot_view

    with _viewing(profile, db, run) as view:
        paths = plot_view(view, out_dir or _views_dir("plots"), link_gbs=link_gbs)
    for p in paths:
        out.print(str(p), highlight=False, markup=False, soft_wrap=True)


@app.command(
    help=_help(
        "One self-contained HTML file for review: probe facts, run provenance, winners, failures, plots.",
        "Plots are embedded as PNG (base64) and the CSS is inline; the file loads nothing from elsewhere, so it "
        "can be attached to a ticket or mailed as is. Needs matplotlib for the plots.",
    )
)
def report(
    profile: Path | None = _profile_in_opt,
    db: str | None = _db_in_opt,
    run: int | None = _run_in_opt,
    out_file: Path | None = typer.Option(
        None,
        "--out",
        help="HTML file to write (default: reports/a2a-tune-report.<fingerprint>.html beside the tables: "
        "$A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles).",
    ),
    link_gbs: float | None = _link_opt,
) -> None:
    from ..views.report import write_report

    with _viewing(profile, db, run) as view:
        path = out_file or _views_dir("reports") / f"a2a-tune-report.{view.fingerprint or 'unknown'}.html"
        write_report(view, path, link_gbs=link_gbs)
    from ..views.plot import plots_unavailable

    missing = plots_unavailable() if view.shapes else None  # the report says so too; say it here
    note = f"; without plots: {missing}" if missing else ", plots embedded" if view.shapes else ""
    out.print(f"wrote {path}", highlight=False, markup=False, soft_wrap=True)  # a path: whole, to copy
    from rich.text import Text

    from ..console import indented

    out.print(indented(Text(f"{len(view.shapes)} shape(s){note}")))  # wrapped at spaces, at 80 columns too
