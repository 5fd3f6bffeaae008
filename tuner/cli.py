"""`a2a-tune`: the command line. Heavy imports (torch, SQLAlchemy) happen inside the commands
that need them, so `a2a-tune lookup` stays as light as the runtime lookup itself."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

app = typer.Typer(
    help=(
        "Measure the MoE all2all backends on this machine and emit the table serving engines "
        "consult at start-up.\n\nThe flow: probe -> sweep -> select -> lookup. "
        "`a2a-tune run` does the first three with good defaults."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

out = Console()
err = Console(stderr=True)

DB_HELP = "SQLAlchemy URL or SQLite file path [env: A2A_TUNE_DB; default: sqlite:///a2a_tune.db]."


def _fail(message: str, code: int = 1) -> "typer.Exit":
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


# ---------------------------------------------------------------------------------- probe


@app.command()
def probe(
    as_json: bool = typer.Option(False, "--json", help="Print the full facts and the fingerprint as JSON."),
    record: Optional[Path] = typer.Option(None, help="Also save the raw NVML answers to FILE (a test fixture)."),
) -> None:
    """Detect GPUs, NVLink islands, fabric domains and degraded links; print the fingerprint."""
    from .probe import probe as run_probe, render_summary

    if record is not None:
        from .nvml import RealNvml, record as record_nvml

        try:
            record.write_text(json.dumps(record_nvml(RealNvml()), indent=2))
        except Exception as exc:  # no NVML here: nothing to record
            raise _fail(f"cannot record NVML answers: {exc}")
    topo = run_probe()
    if as_json:
        out.print_json(json.dumps(topo.to_dict()))
    else:
        out.print(render_summary(topo))


# ---------------------------------------------------------------------------------- sweep


def _parse_tokens(text: str) -> tuple[int, ...]:
    try:
        values = sorted({int(v) for v in text.replace(" ", "").split(",") if v})
    except ValueError:
        raise _fail(f"--tokens must be comma-separated integers, got {text!r}", 2) from None
    if not values or values[0] < 1:
        raise _fail(f"--tokens must be positive integers, got {text!r}", 2)
    return tuple(values)


def _resolve_device(device: str) -> tuple[str, int]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus >= 2 else "cpu"
    if device == "cuda" and gpus == 0:
        raise _fail("--device cuda: no CUDA GPU is visible (use --device cpu to sweep CPU ranks over gloo)", 2)
    if device not in ("cuda", "cpu"):
        raise _fail(f"--device must be auto, cuda or cpu, got {device!r}", 2)
    return device, gpus


def _build_plan(device, world, presets, model_configs, tokens, dtypes, routings, backends, warmup, iters):
    from a2a_tune.kernels import PAYLOAD_DTYPES, UnknownBackendError, get_backend
    from a2a_tune.kernels.reference import ROUTINGS

    from .launch import launched_externally
    from .shapes import ShapeSpecError, from_model_config, preset, presets as all_presets
    from .sweep import DEFAULT_ITERS, DEFAULT_TOKENS, SweepPlan

    device, gpus = _resolve_device(device)
    if launched_externally():
        world = int(os.environ["WORLD_SIZE"])
    elif world is None:
        world = gpus if device == "cuda" else 2
    if device == "cuda" and not launched_externally() and world > gpus:
        raise _fail(f"--world {world} needs {world} GPUs; {gpus} visible (several nodes: launch with torchrun/srun)", 2)
    if world < 2:
        raise _fail(f"--world must be at least 2 (all2all needs peers), got {world}", 2)
    try:
        shapes = [preset(p) for p in presets] + [from_model_config(p) for p in model_configs]
    except ShapeSpecError as exc:
        raise _fail(str(exc), 2) from None
    if not shapes:
        shapes = list(all_presets().values())
    for d in dtypes:
        if d not in PAYLOAD_DTYPES:
            raise _fail(f"unknown --dtype {d!r}; choose from {', '.join(PAYLOAD_DTYPES)}", 2)
    for r in routings:
        if r not in ROUTINGS:
            raise _fail(f"unknown --routing {r!r}; choose from {', '.join(ROUTINGS)}", 2)
    try:
        for b in backends:
            get_backend(b)
    except UnknownBackendError as exc:
        raise _fail(str(exc), 2) from None
    default_warmup, default_iters = DEFAULT_ITERS[device]
    plan = SweepPlan(
        shapes=tuple(shapes),
        tokens=_parse_tokens(tokens) if tokens else DEFAULT_TOKENS[device],
        dtypes=tuple(dtypes) or ("bf16",),
        routings=tuple(routings) or ("uniform",),
        backends=tuple(backends),
        warmup=default_warmup if warmup is None else warmup,
        iters=default_iters if iters is None else iters,
    )
    return plan, device, world


def _print_outcome(outcome, seconds: float) -> None:
    failed = ", ".join(f"{n} {kind}" for kind, n in sorted(outcome.failed.items()) if kind != "unavailable")
    out.print(
        f"run {outcome.run_id} ({outcome.status}) on {outcome.fingerprint}: {outcome.measured} measured, "
        f"{outcome.skipped} already stored" + (f", failed: {failed}" if failed else "") + f" ({seconds:.0f} s)",
        highlight=False,
        markup=False,
    )
    for name, reason in outcome.unavailable.items():
        out.print(f"  {name}: unavailable: {reason}", highlight=False, markup=False)


def _do_sweep(device, world, presets, model_configs, tokens, dtypes, routings, backends, warmup, iters, db, resume, progress):
    from a2a_tune.db import StoreError

    from .launch import RankFailed
    from .sweep import sweep as run_sweep

    plan, device, world = _build_plan(device, world, presets, model_configs, tokens, dtypes, routings, backends, warmup, iters)
    out.print(
        f"sweeping {len(plan.shapes)} shape(s) x {len(plan.tokens)} token counts x {len(plan.backend_names())} "
        f"backend(s) on {world} {device} rank(s)",
        highlight=False,
    )
    start = time.perf_counter()
    try:
        outcome = run_sweep(plan, device_type=device, world_size=world, db_url=db, resume=resume, progress=progress)
    except (RankFailed, StoreError) as exc:
        raise _fail(f"sweep stopped: {exc}") from None
    except KeyboardInterrupt:
        raise _fail("interrupted; what was measured is stored (rerun with --resume to continue)", 130) from None
    _print_outcome(outcome, time.perf_counter() - start)
    return outcome


_device_opt = typer.Option("auto", help="cuda: one rank per GPU (NCCL); cpu: CPU ranks over gloo; auto: cuda if >= 2 GPUs.")
_world_opt = typer.Option(None, help="Ranks to spawn [default: every GPU; 2 on cpu]. Ignored under torchrun/srun.")
_preset_opt = typer.Option([], "--preset", help="Model shape preset, repeatable [default: all]. See `a2a-tune presets`.")
_config_opt = typer.Option([], "--model-config", help="Hugging Face config.json of an MoE model, repeatable.")
_tokens_opt = typer.Option(None, help="Tokens per rank, comma-separated [default: 1..16384 powers of 2 on cuda; 1,4,16,64,256 on cpu].")
_dtype_opt = typer.Option([], "--dtype", help="Payload dtype, repeatable: bf16, fp16, fp32 [default: bf16].")
_routing_opt = typer.Option([], "--routing", help="Routing, repeatable: uniform, skewed, local [default: uniform].")
_backend_opt = typer.Option([], "--backend", help="Backend to sweep, repeatable [default: every registered one].")
_warmup_opt = typer.Option(None, help="Warm-up round trips per case [default: 10 cuda, 3 cpu].")
_iters_opt = typer.Option(None, help="Timed round trips per case [default: 50 cuda, 15 cpu].")
_db_opt = typer.Option(None, "--db", help=DB_HELP)
_resume_opt = typer.Option(False, help="Continue the latest unfinished run with the same plan; skip what it stored.")
_progress_opt = typer.Option(True, help="Show a progress bar.")


@app.command()
def sweep(
    device: str = _device_opt, world: Optional[int] = _world_opt, preset: List[str] = _preset_opt,
    model_config: List[Path] = _config_opt, tokens: Optional[str] = _tokens_opt, dtype: List[str] = _dtype_opt,
    routing: List[str] = _routing_opt, backend: List[str] = _backend_opt, warmup: Optional[int] = _warmup_opt,
    iters: Optional[int] = _iters_opt, db: Optional[str] = _db_opt, resume: bool = _resume_opt, progress: bool = _progress_opt,
) -> None:  # fmt: skip
    """Check, then time, every backend over shapes x token counts; store every measurement."""
    _do_sweep(device, world, preset, model_config, tokens, dtype, routing, backend, warmup, iters, db, resume, progress)


# --------------------------------------------------------------------------------- select


def _do_select(db: str | None, run_id: int | None, out_dir: Path | None) -> Path:
    from a2a_tune.db import NotFoundError, StoreError, open_store
    from a2a_tune.kernels import get_backend, list_backends

    from .lookup import ProfileError, user_profile_dir
    from .select import profile_from_store, write_profile

    names = {n: {"vllm_name": get_backend(n).vllm_name, "sglang_name": get_backend(n).sglang_name} for n in list_backends()}
    try:
        with open_store(db) as store:
            if run_id is None:
                run = store.latest_run(status="completed")
                if run is None:
                    raise _fail("no completed run in the database; run `a2a-tune sweep` first")
                run_id = run.id
            else:
                try:
                    store.get_run(run_id)
                except NotFoundError:
                    raise _fail(f"no run {run_id} in the database") from None
            profile = profile_from_store(store, run_id, backend_names=names)
    except (StoreError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if not profile["entries"]:
        raise _fail(f"run {run_id} has no measurements to select from")
    directory = out_dir or Path(os.environ.get("A2A_TUNE_PROFILE_DIR", "").split(os.pathsep)[0] or user_profile_dir())
    try:
        path = write_profile(profile, directory)
    except (ProfileError, OSError) as exc:
        raise _fail(f"cannot write the profile: {exc}") from None
    out.print(f"wrote {path} ({len(profile['entries'])} shape(s)) from run {run_id}", highlight=False, markup=False)
    return path


@app.command()
def select(
    db: Optional[str] = _db_opt,
    run: Optional[int] = typer.Option(None, help="Run id [default: the latest completed run]."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Directory [default: $A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles]."),
) -> None:
    """Turn a run's measurements into the selection table profiles/<fingerprint>.json."""
    _do_select(db, run, out_dir)


# ------------------------------------------------------------------------------------ run


@app.command()
def run(
    device: str = _device_opt, world: Optional[int] = _world_opt, preset: List[str] = _preset_opt,
    model_config: List[Path] = _config_opt, tokens: Optional[str] = _tokens_opt, dtype: List[str] = _dtype_opt,
    routing: List[str] = _routing_opt, backend: List[str] = _backend_opt, warmup: Optional[int] = _warmup_opt,
    iters: Optional[int] = _iters_opt, db: Optional[str] = _db_opt, resume: bool = _resume_opt, progress: bool = _progress_opt,
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Profile directory [default: $A2A_TUNE_PROFILE_DIR, else ~/.local/share/a2a-tune/profiles]."),
) -> None:  # fmt: skip
    """Probe + sweep + select: the one command to run once per machine type."""
    outcome = _do_sweep(device, world, preset, model_config, tokens, dtype, routing, backend, warmup, iters, db, resume, progress)
    if outcome is None or outcome.status != "completed":
        raise _fail("the sweep did not complete; no table written")
    path = _do_select(db, outcome.run_id, out_dir)
    out.print(
        f"look it up: a2a-tune lookup --ep-size {outcome.world_size} --hidden H --topk K --experts E --tokens T  (table: {path})",
        highlight=False, markup=False, soft_wrap=True,
    )  # fmt: skip


# --------------------------------------------------------------------------------- lookup


@app.command()
def lookup(
    ep_size: int = typer.Option(..., help="Expert-parallel group size (ranks)."),
    hidden: int = typer.Option(..., help="Hidden size H of the token rows."),
    topk: int = typer.Option(..., help="Experts per token."),
    experts: int = typer.Option(..., help="Number of routed experts E."),
    tokens: int = typer.Option(..., help="Tokens per rank per step."),
    dtype: str = typer.Option("bf16", help="Payload dtype."),
    routing: str = typer.Option("uniform", help="Routing the table was measured with."),
    profile: Optional[Path] = typer.Option(None, help="Profile JSON [default: found by this machine's fingerprint]."),
    fingerprint: Optional[str] = typer.Option(None, help="Hardware fingerprint [default: $A2A_TUNE_FINGERPRINT, else probed]."),
    fmt: str = typer.Option("name", "--format", help="name | vllm | sglang | json"),
) -> None:
    """Print the backend the table picks for this shape and load (fallback: allgather_reducescatter)."""
    import logging

    from .lookup import lookup as do_lookup

    logging.basicConfig(format="%(message)s", level=logging.WARNING, stream=sys.stderr)
    if fmt not in ("name", "vllm", "sglang", "json"):
        raise _fail(f"--format must be name, vllm, sglang or json, got {fmt!r}", 2)
    choice = do_lookup(
        ep_size=ep_size, hidden=hidden, topk=topk, num_experts=experts, tokens=tokens, dtype=dtype, routing=routing,
        fingerprint=fingerprint, profile=profile, engine=fmt if fmt in ("vllm", "sglang") else None,
    )  # fmt: skip
    if fmt == "json":
        print(json.dumps(choice.to_dict(), indent=2))
    elif fmt == "vllm":
        print(f"--all2all-backend {choice.vllm_name or 'allgather_reducescatter'}")
    elif fmt == "sglang":
        print(f"--moe-a2a-backend {choice.sglang_name or 'none'}")
    else:
        print(choice.backend)
    if choice.match != "fallback":  # a fallback already warned once with the reason
        err.print(f"{choice.match}: {choice.reason}", style="dim", highlight=False, markup=False, soft_wrap=True)


# ------------------------------------------------------------------------------- listings


@app.command()
def backends(
    device: str = typer.Option("auto", help="Judge availability for cuda or cpu ranks."),
    world: Optional[int] = typer.Option(None, help="Ranks [default: every GPU; 2 on cpu]."),
) -> None:
    """List the registered backends, their engine names, and whether they can run here."""
    from rich.table import Table

    from a2a_tune.kernels import BackendEnv, get_backend, list_backends

    device, gpus = _resolve_device(device)
    world = world or (gpus if device == "cuda" else 2)
    env = BackendEnv.local(world, device)
    table = Table("backend", "vLLM", "SGLang", "here", title=f"backends for {world} {device} rank(s)")
    for name in list_backends():
        cls = get_backend(name)
        ok, reason = cls.availability(env)
        table.add_row(name, cls.vllm_name or "-", cls.sglang_name or "-", "[green]available[/]" if ok else f"[yellow]{reason}[/]")
    out.print(table)


@app.command()
def presets() -> None:
    """List the model shape presets."""
    from .shapes import presets as all_presets

    for p in all_presets().values():
        out.print(f"{p.name:<18} experts {p.num_experts:>4}  top-k {p.topk}  hidden {p.hidden}", highlight=False)


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = _db_opt) -> None:
    """Migrate a database made by an older a2a-tune to the current schema."""
    from a2a_tune.db import StoreError, resolve_url, upgrade

    try:
        upgrade(db)
    except StoreError as exc:
        raise _fail(str(exc)) from None
    out.print(f"{resolve_url(db)} is at the current schema", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
