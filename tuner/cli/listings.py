"""backends, check, presets: what this machine can run, whether it is right, and the model shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from .common import (
    _config_opt,
    _device_opt,
    _help,
    _note,
    _planned,
    _plans,
    _preset_opt,
    _progress_opt,
    _world_opt,
    app,
    out,
)

# ------------------------------------------------------------------------------- listings


@app.command()
def backends(
    device: str = typer.Option("auto", help="Judge availability for cuda or cpu ranks."),
    world: int | None = typer.Option(None, help="Ranks [default: every GPU; 2 on cpu]."),
) -> None:
    """List the registered backends, their engine names, and whether they can run here."""
    from rich.measure import Measurement
    from rich.table import Column, Table

    from a2a_tune.kernels import BackendEnv, availability_of, get_backend, list_backends

    device, gpus = _planned(_plans().resolve_device, device, gpu_ranks=1)  # one GPU: its reasons, true for it
    world = world or (gpus if device == "cuda" else 2)
    env = BackendEnv.local(world, device)
    rows = []
    for name in list_backends():
        cls = get_backend(name)
        ok, reason = availability_of(cls, env)
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

    from ..check import INTERPRETER_TOKEN_SCALE, render
    from ..check import check as run_check
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
    from ..shapes import presets as all_presets

    for p in all_presets().values():
        out.print(f"{p.name:<18} experts {p.num_experts:>4}  top-k {p.topk}  hidden {p.hidden}", highlight=False)
