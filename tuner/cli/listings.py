"""backends, check, presets: what this machine can run, whether it is right, and the model shapes."""

from __future__ import annotations

from pathlib import Path

import typer

from . import options as opt
from .common import _help, _note, _planned, _plans, app, emit_json, err, json_output, out

# ------------------------------------------------------------------------------- listings


@app.command()
@json_output(lambda o: o.get("as_json"))
def backends(
    device: str = typer.Option("auto", help="Judge availability for cuda or cpu ranks."),
    world: int | None = typer.Option(None, help="Ranks [default: every GPU; 2 on cpu]."),
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List the registered backends, their engine names, and whether they can run here."""
    from rich.table import Column
    from rich.text import Text

    from a2a_tune.kernels import PAYLOADS, BackendEnv, availability_of, engine_names, get_backend
    from a2a_tune.tuner.runtime.engines import ENGINES, NAMES

    from ..console import print_fitted

    device, gpus = _planned(_plans().resolve_device, device, gpu_ranks=1)  # one GPU: its reasons, true for it
    world = world or (gpus if device == "cuda" else 2)
    env = BackendEnv.local(world, device)
    listed = []
    for name, names in engine_names().items():
        cls = get_backend(name)
        ok, reason = availability_of(cls, env)
        missing = [d for d in PAYLOADS if d not in cls.payloads]
        listed.append(
            {"backend": name, **names, "reach": cls.reach, "payloads": sorted(cls.payloads)}
            | {"does_not_carry": missing, "available": ok, "reason": None if ok else reason}
        )
    from a2a_tune.tuner.runtime import engine_rules

    literals = {e: {b["engines"].get(e) for b in listed} - {None} for e in ENGINES}
    rules = [
        r for r in engine_rules.describe(set().union(*literals.values())) if set(r["backends"]) & literals[r["engine"]]
    ]
    if as_json:
        emit_json({"device": device, "world_size": world, "backends": listed, "engine_rules": rules})
        return

    def literal(b: dict, engine: str) -> Text:
        closest = b["closest"].get(engine)
        return Text(b["engines"].get(engine) or (f"- (closest: {closest})" if closest else "-"))

    rows = [
        (
            Text(b["backend"]),  # Text: a name is never markup
            Text(b["reach"]),
            Text("available", style="green") if b["available"] else Text(b["reason"], style="yellow"),
            *(literal(b, engine) for engine in ENGINES),
            Text("all" if not b["does_not_carry"] else "does not carry " + ", ".join(b["does_not_carry"])),
        )
        for b in listed
    ]
    columns = [
        Column("backend", no_wrap=True),
        Column("reach", no_wrap=True),
        Column("here"),  # the reason wraps at spaces
        *(Column(NAMES[engine], no_wrap=engine != "vllm") for engine in ENGINES),
        Column("payloads"),
    ]
    # Narrow: what runs here, then what the engines call each one and what it carries.
    print_fitted(
        out,
        columns,
        rows,
        stack=(6, 5, 4, 3),
        title=f"backends for {world} {device} rank(s)",
        stacked_title="the engines' names for them, and the payloads they carry",
    )
    # What each engine can start with: lookup and the vLLM plugin never answer a refused one.
    out.print("\nWhat each engine can start with (engine_rules; lookup --lora/--platform/... apply them):")
    for r in rules:
        out.print(f"  {engine_rules.describe_line(r)}", highlight=False, markup=False)


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
@json_output(lambda o: o.get("as_json"))
def check(
    backend: list[str] = typer.Option(
        [],
        "--backend",
        help="Backend to check, repeatable [default: every registered one; those unavailable here are skipped]. "
        "A backend named here that cannot run here FAILs.",
    ),
    device: str = opt.device,
    world: int | None = opt.world,
    preset: list[str] = opt.preset,
    model_config: list[Path] = opt.model_config,
    timeout: float = typer.Option(
        300.0, min=1, help="Seconds one case may make no progress before its ranks are stopped and it FAILs."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the rows and the counts as JSON on standard output (the table goes to stderr)."
    ),
    progress: bool = opt.progress,
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

    from ..check import INTERPRETER_TOKEN_SCALE, render
    from ..check import check as run_check
    from ..launch import is_rank_zero
    from ..progress import progress_bar

    plans = _plans()
    _planned(plans.check_seconds, timeout, "--timeout")
    if token_scale is not None:
        _planned(plans.check_fraction, token_scale, "--token-scale")
    _planned(plans.check_backends, backend)
    if virtual:
        device, world = _planned(plans.resolve_virtual, device, world)
    else:
        device, world = _planned(plans.resolve_ranks, device, world, virtual_hint=True, note=_note)
    if token_scale is None:
        token_scale = INTERPRETER_TOKEN_SCALE if virtual and device == "cpu" else 1.0
    shapes = _planned(plans.model_shapes, preset, model_config)
    names = list(dict.fromkeys(backend)) or list_backends()
    speaks = is_rank_zero()  # under torchrun/srun: rank 0 reports
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
    human = err if as_json else out  # --json: standard output carries the JSON alone
    render(rows, human, title)  # fits the terminal, or COLUMNS (80 in a log)
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "FAIL", "skip")}
    scaled = f", token counts x {token_scale:g}" if token_scale != 1 else ""
    human.print(
        f"{counts['ok']} ok, {counts['FAIL']} FAIL, {counts['skip']} skipped: {len(names)} backend(s) on {where}, "
        f"{len(shapes)} shape(s){scaled}",
        highlight=False,
    )
    if as_json:
        from dataclasses import asdict

        data = {"device": device, "world_size": world, "virtual": virtual, "token_scale": token_scale}
        emit_json({**data, **counts, "rows": [asdict(r) for r in rows]})
    raise typer.Exit(1 if counts["FAIL"] else 0)


@app.command()
@json_output(lambda o: o.get("as_json"))
def presets(as_json: bool = typer.Option(False, "--json", help="Print the presets as JSON.")) -> None:
    """List the model shape presets."""
    from ..shapes import presets as all_presets

    if as_json:
        shapes = [
            {
                "name": p.name,
                "num_experts": p.num_experts,
                "topk": p.topk,
                "hidden": p.hidden,
                "moe_layers": p.moe_layers,
            }
            for p in all_presets().values()
        ]
        emit_json({"presets": shapes})
        return
    for p in all_presets().values():
        layers = f"{p.moe_layers:>3}" if p.moe_layers is not None else "  -"
        out.print(
            f"{p.name:<18} experts {p.num_experts:>4}  top-k {p.topk:>2}  hidden {p.hidden:>4}  MoE layers {layers}",
            highlight=False,
        )
