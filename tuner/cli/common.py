"""What every command shares: the Typer app, the two consoles, one-line errors and the options
several commands take."""

from __future__ import annotations

import sys

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


# The commands that start ranks: the variables the ranks read are checked before any starts.
RANK_COMMANDS = frozenset({"sweep", "run", "check", "evaluate", "tune-knobs"})


@app.callback()
def _options(
    ctx: typer.Context,
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Options before the command."""
    if ctx.invoked_subcommand in RANK_COMMANDS:
        from a2a_tune.kernels.errors import KernelsError
        from a2a_tune.kernels.registry import call_timeout, import_timeout
        from a2a_tune.tuner.runtime.environ import EnvError

        from ..launch import collective_timeout, rendezvous_timeout

        try:  # the variables the ranks read: one line naming the variable, before any rank starts
            for read in (collective_timeout, rendezvous_timeout, import_timeout, call_timeout):
                read()
        except (EnvError, KernelsError) as exc:
            raise _fail(str(exc), 2) from None


out = Console()
err = Console(stderr=True)
# One-line messages print with soft_wrap=True: rich never breaks them (a terminal wraps them,
# a captured log keeps each whole); tables and views fit the width by their own rules.

DB_HELP = "SQLAlchemy URL or SQLite file path [env: A2A_TUNE_DB; default: sqlite:///a2a_tune.db]."


def _fail(message: str, code: int = 1) -> typer.Exit:
    # messages quote user input and file names: never rich markup; URLs never show a password
    if "://" in message or "=" in message:  # a URL, or a connection string's password=...
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


def _planned(step, *args, **kwargs):
    """`step` of tuner.plans (options -> plan); its PlanError is a one-line error, exit code 2."""
    from ..plans import PlanError

    try:
        return step(*args, **kwargs)
    except PlanError as exc:
        raise _fail(str(exc), 2) from None


def _plans():
    from .. import plans

    return plans


def _note(line: str) -> None:
    """A note the plan's rules say on the way (one line on stderr; not an error)."""
    err.print(line, highlight=False, markup=False)


_device_opt = typer.Option(
    "auto",
    help="cuda: one rank per GPU (NCCL); cpu: CPU ranks over gloo (on a GPU host: a rehearsal, not its table); "
    "auto: cuda if >= 2 GPUs, or a GPU under torchrun/srun.",
)
_world_opt = typer.Option(None, help="Ranks to spawn [default: every GPU; 2 on cpu]. Ignored under torchrun/srun.")
_preset_opt = typer.Option(
    [],
    "--preset",
    help="Model shape preset, repeatable [default: deepseek-v3, qwen3-235b-a22b, gpt-oss-120b, mixtral-8x7b]. "
    "`a2a-tune presets` lists all.",
)
_config_opt = typer.Option([], "--model-config", help="Hugging Face config.json of an MoE model, repeatable.")
_tokens_opt = typer.Option(
    None,
    help="Tokens per rank, comma-separated [default on cuda: 1..16384, powers of 2 and 3·2^k (28 counts); on cpu: 1,4,16,64,256].",
)
_dtype_opt = typer.Option(
    [],
    "--dtype",
    help="Payload dtype, repeatable: bf16, fp16, fp32; quantized in dispatch, as engines send them: fp8_e4m3 "
    "(block-FP8, fp32 scale per 128), mxfp8 (e4m3, E8M0 scale per 32), nvfp4 (e2m1 pairs, e4m3 scale per 16) "
    "[default: bf16].",
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
_ep_sizes_opt = typer.Option(
    None,
    "--ep-sizes",
    help="EP sizes to measure, comma-separated, each dividing the world: each on groups of consecutive ranks, "
    "every group at once, as a deployment's replicas run [default: powers of two from 2 up to the world, and "
    "the world].",
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


def _help(*paragraphs: str) -> str:
    """A command's --help: paragraphs separated by blank lines (the renderer keeps single
    line breaks inside later paragraphs, so each paragraph is one string)."""
    return "\n\n".join(paragraphs)


def main() -> None:
    try:
        app()
    except Exception as exc:
        # e.g. an out-of-tree backend module that does not import. Looked up, not imported:
        # importing a2a_tune.kernels costs torch (seconds, hundreds of MB), and a command that
        # never imported it (probe, lookup, show) cannot have raised its errors.
        errors = sys.modules.get("a2a_tune.kernels.errors")
        environ = sys.modules.get("a2a_tune.tuner.runtime.environ")  # a variable out of range, before any rank
        known = tuple(e for e in (errors and errors.KernelsError, environ and environ.EnvError) if e)
        if not isinstance(exc, known):
            raise
        _fail(str(exc), 2)
        raise SystemExit(2) from None
