"""The options several commands share, one declaration each: a command's signature says
`warmup: int | None = opt.warmup` (`from . import options as opt`)."""

from __future__ import annotations

import typer

from .common import DB_HELP

device = typer.Option(
    "auto",
    help="cuda: one rank per GPU (NCCL); cpu: CPU ranks over gloo (on a GPU host: a rehearsal, not its table); "
    "auto: cuda if >= 2 GPUs, or a GPU under torchrun/srun.",
)
world = typer.Option(None, help="Ranks to spawn [default: every GPU; 2 on cpu]. Ignored under torchrun/srun.")
preset = typer.Option(
    [],
    "--preset",
    help="Model shape preset, repeatable [default: deepseek-v3, qwen3-235b-a22b, gpt-oss-120b, mixtral-8x7b]. "
    "`a2a-tune presets` lists all.",
)
model_config = typer.Option([], "--model-config", help="Hugging Face config.json of an MoE model, repeatable.")
tokens = typer.Option(
    None,
    help="Tokens per rank, comma-separated [default on cuda: 1..16384, powers of 2 and 3·2^k (28 counts); on cpu: 1,4,16,64,256].",
)
dtype = typer.Option(
    [],
    "--dtype",
    help="Payload dtype, repeatable: bf16, fp16, fp32; quantized in dispatch, as engines send them: fp8_e4m3 "
    "(block-FP8, fp32 scale per 128), mxfp8 (e4m3, E8M0 scale per 32), nvfp4 (e2m1 pairs, e4m3 scale per 16) "
    "[default: bf16].",
)
routing = typer.Option([], "--routing", help="Routing, repeatable: uniform, skewed, local [default: uniform].")
backend = typer.Option([], "--backend", help="Backend to sweep, repeatable [default: every registered one].")
warmup = typer.Option(None, min=0, help="Warm-up round trips per case [default: 10 cuda, 3 cpu].")
iters = typer.Option(None, min=1, help="Timed samples per case [default: 50 cuda, 15 cpu].")
db = typer.Option(None, "--db", help=DB_HELP)
resume = typer.Option(
    False,
    help="Continue the latest unfinished run with the same plan; skip what it stored. When this machine's latest "
    "run is unfinished with another plan, refuse, naming it and what differs; with none unfinished, start a new "
    "run and say so.",
)
progress = typer.Option(True, help="Show a progress bar.")
adaptive = typer.Option(
    False,
    help="Measure a coarse token grid, then bisect where the winner changes, instead of every token count.",
)
capacity = typer.Option(
    None,
    min=1,
    help="Tokens per rank to build fixed-capacity backends for (ours, FlashInfer's, padded AG+RS), "
    "e.g. your engine's largest step; the step-sized ones (ours, FlashInfer one-sided, padded AG+RS) are "
    "told each step's size as engines tell them, the others pay the capacity [default: each token count's own].",
)
refine = typer.Option(
    None,
    "--refine/--no-refine",
    help="Where the winner changes between neighbouring token counts, or the top two "
    "are within 3% at both, also measure between them (bisecting until <= 20% apart): a backend whose cost steps "
    "between grid counts is caught, at a few measurements per crossover or close race [default: on for cuda, off "
    "for cpu, where gloo noise makes every pair a race].",
)
ep_sizes = typer.Option(
    None,
    "--ep-sizes",
    help="EP sizes to measure, comma-separated, each dividing the world: each on groups of consecutive ranks, "
    "every group at once, as a deployment's replicas run [default: the powers of two from 2 that divide the "
    "world, and the world; of those, the sizes some model's experts divide].",
)
allow_mixed = typer.Option(
    False,
    "--allow-mixed",
    help="Sweep even when the job's nodes differ (GPU model, NVLink health, driver, NCCL, CUDA, torch or "
    "FlashInfer version); without it such a job stops before any timing, naming the odd node. The run and "
    "its table record the mix.",
)
timeout = typer.Option(
    600.0,
    help="Seconds one case may make no progress before every rank is stopped, the case recorded "
    "as a timeout and the sweep restarted without that backend.",
)
