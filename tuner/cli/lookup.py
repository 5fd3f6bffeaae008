"""lookup: the engines' start-up answer from the command line (as light as the runtime lookup)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from .common import (
    _fail,
    app,
    emit_json,
    err,
    json_output,
)

# --------------------------------------------------------------------------------- lookup

#: The option that gives each phase's ``max_tokens``.
SIZE_OPTION = {"decode": "--max-batch", "prefill": "--max-tokens"}
#: lookup's arguments whose option is not the argument's name with dashes.
_OPTION = {"num_experts": "--experts"}


#: RequestError's rules in this command's words; the rules not here (the shape's, the
#: workload's, an environment variable's) read the same as the runtime's.
_WORDS = {
    "one_load": "give exactly one of --tokens, --phase or --workload (got {given})",
    "needs_size": "--phase {value} needs {size} N",
    "tokens": "{option}: {bound}",
    "integer": "{option} must be >= {bound}, got {shown}",
    "choice": "{option} must be {choices}, got {shown}",
    "type": "{option} must be {bound}, got {shown}",
    "budget": "{option} must be {bound}, got {shown}",
}


def request_words(exc, size_option: str | None = None) -> str:
    """The runtime's :class:`~a2a_tune.tuner.runtime.request.RequestError` in this command's
    option names (``size_option``: the one that gave ``max_tokens``, --max-batch or
    --max-tokens; None: the one that goes with the phase)."""
    from ..runtime.request import WORKSPACE_ENV, shown

    def option(arg: str) -> str:
        if arg == "max_tokens":
            return size_option or SIZE_OPTION.get(exc.phase, "--max-tokens")
        return _OPTION.get(arg) or "--" + arg.replace("_", "-")

    if exc.rule == "stray_size":
        return _stray_size(option("max_tokens"))
    if exc.rule not in _WORDS or exc.field == WORKSPACE_ENV:
        return str(exc)
    value, bound = exc.value, exc.bound
    return _WORDS[exc.rule].format(
        option=option(exc.field) if exc.field else "",
        value=value,
        bound=bound,
        shown=shown(value),
        given=", ".join(map(option, value)) or "none" if exc.rule == "one_load" else "",
        choices=" or ".join(bound) if exc.rule == "choice" else "",
        size=SIZE_OPTION.get(value, "") if exc.rule == "needs_size" else "",
    )


def _stray_size(size_option: str) -> str:
    """A size option given where its phase is not asked."""
    return f"{size_option} goes with --phase {'decode' if size_option == SIZE_OPTION['decode'] else 'prefill'}"


@app.command()
@json_output(lambda o: o.get("fmt") == "json")
def lookup(
    ep_size: int = typer.Option(..., help="Expert-parallel group size (ranks)."),
    hidden: int | None = typer.Option(None, help="Hidden size H of the token rows [default: the --preset's]."),
    topk: int | None = typer.Option(None, help="Experts per token [default: the --preset's]."),
    experts: int | None = typer.Option(None, help="Number of routed experts E [default: the --preset's]."),
    preset: str | None = typer.Option(
        None, help="Model preset (`a2a-tune presets`): fills in hidden, top-k, experts and MoE layers."
    ),
    moe_layers: int | None = typer.Option(
        None, "--moe-layers", min=1, help="MoE layers of the model: the saving per step [default: the --preset's]."
    ),
    tpot_ms: float | None = typer.Option(
        None, "--tpot-ms", help="Time per output token (ms, 0.001..1e6): also state the saving as a share of it."
    ),
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
    lora: bool | None = typer.Option(
        None, "--lora/--no-lora", help="The engine serves LoRA adapters (vLLM: only allgather_reducescatter with EP)."
    ),
    pipeline_size: int | None = typer.Option(None, "--pipeline-size", help="Pipeline-parallel size of the engine."),
    moe_tp_size: int | None = typer.Option(
        None, "--moe-tp-size", help="MoE tensor-parallel size (TensorRT-LLM: ALLGATHER whenever it is not 1)."
    ),
    quantization: str | None = typer.Option(
        None,
        help="The checkpoint's quantization, in the rules' words: none, fp8_block, fp8_per_tensor, nvfp4, mxfp8, "
        "mxfp4, weight_only, quark_w4a8_fp8, ct_w4a16_flydsl (`a2a-tune backends` lists what each one rules out).",
    ),
    moe_runner: str | None = typer.Option(
        None,
        "--moe-runner",
        help="The engine's MoE expert runner (SGLang --moe-runner-backend), e.g. flashinfer_cutlass.",
    ),
    platform: str | None = typer.Option(
        None, help="The engine's platform: cuda, cuda:MAJOR.MINOR (compute capability, e.g. cuda:8.9), rocm or cpu."
    ),
) -> None:
    """Print the backend the table picks for this shape and load (fallback: allgather_reducescatter).

    With --format vllm / sglang / trtllm: what to add to that engine's launch, for the fastest backend the engine can run (one it has no name for is left out, and so is one its start-up rules refuse for the deployment given by --lora, --pipeline-size, --moe-tp-size, --quantization, --moe-runner and --platform; --format json lists those with their rule). A missing or broken table or workload file is not an error: it prints the engine's default (for TensorRT-LLM nothing, so it keeps its own choice) and one warning, so `vllm serve ... $(a2a-tune lookup ... --format vllm)` and `env $(a2a-tune lookup ... --format trtllm) trtllm-serve ...` always start.
    """
    import logging

    from ..runtime import engines, savings
    from ..runtime import lookup as lk
    from ..runtime.text import one_line

    logging.basicConfig(format="%(message)s", level=logging.WARNING, stream=sys.stderr)
    if preset is not None:
        from ..shapes import ShapeSpecError
        from ..shapes import preset as find_preset

        try:
            model = find_preset(preset)
        except ShapeSpecError as exc:
            raise _fail(str(exc), 2) from None
        # a value given wins, 0 included (hidden, topk, experts: refused below as without --preset)
        hidden = model.hidden if hidden is None else hidden
        topk = model.topk if topk is None else topk
        experts = model.num_experts if experts is None else experts
        moe_layers = model.moe_layers if moe_layers is None else moe_layers
    from ..runtime.point import MAX_MOE_LAYERS, PointError, check_count, check_tpot_ms

    try:  # the two options only lookup reads, bounded here; the shape's are the request's
        if moe_layers is not None:
            check_count(moe_layers, "--moe-layers", MAX_MOE_LAYERS)
        if tpot_ms is not None:
            check_tpot_ms(tpot_ms, "--tpot-ms")
    except PointError as exc:
        raise _fail(str(exc), 2) from None
    missing = [f"--{n}" for n, v in (("hidden", hidden), ("topk", topk), ("experts", experts)) if v is None]
    if missing:
        raise _fail(f"give {', '.join(missing)}, or --preset NAME", 2)
    if fmt not in ("name", *engines.ENGINES, "env", "json"):
        raise _fail(f"--format must be name, {', '.join(engines.ENGINES)}, env or json, got {fmt!r}", 2)
    # Two options give lookup's max_tokens; when both are given, the one that goes with no
    # phase asked is the one refused.
    sizes = [(opt, v) for opt, v in (("--max-batch", max_batch), ("--max-tokens", max_tokens)) if v is not None]
    size_opt, size = min(sizes, key=lambda s: s[0] == SIZE_OPTION.get(phase), default=(None, None))

    def build():
        return lk.request(
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
            lora=lora,
            pipeline_size=pipeline_size,
            moe_tp_size=moe_tp_size,
            quantization=quantization,
            moe_runner=moe_runner,
            platform=platform,
        )

    try:
        req = build()
    except lk.RequestError as exc:
        # An engine's launch line must always start: a broken $A2A_TUNE_MAX_WORKSPACE_MIB there
        # is one warning and no budget (eval "$(... --format env)" never silently exports nothing).
        if fmt == "name" or fmt == "json" or max_workspace_mib is not None or lk.WORKSPACE_ENV not in str(exc):
            raise _fail(request_words(exc, size_opt), 2) from None
        err.print(f"warning: {exc}; no workspace budget applied", highlight=False, markup=False, soft_wrap=True)
        os.environ.pop(lk.WORKSPACE_ENV, None)
        try:
            req = build()
        except lk.RequestError as again:
            raise _fail(request_words(again, size_opt), 2) from None
    if size_opt is not None and size_opt != SIZE_OPTION.get(req.phase):
        raise _fail(_stray_size(size_opt), 2)

    def ask(for_engine, quiet=False):
        return lk.answer(req._replace(engine=for_engine), quiet=quiet)

    choice = ask(fmt if fmt in engines.ENGINES else engine)
    vs_default = savings.in_engine_units(choice.vs_default, moe_layers, tpot_ms)
    if fmt == "json":
        asked = [req.engine] if req.engine else list(engines.ENGINES)  # each engine's rules
        excluded = {
            e: {b: dict(zip(("rule", "why"), text.split(": ", 1))) for b, text in ask(e, quiet=True).excluded.items()}
            for e in asked
        }
        emit_json({**choice.to_dict(), "vs_default": vs_default, "excluded": excluded})
    elif fmt in engines.ENGINES:
        flag = engines.engine_flag(fmt, *choice.engine_args(fmt))
        if flag:  # TensorRT-LLM without a method: nothing, it keeps its own choice
            print(flag)
    elif fmt == "env":
        # Each engine gets the fastest backend it can be told (asked separately; an engine
        # that can be told none of the table's backends keeps its default: not worth a warning).
        answers = {e: ask(e, quiet=True).engine_args(e) for e in engines.ENGINES}
        backend = one_line(choice.backend)  # a name from the table: one line in the shell too
        for line in engines.env_lines(backend, choice.match, answers):
            print(line)
    else:
        print(one_line(choice.backend))
    if choice.match != "fallback":  # a fallback already warned once with the reason
        err.print(f"{choice.match}: {choice.reason}", style="dim", highlight=False, markup=False, soft_wrap=True)
        if moe_layers and (saving := savings.sentence(vs_default, choice.phase)):  # the step: when it is known
            err.print(saving, highlight=False, markup=False, soft_wrap=True)
