"""What the serving engines accept, and how to tell them: the data behind ``--format``.

Standard library only (imported by the runtime lookup). Literals are data, read from each
engine's source at the version named here; CI checks the vLLM and SGLang ones against
the real packages of those versions (``.ci/engines.sh``, ``tests/test_engines_real.py``).
A table may name any literal, but lookup lets a backend compete for an engine only when
the engine accepts its literal (and its extra options), so ``--format vllm`` can never
print a value the engine would reject.

* **vLLM 0.33.0** ``--all2all-backend``: the ``All2AllBackend`` literal of
  ``vllm/config/parallel.py``. Left out although the literal lists them: ``naive`` and
  ``pplx`` (removed; vLLM replaces them with ``allgather_reducescatter`` and warns),
  ``flashinfer_all2allv`` (a temporary alias of ``flashinfer_nvlink_two_sided``) and
  ``passthrough`` (not offered by the parser: vLLM binds it itself when the MoE backend
  dispatches and combines on its own, e.g. ``--moe-backend flashinfer_moe_ep_cutedsl``;
  see :data:`VLLM_INTERNAL`). vLLM reads no environment variable for the backend
  (``VLLM_ALL2ALL_BACKEND`` was removed after 0.14), so ``--format env`` prints
  a2a-tune's own variables (see :func:`env_lines`).
* **SGLang 0.5.23** ``--moe-a2a-backend``: the choices of ``moe_a2a_backend`` in
  ``python/sglang/srt/arg_groups/fields/exec_.py`` (they moved there from
  ``server_args.py``); default ``none`` (no all2all kernel: MoE via all-reduce).
  ``deepep`` stands for two kernels, told apart by ``--deepep-mode`` (``normal`` |
  ``low_latency`` | ``auto``, same file): a table records the mode as the backend's
  ``engine_options``.
* **TensorRT-LLM** (PyTorch backend, ``tensorrt_llm/_torch/modules/fused_moe/communication/
  communication_factory.py`` at NVIDIA/TensorRT-LLM commit 03c36d6222ad, after 1.2.1):
  no command-line option; the environment variable ``TRTLLM_FORCE_COMM_METHOD`` overrides
  its own choice, which tries in order NVLINK_ONE_SIDED, NVLINK_TWO_SIDED, NCCL_EP, DEEPEP,
  DEEPEPLOWLATENCY and falls back to ALLGATHER (:data:`TRTLLM_PRIORITY`). A forced method
  other than NVLINK_ONE_SIDED or ALLGATHER is refused when the experts do not divide
  evenly over the EP ranks. FlashInfer's one- and two-sided NVLink kernels are
  TensorRT-LLM's. The newest release is v1.2.1 (2026-04); its copy of that file is not
  checked yet (the repository was too large to fetch here). By the pull requests that
  brought them, NCCL_EP (NVIDIA/TensorRT-LLM#15597) and the refusal for uneven experts
  (#13888) came after it: on v1.2.1 expect NVLINK_ONE_SIDED, NVLINK_TWO_SIDED, DEEPEP,
  DEEPEPLOWLATENCY, ALLGATHER. ``nccl_ep_low_latency`` maps to NCCL_EP (TensorRT-LLM's NcclEP
  runs NCCL EP's low-latency algorithm, rank-major): a table may name it to main, never to v1.2.1.
* vLLM 0.33's ``deepep_v2`` stands for both ``deepep_v2_*`` backends (vLLM picks decode or prefill
  mode itself); it has no ``nccl_ep`` literal yet (vLLM PR 46889, unreleased).
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
