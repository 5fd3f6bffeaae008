"""evaluate and tune-knobs: judge a table against fresh measurements, and search a backend's knobs."""

from __future__ import annotations

from pathlib import Path

import typer

from . import options as opt
from .common import _fail, _note, _planned, _plans, _store_url, app, command_began, emit_json, err, json_output, out

# ------------------------------------------------------------------------------- evaluate


@app.command()
@json_output(lambda o: o.get("as_json"))
def evaluate(
    profile: Path = typer.Option(..., help="The table to judge (a profile JSON)."),
    device: str = opt.device,
    world: int | None = opt.world,
    db: str | None = opt.db,
    tokens: str | None = typer.Option(
        None, help="Held-out tokens per rank [default: up to 8 midpoints between the table's, spread over its range]."
    ),
    warmup: int | None = opt.warmup,
    iters: int | None = opt.iters,
    progress: bool = opt.progress,
    case_timeout: float = opt.timeout,
    backend: list[str] = opt.backend,
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
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON on standard output."),
) -> None:
    """Measure held-out token counts for the table's shapes and report its regret vs the best backend.

    Beside the table: always allgather_reducescatter, always the best single backend, and each engine's own rule (vLLM's default and its proposed GB200/GB300 one-sided default, TensorRT-LLM's priority list on this machine, SGLang's default) against the table's answer for that engine, with the table's speedup over it.
    """
    from a2a_tune.db import StoreError, open_store

    from ..evaluate import EvaluationError, held_out_plan, left_out_note, sizes_measurable, table_measurements
    from ..evaluate import evaluate as run_evaluation
    from ..launch import SIGNAL_EXIT, RankFailed
    from ..runtime.lookup import ProfileError, load_profile
    from ..sweep import sweep as run_sweep

    _planned(_plans().check_seconds, case_timeout, "--case-timeout")
    try:
        table = load_profile(profile)
    except ProfileError as exc:
        raise _fail(str(exc), 2) from None
    if table_points and scored_run is not None:
        raise _fail("give --run or --table-points, not both", 2)
    if table_points:
        _print_evaluation(
            run_evaluation(table_measurements(str(profile)), str(profile)), f"{profile.name}: its own points", as_json
        )
        return
    if scored_run is not None:
        try:
            with open_store(db, readonly=True) as store:
                store.get_run(scored_run)
                measured, failed = store.measurements(scored_run), store.failures(scored_run)
        except StoreError as exc:
            raise _fail(f"run {scored_run} could not be read: {exc}", 2) from None
        _print_evaluation(run_evaluation(measured, str(profile), failed), f"run {scored_run} (stored)", as_json)
        return
    db = _store_url(db)  # checked once, here: the sweep takes it as it is
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
    _, left_out = sizes_measurable(table, world)
    if left_out:  # said before the sweep and with the scores: never a silent subset
        (err if as_json else out).print(left_out_note(left_out, world), highlight=False)
    (err if as_json else out).print(
        f"evaluating {profile.name} at {len(plan.tokens)} held-out token counts x {len(plan.shapes)} shape(s)",
        highlight=False,
    )
    try:
        outcome = run_sweep(
            plan,
            device_type=device,
            world_size=world,
            db_url=db,
            progress=progress,
            case_timeout=case_timeout,
            launched_at=command_began(),
        )
    except (RankFailed, StoreError) as exc:
        raise _fail(f"evaluation stopped: {exc}") from None
    except KeyboardInterrupt as exc:
        by = getattr(exc, "signal_name", "SIGINT")
        raise _fail(f"evaluation interrupted ({by}); its run is kept", SIGNAL_EXIT.get(by, 130)) from None
    with open_store(db) as store:
        ev = run_evaluation(store.measurements(outcome.run_id), str(profile), store.failures(outcome.run_id))
    if left_out:
        ev.notes.append(left_out_note(left_out, world))
    _print_evaluation(ev, f"run {outcome.run_id}", as_json)


def _print_evaluation(ev, title: str, as_json: bool = False) -> None:
    from rich.table import Column, Table
    from rich.text import Text

    from ..console import indented, print_fitted
    from ..runtime.point import shape_label

    if not ev.points:
        raise _fail(f"{title}: no measured point of a shape the table has ({ev.outside} of other shapes)", 1)
    if as_json:
        from ..policies import scores_data

        data = {
            "scored": title,
            "points": len(ev.points),
            "policies": ev.policies,
            "failed": ev.failed,
            "unscored": ev.unscored,
            "outside": ev.outside,
            "notes": ev.notes,
            "engines": scores_data(ev.engines),
            "worst": ev.worst(5),
        }
        emit_json(data)
        return
    t = Table(
        Column("policy", no_wrap=True),
        Column("mean regret", justify="right", no_wrap=True),
        Column("worst regret", justify="right", no_wrap=True),
        Column("points", justify="right", no_wrap=True),
        title=f"{title}: regret vs the best backend",
    )
    for policy, r in sorted(ev.policies.items(), key=lambda kv: kv[1]["mean"]):
        t.add_row(Text(policy), f"{100 * r['mean']:.1f}%", f"{100 * r['worst']:.1f}%", str(r["points"]))
    out.print(t)
    for policy, n in sorted(ev.failed.items()):
        out.print(
            indented(
                f"{policy}: its backend FAILED at {n} of {len(ev.points)} point(s) (error, timeout or wrong result)", 0
            )
        )
    for policy, n in sorted(ev.unscored.items()):
        out.print(
            indented(f"{policy}: {n} of {len(ev.points)} point(s) not scored (its backend was not measured there)", 0)
        )
    if ev.outside:
        out.print(indented(f"{ev.outside} measured point(s) of shapes the table has no entry for: not scored", 0))
    for note in ev.notes:
        out.print(indented(note, 0))
    if ev.engines:
        from ..policies import render_scores

        render_scores(ev.engines, out, title)
    worst = ev.worst(5)
    if worst:  # where the table is weakest: what to re-measure or add to the grid
        columns = [
            Column("shape"),  # wraps between its parts
            Column("tokens", justify="right", no_wrap=True),
            Column("regret", justify="right", no_wrap=True),
            Column("table's pick", no_wrap=True),
            Column("fastest", no_wrap=True),
        ]
        rows = []
        for pt in worst:
            ep, hidden, topk, experts, dtype, routing = pt["shape"]
            shape = shape_label(experts, topk, hidden, dtype, routing, ep)
            rows.append(
                (shape, str(pt["tokens"]), f"{100 * pt['table']:.1f}%", Text(pt["table_backend"]), Text(pt["best"]))
            )
        print_fitted(
            out, columns, rows, key=2, stack=(4, 0), title="worst points", stacked_title="worst points: the fastest"
        )


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
    device: str = opt.device,
    world: int | None = opt.world,
    db: str | None = opt.db,
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
    progress: bool = opt.progress,
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

    from ..knobs import DEFAULT_ITERS, KnobPlan
    from ..knobs import tune_knobs as run_search
    from ..launch import SIGNAL_EXIT, RankFailed
    from ..runtime.lookup import ProfileError, load_profile
    from ..select import write_knobs_into

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
    if profile is not None:  # checked before the search (hours on GPUs), read as the lookup reads it
        try:
            table_capacity = load_profile(profile).capacity
        except ProfileError as exc:
            raise _fail(f"--profile {exc}", 2) from None
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
        soft_wrap=True,  # one line in a captured log, whatever the width
    )
    try:
        results = run_search(knob_plan, device_type=device, world_size=world, db_url=url, progress=progress)
    except (RankFailed, StoreError) as exc:
        raise _fail(f"knob search stopped: {exc}") from None
    except KeyboardInterrupt as exc:  # the trials finished so far are in the studies
        by = getattr(exc, "signal_name", "SIGINT")
        raise _fail(
            f"knob search interrupted ({by}); the finished trials are stored in the studies", SIGNAL_EXIT.get(by, 130)
        ) from None
    if results is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports
        raise typer.Exit(0)
    from rich.table import Column
    from rich.text import Text

    from ..console import print_fitted

    columns = [
        Column("tokens/rank", justify="right", no_wrap=True),
        Column("default us", justify="right", no_wrap=True),
        Column("best us", justify="right", no_wrap=True),
        Column("gain", justify="right", no_wrap=True),
        Column("best knobs"),  # wraps at its spaces
        Column("trials", justify="right", no_wrap=True),
        Column("pruned", justify="right", no_wrap=True),
        Column("failed", justify="right", no_wrap=True),
    ]
    rows = []
    for r in results:
        if r.skipped:
            rows.append((str(r.tokens), "-", "-", "-", Text(r.skipped), "0", "0", "0"))
            continue
        gain = f"{100 * r.gain:+.1f}%" if r.gain is not None else "-"
        fmt = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
        knobs = ", ".join(f"{k}={v}" for k, v in r.best_knobs.items() if r.default_knobs.get(k) != v) or "defaults"
        rows.append(
            (
                str(r.tokens),
                fmt(r.default_us),
                fmt(r.best_us),
                gain,
                Text(knobs),
                str(r.trials - r.repeats),
                str(r.pruned),
                str(r.failed),
            )
        )
    print_fitted(
        out,
        columns,
        rows,
        stack=(7, 6, 5),
        title=f"{backend} knobs, {shape.name} {dtype} ep{world}",
        stacked_title="trials per token count",
    )
    if profile is None:
        return
    values = shape.at(world, dtype, routing)._asdict()
    found = {r.tokens: r.best_knobs for r in results if r.best_knobs}
    try:  # read, add and write under the table's lock: a `select` or `run` at once loses nothing
        notes = write_knobs_into(profile, values, backend, found)
    except ProfileError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot write the profile: {exc}") from None
    for note in notes:
        out.print(f"  not written: {note}", highlight=False, markup=False)
    out.print(f"wrote the best knobs into {profile}", highlight=False, markup=False)
