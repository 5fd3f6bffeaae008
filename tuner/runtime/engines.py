"""What the serving engines accept, and how to tell them: the data behind ``--format``.

Standard library only (imported by the runtime lookup). Literals are data, read from each
engine's source at the version named here; CI checks the vLLM and SGLang ones against
the real packages of those versions (``.ci/engines.sh``, ``tests/test_engines_real.py``).
A table may name any literal, but lookup lets a backend compete for an engine only when
the engine accepts its literal (and its extra options), so ``--format vllm`` can never
print a value the engine would reject.

Design notes: docs/architecture.md, "Module notes", `tuner/runtime/engines.py`.
"""

from __future__ import annotations

__all__ = [
    "ACCEPTED",
    "DEFAULT",
    "ENGINES",
    "ENV_VARS",
    "NAMES",
    "OPTION_CHOICES",
    "TRTLLM_PRIORITY",
    "VERSIONS",
    "VLLM_INTERNAL",
    "accepts",
    "engine_flag",
    "env_lines",
]

#: engine -> the version its literals below were read from (CI installs these).
VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23", "trtllm": "main@03c36d6222ad"}

#: TensorRT-LLM's own order of preference (communication_factory.py), first that runs wins.
TRTLLM_PRIORITY = ("NVLINK_ONE_SIDED", "NVLINK_TWO_SIDED", "NCCL_EP", "DEEPEP", "DEEPEPLOWLATENCY", "ALLGATHER")
#: TensorRT-LLM methods it accepts when num_experts % ep_size != 0.
TRTLLM_NONDIVISIBLE = frozenset({"NVLINK_ONE_SIDED", "ALLGATHER"})

#: engine -> literals its all2all option accepts from a user (see the module docstring).
ACCEPTED = {
    "vllm": frozenset(
        {
            "allgather_reducescatter",
            "deepep_high_throughput",
            "deepep_low_latency",
            "deepep_v2",
            "mori_high_throughput",
            "mori_low_latency",
            "moonep",
            "nixl_ep",
            "flashinfer_nvlink_two_sided",
            "flashinfer_nvlink_one_sided",
        }
    ),
    "sglang": frozenset(
        {
            "none",
            "deepep",
            "mooncake",
            "nixl",
            "mori",
            "ascend_fuseep",
            "flashinfer",
            "megamoe",
            "deepep_v2",
            "ascend_tp",
            "pplx",
            "flashinfer_megamoe",
        }
    ),
    "trtllm": frozenset(TRTLLM_PRIORITY),
}

#: vLLM values the user cannot pass but vLLM sets itself: a config holding one was decided
#: by vLLM (the MoE backend communicates on its own) and is left alone.
VLLM_INTERNAL = frozenset({"passthrough"})

#: engine -> option -> the values it accepts, for a backend's ``engine_options``.
OPTION_CHOICES = {"sglang": {"--deepep-mode": frozenset({"auto", "normal", "low_latency"})}}

#: engine -> its own default, used whenever the table cannot answer for that engine.
#: TensorRT-LLM has none to print: without the variable it runs its own priority list.
DEFAULT = {"vllm": "allgather_reducescatter", "sglang": "none", "trtllm": None}

#: engine -> its command-line option (TensorRT-LLM: the environment variable).
FLAG = {"vllm": "--all2all-backend", "sglang": "--moe-a2a-backend", "trtllm": "TRTLLM_FORCE_COMM_METHOD"}

#: engine -> the variable ``--format env`` sets to its literal, and the one it sets to the whole
#: option line, if any (:func:`env_lines`).
ENV_VARS = {
    "vllm": ("A2A_TUNE_VLLM_ALL2ALL_BACKEND", None),
    "sglang": ("A2A_TUNE_SGLANG_MOE_A2A_BACKEND", "A2A_TUNE_SGLANG_ARGS"),
    "trtllm": ("TRTLLM_FORCE_COMM_METHOD", None),
}

ENGINES = tuple(ACCEPTED)
#: engine -> how messages name it.
NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def _options_ok(engine: str, options) -> bool:
    """``options`` (a flat sequence ``opt, value, ...``) are all ones ``engine`` accepts."""
    if not options:
        return True
    choices = OPTION_CHOICES.get(engine, {})
    if len(options) % 2:
        return False
    pairs = zip(options[::2], options[1::2])
    return all(isinstance(v, str) and v in choices.get(opt, ()) for opt, v in pairs)


def accepts(engine: str, literal, options=(), *, num_experts: int | None = None, ep_size: int | None = None) -> bool:
    """True when ``engine`` accepts ``literal`` (with ``options``) for its all2all choice.

    For TensorRT-LLM, ``num_experts`` / ``ep_size`` (when given) apply its rule for experts
    that do not divide evenly over the ranks."""
    if not (isinstance(literal, str) and literal in ACCEPTED.get(engine, ()) and _options_ok(engine, options)):
        return False
    if engine == "trtllm" and num_experts and ep_size and num_experts % ep_size:
        return literal in TRTLLM_NONDIVISIBLE
    return True


def engine_flag(engine: str, literal, options=()) -> str:
    """What to add to the engine's launch: ``--all2all-backend X``, ``--moe-a2a-backend X
    [--deepep-mode M]``, ``TRTLLM_FORCE_COMM_METHOD=X``. When ``literal`` is not accepted:
    the engine's default (TensorRT-LLM: an empty string, leaving its own choice)."""
    if not accepts(engine, literal, options):
        literal, options = DEFAULT[engine], ()
    if literal is None:
        return ""
    if engine == "trtllm":
        return f"{FLAG[engine]}={literal}"
    return " ".join((FLAG[engine], literal, *options))


def env_lines(backend: str, match: str, answers) -> list:
    """Shell lines for ``eval "$(a2a-tune lookup ... --format env)"``; ``answers``: engine ->
    (literal, options) the lookup answered for it (an engine left out: none).

    Neither vLLM nor SGLang reads an environment variable for its all2all backend (see the
    module docstring), so theirs are a2a-tune's own names (:data:`ENV_VARS`), for launch scripts:
    ``vllm serve ... --all2all-backend "$A2A_TUNE_VLLM_ALL2ALL_BACKEND"``, each its engine's
    default when the table has nothing it accepts. An engine without a default reads its own
    variable (TensorRT-LLM's), exported only when the table has a value for it.
    """
    import shlex  # only the CLI needs it; keeps the lookup's import lean

    values, overrides = {"A2A_TUNE_BACKEND": backend}, {}
    for engine, (var, args_var) in ENV_VARS.items():
        literal, options = answers.get(engine, (None, ()))
        ok = accepts(engine, literal, options)
        if DEFAULT[engine] is None:
            overrides.update({var: literal} if ok else {})
            continue
        values[var] = literal if ok else DEFAULT[engine]
        if args_var:
            values[args_var] = engine_flag(engine, literal, options)
    values["A2A_TUNE_MATCH"] = match
    return [f"export {k}={shlex.quote(str(v))}" for k, v in {**values, **overrides}.items()]
