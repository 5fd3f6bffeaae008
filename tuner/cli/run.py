"""probe, sweep, select, run: the operator's once-per-cluster flow."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from ..console import indented
from . import options as opt
from .common import _fail, _note, _planned, _plans, _store_url, app, command_began, emit_json, err, json_output, out

# ---------------------------------------------------------------------------------- probe


@app.command()
@json_output(lambda o: o.get("as_json"))
def probe(
    as_json: bool = typer.Option(False, "--json", help="Print the full facts and the fingerprint as JSON."),
    record: Path | None = typer.Option(None, help="Also save the raw NVML answers to FILE (a test fixture)."),
) -> None:
    """Detect GPUs, NVLink islands, fabric domains and degraded links; print the fingerprint.

    Also refreshes the fingerprint engines' lookups cache for this boot and driver.
    """
    from ..nvml import NvmlQueryError
    from ..probe import cpu_topology, render_summary
    from ..probe import probe as run_probe
    from ..runtime.fingerprint import remember_fingerprint

    if record is not None:
        from ..nvml import RealNvml
        from ..nvml import record as record_nvml

        try:
            record.write_text(json.dumps(record_nvml(RealNvml()), indent=2))
        except Exception as exc:  # no NVML here: nothing to record
            raise _fail(f"cannot record NVML answers: {exc}") from None
    try:
        topo = run_probe(strict=True)
    except NvmlQueryError as exc:  # a crashed or hung NVML: say so, cache nothing
        err.print(f"warning: NVML probe failed ({exc}); reporting this host as CPU-only", highlight=False, markup=False)
        topo = cpu_topology()
    else:
        remember_fingerprint(topo.fingerprint)
    if as_json:
        emit_json(topo.to_dict())
    else:
        out.print(render_summary(topo))


# ---------------------------------------------------------------------------------- sweep


def _print_plan(plan, device: str, world: int, launcher: str, console=out) -> list:
    """The plan before any rank starts: per EP size its groups, shapes, token counts, backends
    and cases (only those that can run here), the sizes skipped for a model, an estimate."""
    from rich import box
    from rich.table import Table

    plans = _plans()
    rows = plans.plan_sizes(plan, device, world)
    t = Table(box=box.SIMPLE_HEAD, title=f"plan: {world} {device} rank(s){launcher}", title_justify="left")
    for name in ("EP size", "groups", "shapes", "tokens", "backends", "cases"):
        t.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        backends = f"{r.backends}" + (f" (+{r.unavailable} unavailable)" if r.unavailable else "")
        t.add_row(str(r.ep_size), str(r.groups), str(r.shapes), str(r.tokens), backends, str(r.cases))
    console.print(t)
    for r in rows:
        for line in r.skipped:
            console.print(f"  skipped: {line}", highlight=False, markup=False, soft_wrap=True)
    if (left_out := plans.world_left_out(plan, world)) is not None:
        console.print(f"  {left_out}", highlight=False, markup=False, soft_wrap=True)
    if any(r.unavailable for r in rows):
        console.print("  unavailable backends: `a2a-tune backends` says why", highlight=False, markup=False)
    from .. import cost

    cases = sum(r.cases for r in rows)
    seconds, source = cost.seconds(cost.load(device), cost.plan_cases(plan, rows), device, world)
    refine = " before refinements" if plan.refine_ratio is not None else ""
    console.print(indented(f"{cases} cases; estimated {_duration(seconds)}{refine} ({source})"))
    return rows


def _learn_cost(db: str, outcome, plan, device: str, world: int) -> None:
    """Fit the cost model (tuner.cost) to the run just measured and keep it for the next plan's
    estimate; quietly nothing when it cannot (a cache, never the run's failure)."""
    from a2a_tune.db import open_store

    from .. import cost

    try:
        if outcome.skipped:  # a resumed run: its gaps hold the pause, not a case
            return
        with open_store(db, readonly=True) as store:
            times = store.case_times(outcome.run_id)
        fitted = cost.fit(times, plan.warmup + plan.iters, device, world, outcome.seconds)
    except Exception:  # noqa: BLE001 - the estimate of a later run is not worth failing this one
        return
    if fitted:
        cost.remember(device, fitted)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _unavailable_names(names: list[str], device: str, world: int) -> list[str]:
    """The backends of `names` that cannot run on `world` `device` ranks here."""
    from a2a_tune.kernels import BackendEnv, availability_of, get_backend

    env = BackendEnv.local(world, device)
    return [name for name in names if not availability_of(get_backend(name), env).ok]


def _outcome_data(outcome, seconds: float) -> dict:
    """What `sweep --json` prints (`run --json` adds the tables written)."""
    return {
        "run": outcome.run_id,
        "status": outcome.status,
        "fingerprint": outcome.fingerprint,
        "world_size": outcome.world_size,
        "measured": outcome.measured,
        "already_stored": outcome.skipped,
        "failed": outcome.failed,
        "unavailable": outcome.unavailable,
        "not_applicable": outcome.not_applicable,
        "infeasible": outcome.infeasible,
        "adaptive_saved": outcome.adaptive_saved,
        "seconds": round(seconds, 1),
    }


def _print_outcome(outcome, seconds: float, out=out) -> None:
    failed = ", ".join(f"{n} {kind}" for kind, n in sorted(outcome.failed.items()) if kind != "unavailable")
    out.print(
        f"run {outcome.run_id} ({outcome.status}) on {outcome.fingerprint}: {outcome.measured} measured, "
        f"{outcome.skipped} already stored" + (f", failed: {failed}" if failed else "") + f" ({seconds:.0f} s)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    from rich.text import Text

    rows = [
        (Text(name), Text(f"{kind}: {reason}"))
        for kind, found in (
            ("unavailable", outcome.unavailable),
            ("not applicable", outcome.not_applicable),
            ("some cases skipped", outcome.infeasible),
        )
        for name, reason in found.items()
    ]
    if rows:  # a table: the reasons wrap at spaces beside whole names, at 80 columns too
        from rich.table import Column

        from ..console import print_fitted

        columns = [Column("backend", no_wrap=True), Column("not measured here")]
        print_fitted(out, columns, rows, box=None, padding=(0, 1, 0, 2), show_header=False)


def _do_sweep(options, *, after=None):
    """Sweep as `options` (tuner.plans.SweepOptions) say, the plan and the store's URL checked
    here, once, before any rank starts; `after`: the step on every rank after a completed run
    (`run`: the table on every node)."""
    db = _store_url(options.db)  # before the imports below: they cost torch
    plan, device, world = _planned(_plans().build_plan, options, note=_note)
    from a2a_tune.db import StoreError

    from ..launch import SIGNAL_EXIT, PeerLost, RankFailed, job_rank
    from ..sweep import sweep as run_sweep

    job = job_rank()
    human = err if options.as_json else out  # --json: standard output carries the JSON alone
    rows = None
    if job is None or job.rank == 0:  # a launched job: rank 0 speaks for it
        rows = _print_plan(plan, device, world, f" ({job.launcher} job)" if job else "", human)
        if options.dry_run:  # the plan, and nothing started or stored
            if options.as_json:
                names = plan.backend_names()
                gone = _unavailable_names(names, device, world)
                data = {"dry_run": True, "device": device, "world_size": world, "plan": plan.to_dict()}
                data["cases"] = sum(r.cases for r in rows)
                data["backends_here"] = [n for n in names if n not in gone]
                data["ep_sizes"] = [
                    {"ep_size": r.ep_size, "groups": r.groups, "cases": r.cases, "skipped": r.skipped} for r in rows
                ]
                emit_json(data)
            raise typer.Exit(0)
    elif options.dry_run:
        raise typer.Exit(0)
    start = time.perf_counter()
    try:
        outcome = run_sweep(
            plan,
            device_type=device,
            world_size=world,
            db_url=db,
            resume=options.resume,
            progress=options.progress,
            case_timeout=options.case_timeout,
            allow_mixed=options.allow_mixed,
            after=after,
            launched_at=command_began(),
        )
    except PeerLost as exc:
        raise _fail(f"sweep stopped: {exc}; relaunch the job with --resume to complete the run") from None
    except (RankFailed, StoreError) as exc:
        raise _fail(f"sweep stopped: {exc}") from None
    except KeyboardInterrupt as exc:
        run_id, by = getattr(exc, "run_id", None), getattr(exc, "signal_name", "SIGINT")
        planned = sum(r.cases for r in rows) if rows else plan.total()  # the cases that can run here
        code, seconds = SIGNAL_EXIT.get(by, 130), time.perf_counter() - start
        message = f"interrupted ({by}) after {seconds:.0f} s; {_stored_so_far(db, planned, run_id)}"
        if options.as_json:  # which run to resume, for a program
            data = {"run": run_id, "status": "interrupted", "signal": by, "seconds": round(seconds, 1)}
            emit_json(data | {"error": message, "exit_code": code})
        raise _fail(message, code) from None
    if outcome is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports and selects
        raise typer.Exit(0)
    outcome.seconds = time.perf_counter() - start
    if outcome.status == "completed":
        _learn_cost(db, outcome, plan, device, world)
    _print_outcome(outcome, outcome.seconds, human)
    if outcome.adaptive_saved:
        human.print(
            f"  adaptive search: {outcome.adaptive_saved} cases of the grid not needed",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    return outcome


def _stored_so_far(db: str | None, planned: int, run_id: int | None) -> str:
    """What an interrupted sweep left in its run, in one line (the Ctrl-C summary). The sweep
    marked the run interrupted itself; this only reads."""
    from a2a_tune.db import open_store

    if run_id is None:
        return "no run was opened yet: nothing was stored"
    try:
        with open_store(db, readonly=True) as store:
            measured, failed = len(store.measurements(run_id)), len(store.failures(run_id))
    except Exception as exc:  # noqa: BLE001 - the summary must not hide the interrupt
        from ..runtime.text import one_line

        return f"the store could not be read ({one_line(exc)})"
    return (
        f"run {run_id} holds {measured} of {planned} planned measurements and {failed} failure record(s); "
        "rerun the same command with --resume to continue"
    )


_SWEEP_OPTIONS = (
    ("device", str, opt.device),
    ("world", int | None, opt.world),
    ("preset", list[str], opt.preset),
    ("model_config", list[Path], opt.model_config),
    ("tokens", str | None, opt.tokens),
    ("ep_sizes", str | None, opt.ep_sizes),
    ("dtype", list[str], opt.dtype),
    ("routing", list[str], opt.routing),
    ("backend", list[str], opt.backend),
    ("warmup", int | None, opt.warmup),
    ("iters", int | None, opt.iters),
    ("db", str | None, opt.db),
    ("resume", bool, opt.resume),
    ("progress", bool, opt.progress),
    ("case_timeout", float, opt.timeout),
    ("adaptive", bool, opt.adaptive),
    ("capacity", int | None, opt.capacity),
    ("refine", bool | None, opt.refine),
    ("allow_mixed", bool, opt.allow_mixed),
    (
        "dry_run",
        bool,
        typer.Option(
            False,
            "--dry-run",
            help="Print the plan and stop: per EP size its groups and how many shapes, token counts, backends "
            "(those that can run here) and cases, and the estimated time; no rank starts, nothing is stored. "
            "With --json: the plan itself (shapes, token counts, backends).",
        ),
    ),
    (
        "as_json",
        bool,
        typer.Option(
            False,
            "--json",
            help="Print the outcome (with --dry-run: the plan) as JSON on standard output; other lines go to stderr.",
        ),
    ),
)


def _sweep_options(out_opt=None):
    """Give a command the sweep options (and, with `out_opt`, --out after --progress); typer
    reads them from the signature, the command gets one tuner.plans.SweepOptions."""
    import functools
    import inspect

    params = []
    for name, kind, option in _SWEEP_OPTIONS:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind))
        if name == "progress" and out_opt is not None:
            params.append(
                inspect.Parameter("out_dir", inspect.Parameter.KEYWORD_ONLY, default=out_opt, annotation=Path | None)
            )

    def decorate(command):
        @functools.wraps(command)
        def with_options(**values):
            return command(_plans().SweepOptions(**values))

        with_options = json_output(lambda o: o.get("as_json"))(with_options)
        del with_options.__wrapped__  # typer must read the options, not the command's one argument
        with_options.__signature__ = inspect.Signature(params)
        with_options.__annotations__ = {p.name: p.annotation for p in params}
        return with_options

    return decorate


@app.command()
@_sweep_options()
def sweep(options) -> None:
    """Check, then time, every backend over shapes x token counts; store every measurement.

    Several nodes: launch it under torchrun or srun, one process per GPU (see `a2a-tune run`,
    which also writes the table on every node)."""
    outcome = _do_sweep(options)
    if options.as_json:
        emit_json(_outcome_data(outcome, outcome.seconds))


# --------------------------------------------------------------------------------- select


def _do_select(db: str | None, runs: list[int] | None, out_dir: Path | None, partial: bool = False) -> Path:
    from a2a_tune.db import EmptyStoreError, NotFoundError, StoreError
    from a2a_tune.db.damage import DamagedRowError

    from ..publish import merge_into_table
    from ..runtime.lookup import ProfileError
    from ..select import UnfinishedRunError, profile_for_run
    from ..tables import merge

    profile, kept_total = None, 0
    for run_id in runs or [None]:  # oldest first as given: each merged into the ones before it
        try:
            table, kept, note = profile_for_run(db, run_id, partial=partial)
        except EmptyStoreError as exc:
            raise _fail(f"{exc}; run `a2a-tune sweep` first") from None
        except NotFoundError:
            if run_id is None:
                raise _fail("no completed run in the database; run `a2a-tune sweep` first") from None
            raise _fail(f"no run {run_id} in the database") from None
        except UnfinishedRunError as exc:
            raise _fail(str(exc), 2) from None
        except (StoreError, ValueError) as exc:
            raise _fail(str(exc), 2 if isinstance(exc, DamagedRowError) else 1) from None
        if note:
            err.print(f"note: {note}; the table is written without them", highlight=False, markup=False)
        if profile is not None and table.fingerprint != profile.fingerprint:
            raise _fail(
                f"run {run_id} is of {table.fingerprint}, run {profile.meta['run']['id']} of "
                f"{profile.fingerprint}: one table holds one fingerprint's runs",
                2,
            )
        profile = table if profile is None else merge(profile, table)
        kept_total += kept
    try:
        written = merge_into_table(profile, str(out_dir) if out_dir else None)
    except (ProfileError, OSError) as exc:
        raise _fail(f"cannot write the profile: {exc}") from None
    path = Path(written.path)
    knobs_note = f", with the knobs of {kept_total} tuned case(s)" if kept_total else ""
    partial_note = "; PARTIAL: from a run that did not complete" if written.partial_runs() else ""
    ids = ", ".join(str(r) for r in runs) if runs else str(profile.meta["run"]["id"])
    before = len(written.entries) - len(profile.entries)
    kept_note = f"; kept {before} shape(s) of the table there that it did not measure" if before else ""
    out.print(
        f"wrote {path} ({len(written.entries)} shape(s)) from run {ids}{knobs_note}{kept_note}{partial_note}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return path


@app.command()
def select(
    db: str | None = opt.db,
    run: list[int] | None = typer.Option(
        None, help="Run id; repeat to merge several runs of one machine [default: the latest completed run]."
    ),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Directory [default: $A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles]."
    ),
    partial: bool = typer.Option(
        False, "--partial", help="Select a run that did not complete too; the table is then marked partial."
    ),
) -> None:
    """Turn runs' measurements into the selection table <fingerprint>.json, merged into the one there."""
    _do_select(db, run, out_dir, partial)


# ------------------------------------------------------------------------------------ run


@app.command()
@_sweep_options(
    typer.Option(
        None, "--out", help="Profile directory [default: $A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles]."
    )
)
def run(options) -> None:
    """Probe + sweep + select: the one command to run once per machine type.

    Several nodes: launch it under torchrun or srun, one process per GPU; every node probes
    itself, rank 0 writes the store, and every node gets the table where lookup looks there."""
    from functools import partial

    from ..publish import publish_run, table_dir, unwritable
    from ..runtime.text import one_line

    out_dir = str(options.out_dir) if options.out_dir else None
    directory = table_dir(out_dir)
    if problem := unwritable(directory):  # before the sweep, not after it; the path may come from the environment
        raise _fail(one_line(f"no table could be written to {directory}: {problem}"), 2)
    outcome = _do_sweep(options, after=partial(publish_run, out_dir=out_dir))
    if outcome.status != "completed":
        raise _fail("the sweep did not complete; no table written")
    published = outcome.after
    human = err if options.as_json else out
    if published.get("note"):
        err.print(f"note: {published['note']}; the table is written without them", highlight=False, markup=False)
    knobs_note = f", with the knobs of {published['kept_knobs']} tuned point(s)" if published["kept_knobs"] else ""
    several = len(outcome.cluster.get("nodes", [])) > 1
    if options.as_json:
        data = _outcome_data(outcome, outcome.seconds)
        data["tables"] = {host: str(path) for host, path in published["tables"].items()}
        data["table_errors"] = published["errors"]
        data["entries"] = published["entries"]
        emit_json(data)
    for host, path in published["tables"].items():
        human.print(
            f"wrote {path}{f' on {host}' if several else ''} ({published['entries']} shape(s)) "
            f"from run {outcome.run_id}{knobs_note}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if published["errors"]:
        raise _fail("no table written on " + "; ".join(f"{h}: {why}" for h, why in published["errors"].items()))
    if hint := _lookup_hint(options, published["tables"], outcome.run_id):
        human.print(f"look it up: {hint}", highlight=False, markup=False, soft_wrap=True)


def _lookup_hint(options, tables: dict, run_id: int) -> str | None:
    """A lookup the table just written answers exactly: an EP size, a shape, a payload and a
    token count of an entry this run measured (the --preset by name when the run had one),
    with --profile when the table is not where lookup looks by default; None without one."""
    from ..publish import table_dir
    from ..runtime.files import read_json
    from ..shapes import presets

    paths = list(tables.values())
    if not paths:
        return None
    try:
        entries = [e for e in read_json(paths[0])["entries"] if e.get("tokens")]
    except Exception:  # noqa: BLE001 - a hint, never a failure of the run
        return None
    ours = [e for e in entries if any(p.get("run") == run_id for p in e.get("provenance", []))] or entries
    named = {(m.num_experts, m.topk, m.hidden): name for name, m in presets().items() if name in options.preset}
    ours.sort(
        key=lambda e: ((e["num_experts"], e["topk"], e["hidden"]) not in named, e["ep_size"], e["dtype"] != "bf16")
    )
    if not ours:
        return None
    e = ours[0]
    key = (e["num_experts"], e["topk"], e["hidden"])
    shape = (
        f"--preset {named[key]}" if key in named else f"--hidden {e['hidden']} --topk {e['topk']} --experts {key[0]}"
    )
    words = [f"a2a-tune lookup --ep-size {e['ep_size']} {shape} --tokens {max(e['tokens'])}"]
    if e["dtype"] != "bf16":
        words.append(f"--dtype {e['dtype']}")
    if e["routing"] != "uniform":
        words.append(f"--routing {e['routing']}")
    if Path(paths[0]).parent.resolve() != table_dir(None).resolve():
        words.append(f"--profile {paths[0]}")
    return " ".join(words)
