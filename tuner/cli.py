"""`a2a-tune`: the command line. Heavy imports (torch, SQLAlchemy) happen inside the commands
that need them, so `a2a-tune lookup` stays as light as the runtime lookup itself."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    help=(
        "Measure the MoE all2all backends on this machine and emit the table serving engines "
        "consult at start-up.\n\nThe flow: probe -> sweep -> select -> lookup. "
        "`a2a-tune run` does the first three with good defaults."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts show "[default: ...]" literally
    add_completion=False,
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"a2a-tune {version('a2a-tune')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("a2a-tune (not installed: version unknown)")
        raise typer.Exit(0)


@app.callback()
def _options(
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Options before the command."""


out = Console()
err = Console(stderr=True)
# One-line messages print with soft_wrap=True: rich never breaks them (a terminal wraps them,
# a captured log keeps each whole); tables and views fit the width by their own rules.

DB_HELP = "SQLAlchemy URL or SQLite file path [env: A2A_TUNE_DB; default: sqlite:///a2a_tune.db]."


def _fail(message: str, code: int = 1) -> typer.Exit:
    # messages quote user input and file names: never rich markup; URLs never show a password
    if "://" in message:
        from a2a_tune.db import mask_secrets

        message = mask_secrets(message)
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _store_url(db: str | None) -> str:
    """--db for a command that stores, checked before any rank starts: it parses, and it is
    not an in-memory database (what a sweep stored there would vanish with it)."""
    from a2a_tune.db import StoreError, check_url

    try:
        return check_url(db, persistent=True)
    except StoreError as exc:
        raise _fail(str(exc), 2) from None


# ---------------------------------------------------------------------------------- probe


@app.command()
def probe(
    as_json: bool = typer.Option(False, "--json", help="Print the full facts and the fingerprint as JSON."),
    record: Path | None = typer.Option(None, help="Also save the raw NVML answers to FILE (a test fixture)."),
) -> None:
    """Detect GPUs, NVLink islands, fabric domains and degraded links; print the fingerprint.

    Also refreshes the fingerprint engines' lookups cache for this boot and driver.
    """
    from .nvml import NvmlQueryError
    from .probe import cpu_topology, render_summary
    from .probe import probe as run_probe
    from .runtime.fingerprint import remember_fingerprint

    if record is not None:
        from .nvml import RealNvml
        from .nvml import record as record_nvml

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
        out.print_json(json.dumps(topo.to_dict()))
    else:
        out.print(render_summary(topo))


# ---------------------------------------------------------------------------------- sweep


def _planned(step, *args, **kwargs):
    """`step` of tuner.plans (options -> plan); its PlanError is a one-line error, exit code 2."""
    from .plans import PlanError

    try:
        return step(*args, **kwargs)
    except PlanError as exc:
        raise _fail(str(exc), 2) from None


def _plans():
    from . import plans

    return plans


def _note(line: str) -> None:
    """A note the plan's rules say on the way (one line on stderr; not an error)."""
    err.print(line, highlight=False, markup=False)


def _unavailable_here(names: list[str], device: str, world: int) -> int:
    """How many of the backends `names` cannot run on `world` `device` ranks here."""
    from a2a_tune.kernels import BackendEnv, get_backend

    env = BackendEnv.local(world, device)
    return sum(not get_backend(name).availability(env)[0] for name in names)


def _print_outcome(outcome, seconds: float) -> None:
    failed = ", ".join(f"{n} {kind}" for kind, n in sorted(outcome.failed.items()) if kind != "unavailable")
    out.print(
        f"run {outcome.run_id} ({outcome.status}) on {outcome.fingerprint}: {outcome.measured} measured, "
        f"{outcome.skipped} already stored" + (f", failed: {failed}" if failed else "") + f" ({seconds:.0f} s)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    for name, reason in outcome.unavailable.items():
        out.print(f"  {name}: unavailable: {reason}", highlight=False, markup=False, soft_wrap=True)
    for name, reason in outcome.not_applicable.items():
        out.print(f"  {name}: not applicable: {reason}", highlight=False, markup=False, soft_wrap=True)
    for name, reason in outcome.infeasible.items():
        out.print(f"  {name}: some cases skipped: {reason}", highlight=False, markup=False, soft_wrap=True)


def _do_sweep(options, *, publish: bool = False):
    """Sweep as `options` (tuner.plans.SweepOptions) say; `publish`: `run`'s table on every node."""
    _store_url(options.db)  # before the imports below: they cost torch
    from a2a_tune.db import StoreError

    from .launch import PeerLost, RankFailed, job_rank
    from .plans import PlanError
    from .sweep import sweep as run_sweep

    plan, device, world = _planned(_plans().build_plan, options, note=_note)
    db = options.db
    job = job_rank()
    if job is None or job.rank == 0:  # a launched job: rank 0 speaks for it
        launcher = f" ({job.launcher} job)" if job else ""
        names = plan.backend_names()
        unavailable = _unavailable_here(names, device, world)
        out.print(
            f"sweeping {len(plan.shapes)} shape(s) x {len(plan.tokens)} token counts x {len(names) - unavailable} "
            f"backend(s) on {world} {device} rank(s){launcher}"
            + (f" ({unavailable} more unavailable here: `a2a-tune backends` says why)" if unavailable else ""),
            highlight=False,
            soft_wrap=True,
        )
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
            publish=publish,
            out_dir=str(options.out_dir) if options.out_dir else None,
        )
    except PlanError as exc:  # the plan was checked above; a rank's share of memory can shrink since
        raise _fail(str(exc), 2) from None
    except PeerLost as exc:
        raise _fail(f"sweep stopped: {exc}; relaunch the job with --resume to complete the run") from None
    except (RankFailed, StoreError) as exc:
        raise _fail(f"sweep stopped: {exc}") from None
    except KeyboardInterrupt as exc:
        run_id, by = getattr(exc, "run_id", None), getattr(exc, "signal_name", "SIGINT")
        raise _fail(
            f"interrupted ({by}) after {time.perf_counter() - start:.0f} s; {_stored_so_far(db, plan.total(), run_id)}",
            143 if by == "SIGTERM" else 130,
        ) from None
    if outcome is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports and selects
        raise typer.Exit(0)
    _print_outcome(outcome, time.perf_counter() - start)
    if outcome.adaptive_saved:
        out.print(
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
        from .runtime.text import one_line

        return f"the store could not be read ({one_line(exc)})"
    return (
        f"run {run_id} holds {measured} of {planned} planned measurements and {failed} failure record(s); "
        "rerun the same command with --resume to continue"
    )


_device_opt = typer.Option(
    "auto",
    help="cuda: one rank per GPU (NCCL); cpu: CPU ranks over gloo (on a GPU host: a rehearsal, not its table); "
    "auto: cuda if >= 2 GPUs, or a GPU under torchrun/srun.",
)
_world_opt = typer.Option(None, help="Ranks to spawn [default: every GPU; 2 on cpu]. Ignored under torchrun/srun.")
_preset_opt = typer.Option(
    [], "--preset", help="Model shape preset, repeatable [default: all]. See `a2a-tune presets`."
)
_config_opt = typer.Option([], "--model-config", help="Hugging Face config.json of an MoE model, repeatable.")
_tokens_opt = typer.Option(
    None,
    help="Tokens per rank, comma-separated [default on cuda: 1..16384, powers of 2 and 3·2^k (28 counts); on cpu: 1,4,16,64,256].",
)
_dtype_opt = typer.Option(
    [],
    "--dtype",
    help="Payload dtype, repeatable: bf16, fp16, fp32, fp8_e4m3 (block-FP8, quantized before dispatch) [default: bf16].",
)
_routing_opt = typer.Option([], "--routing", help="Routing, repeatable: uniform, skewed, local [default: uniform].")
_backend_opt = typer.Option([], "--backend", help="Backend to sweep, repeatable [default: every registered one].")
_warmup_opt = typer.Option(None, min=0, help="Warm-up round trips per case [default: 10 cuda, 3 cpu].")
_iters_opt = typer.Option(None, min=1, help="Timed samples per case [default: 50 cuda, 15 cpu].")
_db_opt = typer.Option(None, "--db", help=DB_HELP)
_resume_opt = typer.Option(False, help="Continue the latest unfinished run with the same plan; skip what it stored.")
_progress_opt = typer.Option(True, help="Show a progress bar.")
_adaptive_opt = typer.Option(
    False,
    help="Measure a coarse token grid, then bisect where the winner changes, instead of every token count.",
)
_capacity_opt = typer.Option(
    None,
    min=1,
    help="Tokens per rank to build fixed-capacity backends for (ours, FlashInfer's, padded AG+RS), "
    "e.g. your engine's largest step; the step-sized ones (ours, FlashInfer one-sided, padded AG+RS) are "
    "told each step's size as engines tell them, the others pay the capacity [default: each token count's own].",
)
_refine_opt = typer.Option(
    None,
    "--refine/--no-refine",
    help="Where the winner changes between neighbouring token counts, or the top two "
    "are within 3% at both, also measure between them (bisecting until <= 20% apart): a backend whose cost steps "
    "between grid counts is caught, at a few measurements per crossover or close race [default: on for cuda, off "
    "for cpu, where gloo noise makes every pair a race].",
)
_mixed_opt = typer.Option(
    False,
    "--allow-mixed",
    help="Sweep even when the job's nodes differ (GPU model, NVLink health, driver, NCCL, CUDA, torch or "
    "FlashInfer version); without it such a job stops before any timing, naming the odd node. The run and "
    "its table record the mix.",
)
_timeout_opt = typer.Option(
    600.0,
    help="Seconds one case may make no progress before every rank is stopped, the case recorded "
    "as a timeout and the sweep restarted without that backend.",
)


# The options `sweep` and `run` share, in their --help order; run adds --out after --progress.
_SWEEP_OPTIONS = (
    ("device", str, _device_opt),
    ("world", int | None, _world_opt),
    ("preset", list[str], _preset_opt),
    ("model_config", list[Path], _config_opt),
    ("tokens", str | None, _tokens_opt),
    ("dtype", list[str], _dtype_opt),
    ("routing", list[str], _routing_opt),
    ("backend", list[str], _backend_opt),
    ("warmup", int | None, _warmup_opt),
    ("iters", int | None, _iters_opt),
    ("db", str | None, _db_opt),
    ("resume", bool, _resume_opt),
    ("progress", bool, _progress_opt),
    ("case_timeout", float, _timeout_opt),
    ("adaptive", bool, _adaptive_opt),
    ("capacity", int | None, _capacity_opt),
    ("refine", bool | None, _refine_opt),
    ("allow_mixed", bool, _mixed_opt),
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
    _do_sweep(options)


# --------------------------------------------------------------------------------- select


def _do_select(db: str | None, run_id: int | None, out_dir: Path | None) -> Path:
    from a2a_tune.db import EmptyStoreError, NotFoundError, StoreError

    from .publish import write_table
    from .runtime.lookup import ProfileError
    from .select import profile_for_run

    try:
        profile, kept, note = profile_for_run(db, run_id)
    except EmptyStoreError as exc:
        raise _fail(f"{exc}; run `a2a-tune sweep` first") from None
    except NotFoundError:
        if run_id is None:
            raise _fail("no completed run in the database; run `a2a-tune sweep` first") from None
        raise _fail(f"no run {run_id} in the database") from None
    except (StoreError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if note:
        err.print(f"note: {note}; the table is written without them", highlight=False, markup=False)
    try:
        path = write_table(profile, str(out_dir) if out_dir else None)
    except (ProfileError, OSError) as exc:
        raise _fail(f"cannot write the profile: {exc}") from None
    knobs_note = f", with the knobs of {kept} tuned case(s)" if kept else ""
    out.print(
        f"wrote {path} ({len(profile['entries'])} shape(s)) from run {profile['run']['id']}{knobs_note}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return path


@app.command()
def select(
    db: str | None = _db_opt,
    run: int | None = typer.Option(None, help="Run id [default: the latest completed run]."),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Directory [default: $A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles]."
    ),
) -> None:
    """Turn a run's measurements into the selection table profiles/<fingerprint>.json."""
    _do_select(db, run, out_dir)


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
    outcome = _do_sweep(options, publish=True)
    if outcome.status != "completed":
        raise _fail("the sweep did not complete; no table written")
    published = outcome.published
    if published.get("note"):
        err.print(f"note: {published['note']}; the table is written without them", highlight=False, markup=False)
    knobs_note = f", with the knobs of {published['kept_knobs']} tuned point(s)" if published["kept_knobs"] else ""
    several = len(outcome.cluster.get("nodes", [])) > 1
    for host, path in published["tables"].items():
        out.print(
            f"wrote {path}{f' on {host}' if several else ''} ({published['entries']} shape(s)) "
            f"from run {outcome.run_id}{knobs_note}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if published["errors"]:
        raise _fail("no table written on " + "; ".join(f"{h}: {why}" for h, why in published["errors"].items()))
    out.print(
        f"look it up: a2a-tune lookup --ep-size {outcome.world_size} --hidden H --topk K --experts E --tokens T",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


# ------------------------------------------------------------------------------- evaluate


@app.command()
def evaluate(
    profile: Path = typer.Option(..., help="The table to judge (a profile JSON)."),
    device: str = _device_opt,
    world: int | None = _world_opt,
    db: str | None = _db_opt,
    tokens: str | None = typer.Option(
        None, help="Held-out tokens per rank [default: up to 8 midpoints between the table's, spread over its range]."
    ),
    warmup: int | None = _warmup_opt,
    iters: int | None = _iters_opt,
    progress: bool = _progress_opt,
    case_timeout: float = _timeout_opt,
    backend: list[str] = _backend_opt,
    capacity: int | None = typer.Option(
        None, min=1, help="As for `sweep` [default: the capacity the table was measured with (its run.capacity)]."
    ),
    scored_run: int | None = typer.Option(
        None,
        "--run",
        help="Measure nothing: score the table on this stored run's points (e.g. an adaptive "
        "sweep's table on the full grid's run, or on an earlier evaluation's held-out run).",
    ),
    table_points: bool = typer.Option(
        False,
        "--table-points",
        help="Measure nothing: score on the table's own points (every backend's median at each of its token "
        "counts; in-sample for the table, not for the engines' own rules). No GPU needed.",
    ),
) -> None:
    """Measure held-out token counts for the table's shapes and report its regret vs the best backend.

    Beside the table: always allgather_reducescatter, always the best single backend, and each engine's own rule (vLLM's default and its proposed GB200/GB300 one-sided default, TensorRT-LLM's priority list on this machine, SGLang's default) against the table's answer for that engine, with the table's speedup over it.
    """
    from a2a_tune.db import StoreError, open_store

    from .evaluate import EvaluationError, held_out_plan, table_measurements
    from .evaluate import evaluate as run_evaluation
    from .launch import RankFailed
    from .plans import PlanError
    from .runtime.lookup import ProfileError, load_profile
    from .sweep import sweep as run_sweep

    try:
        table = load_profile(profile)
    except ProfileError as exc:
        raise _fail(str(exc), 2) from None
    if table_points and scored_run is not None:
        raise _fail("give --run or --table-points, not both", 2)
    if table_points:
        _print_evaluation(
            run_evaluation(table_measurements(str(profile)), str(profile)), f"{profile.name}: its own points"
        )
        return
    if scored_run is not None:
        try:
            with open_store(db, readonly=True) as store:
                store.get_run(scored_run)
                measured, failed = store.measurements(scored_run), store.failures(scored_run)
        except StoreError as exc:
            raise _fail(f"run {scored_run} could not be read: {exc}", 2) from None
        _print_evaluation(run_evaluation(measured, str(profile), failed), f"run {scored_run} (stored)")
        return
    _store_url(db)
    plans = _plans()
    device, world = _planned(plans.resolve_ranks, device, world, note=_note)
    held = _planned(plans.parse_tokens, tokens) if tokens else None
    _planned(plans.check_backends, backend)
    try:
        plan = held_out_plan(
            table,
            profile,
            device=device,
            world=world,
            tokens=held,
            backends=tuple(backend),
            warmup=warmup,
            iters=iters,
            capacity=capacity,
        )
    except EvaluationError as exc:
        raise _fail(str(exc), 2) from None
    _planned(plans.check_plan, plan, device, world)
    out.print(
        f"evaluating {profile.name} at {len(plan.tokens)} held-out token counts x {len(plan.shapes)} shape(s)",
        highlight=False,
    )
    try:
        outcome = run_sweep(
            plan, device_type=device, world_size=world, db_url=db, progress=progress, case_timeout=case_timeout
        )
    except PlanError as exc:
        raise _fail(str(exc), 2) from None
    except (RankFailed, StoreError) as exc:
        raise _fail(f"evaluation stopped: {exc}") from None
    except KeyboardInterrupt as exc:
        by = getattr(exc, "signal_name", "SIGINT")
        raise _fail(f"evaluation interrupted ({by}); its run is kept", 143 if by == "SIGTERM" else 130) from None
    with open_store(db) as store:
        ev = run_evaluation(store.measurements(outcome.run_id), str(profile), store.failures(outcome.run_id))
    _print_evaluation(ev, f"run {outcome.run_id}")


def _print_evaluation(ev, title: str) -> None:
    from rich.table import Table

    if not ev.points:
        raise _fail(f"{title}: no measured point of a shape the table has ({ev.outside} of other shapes)", 1)
    t = Table("policy", "mean regret", "worst regret", "points", title=f"{title}: regret vs the best backend")
    for policy, r in sorted(ev.policies.items(), key=lambda kv: kv[1]["mean"]):
        t.add_row(policy, f"{100 * r['mean']:.1f}%", f"{100 * r['worst']:.1f}%", str(r["points"]))
    out.print(t)
    for policy, n in sorted(ev.failed.items()):
        out.print(
            f"{policy}: its backend FAILED at {n} of {len(ev.points)} point(s) (error, timeout or wrong result)",
            highlight=False,
        )
    for policy, n in sorted(ev.unscored.items()):
        out.print(
            f"{policy}: {n} of {len(ev.points)} point(s) not scored (its backend was not measured there)",
            highlight=False,
        )
    if ev.outside:
        out.print(f"{ev.outside} measured point(s) of shapes the table has no entry for: not scored", highlight=False)
    if ev.engines:
        from .policies import render_scores

        render_scores(ev.engines, out, title)
    worst = ev.worst(5)
    if worst:  # where the table is weakest: what to re-measure or add to the grid
        w = Table("shape", "tokens", "table's pick", "fastest", "regret", title="worst points")
        for pt in worst:
            ep, hidden, topk, experts, dtype, routing = pt["shape"]
            shape = f"E{experts}-k{topk}-H{hidden} {dtype} ep{ep}" + ("" if routing == "uniform" else f" {routing}")
            w.add_row(shape, str(pt["tokens"]), pt["table_backend"], pt["best"], f"{100 * pt['table']:.1f}%")
        out.print(w)


# ----------------------------------------------------------------------------- tune-knobs


@app.command("tune-knobs")
def tune_knobs(
    backend: str = typer.Option(
        ..., help="The backend whose knobs to search (see its knob_space; `a2a-tune backends`)."
    ),
    preset: str | None = typer.Option(None, help="Model shape preset (see `a2a-tune presets`). Or --model-config."),
    model_config: Path | None = typer.Option(None, "--model-config", help="Hugging Face config.json of an MoE model."),
    tokens: str = typer.Option(..., help="Tokens per rank, comma-separated: one study each."),
    trials: int = typer.Option(16, min=1, help="Settings measured per token count, the defaults included."),
    dtype: str = typer.Option("bf16", help="Payload dtype."),
    routing: str = typer.Option("uniform", help="Routing: uniform, skewed, local."),
    device: str = _device_opt,
    world: int | None = _world_opt,
    db: str | None = _db_opt,
    profile: Path | None = typer.Option(
        None,
        help="A table (profile JSON) to write the best knobs into, per token count it has for this shape; "
        "rewritten atomically.",
    ),
    warmup: int | None = typer.Option(
        None, min=0, help="Warm-up round trips per measurement [default: 10 cuda, 1 cpu]."
    ),
    iters: int | None = typer.Option(
        None, min=1, help="Timed samples of a full measurement [default: 30 cuda, 6 cpu]."
    ),
    probe_iters: int | None = typer.Option(
        None,
        min=1,
        help="Timed samples of the short first measurement that prunes hopeless settings [default: 5 cuda, 2 cpu].",
    ),
    seed: int = typer.Option(0, help="Sampler seed."),
    progress: bool = _progress_opt,
    capacity: int | None = typer.Option(
        None,
        min=1,
        help="As for `sweep` [default: --profile's run.capacity if it has one, else each token count's own].",
    ),
) -> None:
    """Search a backend's launch knobs with Optuna, per token count; print default vs best.

    Each setting is first checked with the invariant (a wrong one fails its trial and is never
    chosen), then timed like the sweep times it; settings clearly slower than the best so far
    are pruned after a short first measurement. The studies are stored in the --db database:
    `optuna-dashboard <url>` shows them. Backends without knobs (FlashInfer: its block sizes are
    environment variables read once per process; NCCL-based: NCCL_PROTO/ALGO are read at
    communicator creation) are reported as such.
    """
    url = _store_url(db)  # before the imports below: they cost torch
    from a2a_tune.db import StoreError, display_url
    from a2a_tune.kernels import UnknownBackendError, get_backend

    from .knobs import DEFAULT_ITERS, KnobPlan
    from .knobs import tune_knobs as run_search
    from .launch import RankFailed
    from .runtime.lookup import ProfileError, load_profile
    from .select import with_knobs_from_file, write_profile_to

    try:
        cls = get_backend(backend)
    except UnknownBackendError as exc:
        raise _fail(str(exc), 2) from None
    if not cls.knob_space:
        out.print(
            f"{backend} declares no knobs that can change within a process: nothing to search",
            highlight=False,
            markup=False,
        )
        return
    plans = _plans()
    options = plans.SweepOptions(
        device=device,
        world=world,
        preset=[preset] if preset else [],
        model_config=[model_config] if model_config else [],
        tokens=tokens,
        dtype=[dtype],
        routing=[routing],
        backend=[backend],
    )
    plan, device, world = _planned(plans.build_plan, options, note=_note)
    if len(plan.shapes) != 1:
        raise _fail("give one model shape: --preset or --model-config", 2)
    table_capacity = None
    if profile is not None:  # tune as the table's points were measured
        try:
            table_capacity = load_profile(profile).capacity
        except ProfileError:
            pass  # an unusable table is reported where the knobs are written
    capacity = _planned(plans.check_capacity, capacity, plan.tokens, table_capacity)
    if capacity is not None:  # the cases at that capacity must fit too
        from dataclasses import replace

        _planned(plans.check_plan, replace(plan, capacity=capacity), device, world)
    defaults = DEFAULT_ITERS[device]
    knob_plan = KnobPlan(
        backend=backend,
        shape=plan.shapes[0],
        tokens=plan.tokens,
        dtype=dtype,
        routing=routing,
        trials=trials,
        warmup=defaults[0] if warmup is None else warmup,
        iters=iters or defaults[1],
        probe_iters=probe_iters or defaults[2],
        seed=seed,
        capacity=capacity,
    )
    shape = plan.shapes[0]
    out.print(
        f"searching {backend} knobs at {shape.name} {dtype} ep{world}, {len(plan.tokens)} token count(s) x "
        f"{trials} trials on {world} {device} rank(s); studies in {display_url(url)}",
        highlight=False,
        markup=False,
    )
    try:
        results = run_search(knob_plan, device_type=device, world_size=world, db_url=db, progress=progress)
    except (RankFailed, StoreError) as exc:
        raise _fail(f"knob search stopped: {exc}") from None
    except KeyboardInterrupt:  # the trials finished so far are in the studies
        raise _fail("knob search interrupted; the finished trials are stored in the studies", 130) from None
    if results is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports
        raise typer.Exit(0)
    from rich.table import Table

    t = Table(
        "tokens/rank",
        "default us",
        "best us",
        "gain",
        "best knobs",
        "trials",
        "pruned",
        "failed",
        title=f"{backend} knobs, {shape.name} {dtype} ep{world}",
    )
    for r in results:
        if r.skipped:
            t.add_row(str(r.tokens), "-", "-", "-", escape(r.skipped), "0", "0", "0")
            continue
        gain = f"{100 * r.gain:+.1f}%" if r.gain is not None else "-"
        fmt = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
        knobs = ", ".join(f"{k}={v}" for k, v in r.best_knobs.items() if r.default_knobs.get(k) != v) or "defaults"
        t.add_row(
            str(r.tokens),
            fmt(r.default_us),
            fmt(r.best_us),
            gain,
            escape(knobs),
            str(r.trials - r.repeats),
            str(r.pruned),
            str(r.failed),
        )
    out.print(t)
    if profile is None:
        return
    values = shape.at(world, dtype, routing)._asdict()
    found = {r.tokens: r.best_knobs for r in results if r.best_knobs}
    try:
        updated, notes = with_knobs_from_file(profile, values, backend, found)
    except ProfileError as exc:
        raise _fail(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise _fail(f"{profile}: not a readable profile ({exc})") from None
    for note in notes:
        out.print(f"  not written: {note}", highlight=False, markup=False)
    try:
        write_profile_to(updated, profile)
    except (ProfileError, OSError) as exc:
        raise _fail(f"cannot write the profile: {exc}") from None
    out.print(f"wrote the best knobs into {profile}", highlight=False, markup=False)


# --------------------------------------------------------------------------------- lookup


@app.command()
def lookup(
    ep_size: int = typer.Option(..., help="Expert-parallel group size (ranks)."),
    hidden: int = typer.Option(..., help="Hidden size H of the token rows."),
    topk: int = typer.Option(..., help="Experts per token."),
    experts: int = typer.Option(..., help="Number of routed experts E."),
    tokens: int | None = typer.Option(None, help="Tokens per rank of one step. Or use --phase / --workload."),
    phase: str | None = typer.Option(
        None,
        help="decode (with --max-batch) or prefill (with --max-tokens): the backend for an engine's whole life "
        "in that phase, e.g. one engine each in disaggregated serving.",
    ),
    max_batch: int | None = typer.Option(
        None,
        help="--phase decode: the engine's max batch per rank (vLLM max_num_seqs); tokens per rank are taken "
        "log-uniform over 1..N.",
    ),
    max_tokens: int | None = typer.Option(
        None, help="--phase prefill: tokens per rank per prefill step (vLLM max_num_batched_tokens, the chunk size)."
    ),
    workload: Path | None = typer.Option(
        None, help='Histogram of tokens per rank per step: JSON {"tokens": weight} or CSV lines tokens,weight.'
    ),
    dtype: str = typer.Option("bf16", help="Payload dtype."),
    routing: str = typer.Option("uniform", help="Routing the table was measured with."),
    profile: Path | None = typer.Option(None, help="Profile JSON [default: found by this machine's fingerprint]."),
    fingerprint: str | None = typer.Option(
        None, help="Hardware fingerprint [default: $A2A_TUNE_FINGERPRINT, else probed]."
    ),
    engine: str | None = typer.Option(
        None,
        help="Only backends this engine (vllm, sglang, trtllm) can be told [default: "
        "implied by --format vllm/sglang/trtllm, else any].",
    ),
    fmt: str = typer.Option(
        "name",
        "--format",
        help="name | vllm (--all2all-backend X) | sglang (--moe-a2a-backend X, with --deepep-mode M for DeepEP) | "
        "trtllm (TRTLLM_FORCE_COMM_METHOD=X) | env | json",
    ),
    max_workspace_mib: float | None = typer.Option(
        None,
        "--max-workspace-mib",
        min=0,
        help="Skip backends holding more device memory per rank than this many MiB (the table's workspace_mib; "
        "memory not in the table: kept) [default: $A2A_TUNE_MAX_WORKSPACE_MIB, else no budget].",
    ),
) -> None:
    """Print the backend the table picks for this shape and load (fallback: allgather_reducescatter).

    With --format vllm / sglang / trtllm: what to add to that engine's launch, for the fastest backend the engine can run (one it has no name for is left out). A missing or broken table or workload file is not an error: it prints the engine's default (for TensorRT-LLM nothing, so it keeps its own choice) and one warning, so `vllm serve ... $(a2a-tune lookup ... --format vllm)` and `env $(a2a-tune lookup ... --format trtllm) trtllm-serve ...` always start.
    """
    import logging

    from .runtime import engines
    from .runtime import lookup as lk
    from .runtime.text import one_line

    logging.basicConfig(format="%(message)s", level=logging.WARNING, stream=sys.stderr)
    if fmt not in ("name", *engines.ENGINES, "env", "json"):
        raise _fail(f"--format must be name, {', '.join(engines.ENGINES)}, env or json, got {fmt!r}", 2)
    # Two options give lookup's max_tokens; when both are given, the one that goes with no
    # phase asked is the one refused.
    sizes = [(opt, v) for opt, v in (("--max-batch", max_batch), ("--max-tokens", max_tokens)) if v is not None]
    size_opt, size = min(sizes, key=lambda s: s[0] == lk.SIZE_OPTION.get(phase), default=(None, None))
    try:
        req = lk.request(
            ep_size=ep_size,
            hidden=hidden,
            topk=topk,
            num_experts=experts,
            tokens=tokens,
            phase=phase,
            max_tokens=size,
            workload=workload,
            dtype=dtype,
            routing=routing,
            fingerprint=fingerprint,
            profile=profile,
            engine=engine,
            max_workspace_mib=max_workspace_mib,
            options={"max_tokens": size_opt},
        )
    except lk.RequestError as exc:
        raise _fail(str(exc), 2) from None

    def ask(for_engine, quiet=False):
        return lk.answer(req._replace(engine=for_engine), quiet=quiet)

    choice = ask(fmt if fmt in engines.ENGINES else engine)
    if fmt == "json":
        print(json.dumps(choice.to_dict(), indent=2))
    elif fmt in engines.ENGINES:
        flag = engines.engine_flag(fmt, *choice.engine_args(fmt))
        if flag:  # TensorRT-LLM without a method: nothing, it keeps its own choice
            print(flag)
    elif fmt == "env":
        # Each engine gets the fastest backend it can be told (asked separately; an engine
        # that can be told none of the table's backends keeps its default: not worth a warning).
        vllm, sglang, trtllm = (ask(e, quiet=True).engine_args(e) for e in ("vllm", "sglang", "trtllm"))
        backend = one_line(choice.backend)  # a name from the table: one line in the shell too
        for line in engines.env_lines(backend, vllm[0], sglang[0], choice.match, trtllm[0], sglang[1]):
            print(line)
    else:
        print(one_line(choice.backend))
    if choice.match != "fallback":  # a fallback already warned once with the reason
        err.print(f"{choice.match}: {choice.reason}", style="dim", highlight=False, markup=False, soft_wrap=True)


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


def _help(*paragraphs: str) -> str:
    """A command's --help: paragraphs separated by blank lines (the renderer keeps single
    line breaks inside later paragraphs, so each paragraph is one string)."""
    return "\n\n".join(paragraphs)


def _view_fail(exc: Exception) -> typer.Exit:
    """Exit 2 with the one-line message (`_fail` escapes it: paths and reasons may hold "[...]")."""
    return _fail(str(exc), 2)


def _load_view(profile: Path | None, db: str | None, run_id: int | None):
    from .views.load import load_view
    from .views.model import ViewError

    try:
        return load_view(profile=profile, db=db, run=run_id)
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
def show(
    profile: Path | None = _profile_in_opt,
    db: str | None = _db_in_opt,
    run: int | None = _run_in_opt,
    as_json: bool = typer.Option(False, "--json", help="Print the same content as JSON."),
) -> None:
    from .views.show import render_show, show_data

    view = _load_view(profile, db, run)
    engines = _engine_scores_of(profile)
    if as_json:
        data = show_data(view)
        if engines is not None:
            from .policies import scores_data

            data["engines"] = scores_data(engines)
        print(json.dumps(data, indent=2, default=str))
    else:
        render_show(view, out)
        if engines is not None:
            from .policies import render_scores

            render_scores(engines, out, f"{profile.name}, its measured points")


def _engine_scores_of(profile: Path | None):
    """Each engine's own rule vs the table on the table's points (a profile only: a run is
    no table; `a2a-tune evaluate --profile T --run N` scores a table on it)."""
    if profile is None:
        return None
    from .policies import score_table

    return score_table(str(profile))


@app.command(
    help=_help(
        "Compare A (baseline) with B (candidate): where the winner changed and which backends got slower beyond noise.",
        "Inputs: two profiles (diff old.json new.json), two SQLite databases (their latest completed runs), "
        "two runs of one database (diff --db URL --run 3 --run 5), or a run and a profile "
        "(diff --db URL --run 3 new.json).",
        "Slower beyond noise: at the same shape and tokens per rank, B's p10 is above A's p90; the ratio of the "
        "medians is reported. A backend that ran cleanly in A and fails in B counts as a regression. A winner "
        "change is 'within noise' when B's spreads of the old and the new winner overlap; those never fail "
        "the command.",
        "Exit code: 0 when nothing that --fail-on names happened; 1 on regressions (and on clear winner changes "
        "with --fail-on winner-change); 2 on bad input, a table the lookup refuses included. In a cluster's CI: "
        "a2a-tune diff last-month.json this-month.json --fail-on regressions",
    )
)
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
        0.0,
        "--tolerance",
        min=0.0,
        help="A slowdown must also exceed this fraction of A's median (0.05 = 5%) to count.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
) -> None:
    from .views.diff import diff_views, render_diff
    from .views.load import load_run_view, load_source
    from .views.model import ViewError

    modes = set(fail_on) or {"regressions"}
    bad = modes - {"regressions", "winner-change", "none"}
    if bad:
        raise _fail(f"--fail-on must be regressions, winner-change or none, got {', '.join(sorted(bad))}", 2)
    if "none" in modes:
        modes = set()
    sources = list(sources or [])
    if runs and db is None and not os.environ.get("A2A_TUNE_DB"):
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
        data["failing"] = res.failing(modes)
        print(json.dumps(data, indent=2, default=str))
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
        "Files: OUT/<fingerprint>.<shape>.png, one path printed per line. Needs matplotlib "
        "(pip install 'a2a-tune[plot]').",
    )
)
def plot(
    profile: Path | None = _profile_in_opt,
    db: str | None = _db_in_opt,
    run: int | None = _run_in_opt,
    out_dir: Path = typer.Option(Path("."), "--out", help="Directory for the PNG files (created if needed)."),
    link_gbs: float | None = _link_opt,
) -> None:
    from .views.model import ViewError
    from .views.plot import plot_view

    view = _load_view(profile, db, run)
    try:
        paths = plot_view(view, out_dir, link_gbs=link_gbs)
    except ViewError as exc:
        raise _view_fail(exc) from None
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
        None, "--out", help="HTML file to write (default: a2a-tune-report.<fingerprint>.html in the current directory)."
    ),
    link_gbs: float | None = _link_opt,
) -> None:
    from .views.model import ViewError
    from .views.report import write_report

    view = _load_view(profile, db, run)
    path = out_file or Path(f"a2a-tune-report.{view.fingerprint or 'unknown'}.html")
    try:
        write_report(view, path, link_gbs=link_gbs)
    except ViewError as exc:
        raise _view_fail(exc) from None
    from .views.plot import plots_unavailable

    missing = plots_unavailable() if view.shapes else None  # the report says so too; say it here
    note = f"; without plots: {missing}" if missing else ", plots embedded" if view.shapes else ""
    out.print(f"wrote {path} ({len(view.shapes)} shape(s){note})", highlight=False, markup=False, soft_wrap=True)


# ------------------------------------------------------------------------------- listings


@app.command()
def backends(
    device: str = typer.Option("auto", help="Judge availability for cuda or cpu ranks."),
    world: int | None = typer.Option(None, help="Ranks [default: every GPU; 2 on cpu]."),
) -> None:
    """List the registered backends, their engine names, and whether they can run here."""
    from rich.measure import Measurement
    from rich.table import Column, Table

    from a2a_tune.kernels import BackendEnv, get_backend, list_backends

    device, gpus = _planned(_plans().resolve_device, device, gpu_ranks=1)  # one GPU: its reasons, true for it
    world = world or (gpus if device == "cuda" else 2)
    env = BackendEnv.local(world, device)
    rows = []
    for name in list_backends():
        cls = get_backend(name)
        ok, reason = cls.availability(env)
        vllm = cls.vllm_name or (f"- (closest: {cls.vllm_closest})" if cls.vllm_closest else "-")
        here = "[green]available[/]" if ok else f"[yellow]{escape(reason)}[/]"
        rows.append((escape(name), escape(vllm), escape(cls.sglang_name or "-"), cls.reach, here))

    def table(title: str, columns: list[int]) -> Table:
        # Names are never cut: their columns do not wrap; only the notes in "here" do.
        heads = [Column("backend", no_wrap=True), "vLLM", Column("SGLang", no_wrap=True), "reach", "here"]
        t = Table(*[heads[c] for c in columns], title=title)
        for row in rows:
            t.add_row(*[row[c] for c in columns])
        return t

    title = f"backends for {world} {device} rank(s)"
    whole = table(title, [0, 1, 2, 3, 4])
    if Measurement.get(out, out.options.update_width(10_000), whole).maximum <= out.width:  # unwrapped
        out.print(whole)
    else:  # a narrow terminal: what runs here, then what the engines call each one
        out.print(table(title, [0, 3, 4]))
        out.print(table("the engines' names for them", [0, 1, 2]))


@app.command(
    help=_help(
        "Check backends against the invariant every backend must satisfy (the contract in kernels/base.py: "
        "y[t] = sum_j w[t,j] f(e_j, x[t]) after dispatch -> expert compute -> combine), over the standard cases: "
        "ranks with "
        "different loads, a rank with no tokens under skewed routing, tokens whose experts are all local, "
        "repeated calls on one instance, block-FP8 payloads where supported, and CUDA-graph replays where the "
        "backend is capturable; for each model shape. Nothing is timed or stored.",
        "Each backend runs in its own launch of ranks (gloo on cpu, NCCL on cuda) with a watchdog: a case that "
        "makes no progress for --timeout seconds FAILs as hung and the next backend runs.",
        "An out-of-tree backend: name its module in A2A_TUNE_BACKEND_MODULES (comma-separated, importable in "
        "every rank) and run `a2a-tune check --backend NAME --device cpu` (if it runs on gloo) or on GPUs. "
        "Each module may take A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S seconds to import (default 60).",
        "--virtual: the --world ranks are virtual ranks of one device in one process, each a region of one "
        "allocation, run phase by phase (every rank's send, then every rank's wait): on a machine with fewer GPUs "
        "than ranks (--device cuda), or on CPU under Triton's interpreter (--device cpu). For backends that reach "
        "their peers only through memory they map (ours, and out-of-tree ones on their kernel-module host API); "
        "it checks their device code at any EP size, not the link between GPUs.",
        "Exit status: 0 when every case passed or was skipped (with the reason), 1 when one FAILed, 2 on bad options.",
    )
)
def check(
    backend: list[str] = typer.Option(
        [],
        "--backend",
        help="Backend to check, repeatable [default: every registered one; those unavailable here are skipped]. "
        "A backend named here that cannot run here FAILs.",
    ),
    device: str = _device_opt,
    world: int | None = _world_opt,
    preset: list[str] = _preset_opt,
    model_config: list[Path] = _config_opt,
    timeout: float = typer.Option(
        300.0, min=1, help="Seconds one case may make no progress before its ranks are stopped and it FAILs."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the rows to FILE (JSON)."),
    progress: bool = _progress_opt,
    virtual: bool = typer.Option(
        False, "--virtual", help="Run the --world ranks as virtual ranks of one device, in one process (see above)."
    ),
    token_scale: float | None = typer.Option(
        None,
        min=0.0001,
        max=1.0,
        help="Every case's token counts times this [default: 1; 1/64 with --device cpu --virtual, where the "
        "interpreter runs each program in Python].",
    ),
) -> None:
    from a2a_tune.kernels import list_backends

    from .check import INTERPRETER_TOKEN_SCALE, render
    from .check import check as run_check
    from .progress import progress_bar

    plans = _plans()
    _planned(plans.check_backends, backend)
    if virtual:
        device, world = _planned(plans.resolve_virtual, device, world)
    else:
        device, world = _planned(plans.resolve_ranks, device, world, virtual_hint=True, note=_note)
    if token_scale is None:
        token_scale = INTERPRETER_TOKEN_SCALE if virtual and device == "cpu" else 1.0
    shapes = _planned(plans.model_shapes, preset, model_config)
    names = list(dict.fromkeys(backend)) or list_backends()
    speaks = int(os.environ.get("RANK", "0")) == 0  # under torchrun/srun: rank 0 reports
    with progress_bar(progress and speaks, "check") as bar:
        task = bar.add_task("", total=len(names)) if bar else None
        rows = run_check(
            names,
            shapes,
            device_type=device,
            world_size=world,
            required=bool(backend),
            timeout=timeout,
            on_backend=(lambda name, _rows: bar.update(task, advance=1, description=name)) if bar else None,
            virtual=virtual,
            token_scale=token_scale,
        )
    if not speaks:
        raise typer.Exit(0)
    where = f"{world} virtual ranks of one {device} device" if virtual else f"{world} {device} rank(s)"
    title = f"each case ran on {where} (one process)" if virtual else None
    (out if out.is_terminal else Console(width=160)).print(render(rows, title))  # a log keeps its lines whole
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "FAIL", "skip")}
    scaled = f", token counts x {token_scale:g}" if token_scale != 1 else ""
    out.print(
        f"{counts['ok']} ok, {counts['FAIL']} FAIL, {counts['skip']} skipped: {len(names)} backend(s) on {where}, "
        f"{len(shapes)} shape(s){scaled}",
        highlight=False,
    )
    if json_out is not None:
        from dataclasses import asdict

        json_out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    raise typer.Exit(1 if counts["FAIL"] else 0)


@app.command()
def presets() -> None:
    """List the model shape presets."""
    from .shapes import presets as all_presets

    for p in all_presets().values():
        out.print(f"{p.name:<18} experts {p.num_experts:>4}  top-k {p.topk}  hidden {p.hidden}", highlight=False)


@db_app.command("upgrade")
def db_upgrade(db: str | None = _db_opt) -> None:
    """Migrate a database made by an older a2a-tune to the current schema."""
    from a2a_tune.db import EmptyStoreError, StoreError, display_url, resolve_url, upgrade

    try:
        before, after = upgrade(db)
    except EmptyStoreError as exc:  # no such file: upgrading nothing is a mistake (a typo in --db?)
        raise _fail(str(exc), 2) from None
    except StoreError as exc:
        raise _fail(str(exc)) from None
    shown = display_url(resolve_url(db))
    if before == after:
        out.print(f"{shown} is at the current schema ({after})", highlight=False, markup=False)
    else:
        out.print(f"{shown} upgraded from {before or 'an empty database'} to {after}", highlight=False, markup=False)


def main() -> None:
    try:
        app()
    except Exception as exc:
        # e.g. an out-of-tree backend module that does not import. Looked up, not imported:
        # importing a2a_tune.kernels costs torch (seconds, hundreds of MB), and a command that
        # never imported it (probe, lookup, show) cannot have raised its errors.
        errors = sys.modules.get("a2a_tune.kernels.errors")
        if errors is None or not isinstance(exc, errors.KernelsError):
            raise
        _fail(str(exc), 2)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
