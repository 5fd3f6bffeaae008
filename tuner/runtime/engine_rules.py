"""What each engine can start with: its start-up rules, as data, each with its source.

A table picks the fastest backend it measured; the engine runs in its own environment (its
expert kernels, quantization, LoRA, parallel layout, platform, packages). A rule here says
which of the engine's literals that deployment refuses at start-up, read in the engine's
source at :data:`VERSIONS`; each cites the file and function where the condition lives
(``tests/runtime/test_engines_real.py`` fails when a cited condition leaves the installed
engine). Lookup drops a refused backend before it competes (:func:`refused`), and says which
rule dropped it. A deployment fact nobody gave (None) applies no rule: the answer is then the
one the table gives without it. A ``"states"`` rule is a condition the lookup cannot evaluate
or a cost; ``a2a-tune backends`` and ``report`` print it, nothing is dropped.

Standard library only (imported by the runtime lookup and the vLLM plugin). docs/engines.md
explains the rules and what the plugin does when it cannot tell.
"""

from __future__ import annotations

from typing import NamedTuple

from a2a_tune.tuner.runtime import engines

__all__ = [
    "LEGACY_MOE_QUANTIZATIONS",
    "MOE_RUNNERS",
    "NO_FACTS",
    "PACKAGES",
    "PLATFORMS",
    "QUANTIZATIONS",
    "RULES",
    "VERSIONS",
    "Cite",
    "Deployment",
    "Rule",
    "describe",
    "describe_line",
    "nearest_version",
    "platform_parts",
    "reason",
    "refused",
]

#: engine -> the version its rules were read from (CI installs the vLLM and SGLang ones).
VERSIONS = dict(engines.VERSIONS)

#: What a deployment's quantization means for the rules (lookup's ``quantization=``; the
#: plugin maps vLLM's quantization config onto it): none (the model dtype), fp8 in 1x128
#: blocks, per-tensor (or per-token/channel) fp8, NVFP4, MXFP8, MXFP4, weight-only methods,
#: and the MoE methods vLLM 0.33 still runs without its modular kernel (:data:`LEGACY_MOE_QUANTIZATIONS`).
QUANTIZATIONS = (
    "none",
    "fp8_block",
    "fp8_per_tensor",
    "nvfp4",
    "mxfp8",
    "mxfp4",
    "weight_only",
    "quark_w4a8_fp8",
    "ct_w4a16_flydsl",
)
#: vLLM 0.33 MoE methods that never set ``moe_kernel`` (so ``supports_internal_mk`` is
#: False): ``QuarkW4A8Fp8MoEMethod`` (quantization/quark/quark_moe.py) and
#: ``CompressedTensorsW4A16FlydslMoEMethod`` (compressed_tensors_moe_w4a16_flydsl.py).
LEGACY_MOE_QUANTIZATIONS = frozenset({"quark_w4a8_fp8", "ct_w4a16_flydsl"})
#: Platforms: ``cuda`` (``cuda:MAJOR.MINOR`` names the compute capability), ``rocm``, ``cpu``.
PLATFORMS = ("cuda", "rocm", "cpu")
#: MoE expert runners: SGLang 0.5.23's ``--moe-runner-backend`` choices
#: (``MOE_RUNNER_BACKEND_CHOICES``, ``sglang/srt/arg_groups/choices.py``; CI compares them).
MOE_RUNNERS = (
    "auto",
    "deep_gemm",
    "triton",
    "triton_kernel",
    "flashinfer_trtllm",
    "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "flashinfer_megamoe",
    "cutlass",
    "aiter",
    "marlin",
    "humming",
    "experimental_sgl_marlin",
    "lora_cutedsl",
    "lora_triton",
    "lora_marlin",
    "hpc_ops",
    "megamoe",
    "intel_xpu",
)

_VLLM_ALL = engines.ACCEPTED["vllm"]
_VLLM_FLASHINFER = frozenset({"flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"})
_VLLM_AGRS = "allgather_reducescatter"
#: package each vLLM backend imports in the engine's processes (``vllm/utils/import_utils.py``,
#: ``vllm/utils/flashinfer.py``): the plugin checks it with ``importlib.util.find_spec``.
PACKAGES = {
    "vllm": {
        "flashinfer_nvlink_one_sided": "flashinfer",
        "flashinfer_nvlink_two_sided": "flashinfer",
        "deepep_high_throughput": "deep_ep",
        "deepep_low_latency": "deep_ep",
        "deepep_v2": "deep_ep",
        "nixl_ep": "nixl_ep",
        "mori_high_throughput": "mori",
        "mori_low_latency": "mori",
        "moonep": "moonep",
    },
}


class Deployment(NamedTuple):
    """The facts about the engine's deployment that change which backends it can start with.
    None (or empty): not known, no rule on it applies. ``missing``: packages the engine's
    process cannot import (the plugin's check; lookup cannot know)."""

    lora: bool | None = None
    pipeline_size: int | None = None
    moe_tp_size: int | None = None
    quantization: str | None = None
    moe_runner: str | None = None
    platform: str | None = None
    missing: frozenset = frozenset()

    def given(self) -> dict:
        """The facts given, for messages and JSON."""
        out = {k: v for k, v in self._asdict().items() if v is not None and k != "missing"}
        if self.missing:
            out["missing"] = sorted(self.missing)
        return out


#: Nothing known about the deployment: no start-up rule applies (the common case, shared).
NO_FACTS = Deployment()


class Cite(NamedTuple):
    """Where a rule was read: ``file`` inside the engine's package, ``function`` (qualified
    name in it), and ``needle``, text of the condition that function holds."""

    file: str
    function: str
    needle: str


class Rule(NamedTuple):
    """One start-up rule: ``engine``, ``version`` read, ``name``; ``backends``: the literals it
    refuses when it applies (for a ``"states"`` rule: those it is about); ``when``: the
    condition in words; ``why``: the one line a log says; ``cites``; ``kind``: ``"refuses"``
    (evaluated: lookup drops the backends) or ``"states"`` (printed only)."""

    engine: str
    version: str
    name: str
    backends: frozenset
    when: str
    why: str
    cites: tuple
    kind: str = "refuses"


def platform_parts(platform: str | None) -> tuple:
    """("cuda", (8, 9)) for "cuda:8.9"; (kind, None) without a capability; (None, None) for None."""
    if platform is None:
        return None, None
    kind, _, cap = platform.partition(":")
    if not cap:
        return kind, None
    major, _, minor = cap.partition(".")
    return kind, (int(major), int(minor or 0))


def _unquantized_sm_without_kernel(d: Deployment, shape) -> bool:
    # FlashInferExperts: SM 9.0, 10.x, 12.x; TrtLlmBf16Experts: 10.x; Triton refuses both configs.
    kind, cap = platform_parts(d.platform)
    return (
        kind == "cuda"
        and cap is not None
        and d.quantization == "none"
        and cap not in ((9, 0),)
        and cap[0] not in (10, 12)
    )


_V = VERSIONS["vllm"]
_S = VERSIONS["sglang"]
_T = VERSIONS["trtllm"]
_FUSED = "vllm/model_executor/layers/fused_moe/"

#: Every rule, per engine (see :class:`Rule`); :data:`_APPLIES` holds each evaluated rule's test.
RULES = (
    Rule(
        "vllm",
        _V,
        "lora_ep",
        _VLLM_ALL - {_VLLM_AGRS},
        "LoRA with expert parallelism",
        "LoRA with EP: vLLM accepts only allgather_reducescatter",
        (
            Cite(
                "vllm/lora/layers/fused_moe.py",
                "FusedMoEWithLoRA._ep_check",
                'all2all_backend == "allgather_reducescatter"',
            ),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "naive_dispatch",
        _VLLM_ALL - {_VLLM_AGRS},
        f"a MoE method without vLLM's modular kernel ({', '.join(sorted(LEGACY_MOE_QUANTIZATIONS))}) with DP > 1",
        "MoE method without the modular kernel: vLLM dispatches through dispatch_router_logits, "
        "which only allgather_reducescatter implements",
        (
            Cite(_FUSED + "runner/moe_runner.py", "MoERunner.do_naive_dispatch_combine", "supports_internal_mk"),
            Cite(_FUSED + "runner/moe_runner.py", "MoERunner._maybe_dispatch", "dispatch_router_logits("),
            Cite(
                "vllm/distributed/device_communicators/all2all.py",
                "AgRsAll2AllManager.dispatch_router_logits",
                "all_gatherv",
            ),
            Cite(
                _FUSED + "fused_moe_method_base.py",
                "FusedMoEMethodBase.supports_internal_mk",
                "self.moe_kernel is not None",
            ),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "no_expert_kernel",
        _VLLM_FLASHINFER,
        "an unquantized model on a CUDA device other than SM 9.0, 10.x or 12.x (e.g. an SM 8.9 L4)",
        "no unquantized expert kernel vLLM's oracle accepts for FlashInfer NVLink dispatch on this device",
        (
            Cite(
                _FUSED + "oracle/unquantized.py",
                "select_unquantized_moe_backend",
                "No Unquantized MoE backend supports the deployment configuration",
            ),
            Cite(
                _FUSED + "experts/triton_moe.py",
                "TritonExperts._supports_parallel_config",
                "use_fi_nvl_one_sided_kernels",
            ),
            Cite(
                _FUSED + "experts/flashinfer_cutlass_moe.py",
                "FlashInferExperts._supports_current_device",
                "is_device_capability(90)",
            ),
            Cite(
                _FUSED + "experts/trtllm_bf16_moe.py",
                "TrtLlmBf16ExpertsBase._supports_current_device",
                "is_device_capability_family(100)",
            ),
            Cite(_FUSED + "modular_kernel.py", "FusedMoEExperts.is_supported_config", "_supports_parallel_config"),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "one_sided_payload",
        frozenset({"flashinfer_nvlink_one_sided"}),
        "a payload other than NVFP4, MXFP8, DeepSeek block FP8 (1x128) or bf16/fp16 (e.g. per-tensor FP8)",
        "FlashInfer one-sided dispatch carries only nvfp4, mxfp8, block FP8 and bf16/fp16",
        (
            Cite(
                _FUSED + "all2all_utils.py",
                "flashinfer_one_sided_dispatch_layout",
                "quant_config.block_shape == [128, 128]",
            ),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "platform_cpu",
        _VLLM_ALL - {_VLLM_AGRS},
        "vLLM's CPU platform",
        "vLLM's CPU platform runs only allgather_reducescatter",
        (
            Cite(
                "vllm/distributed/device_communicators/cpu_communicator.py",
                "CpuCommunicator.__init__",
                "all2all manager is not supported on CPU",
            ),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "platform_rocm",
        _VLLM_FLASHINFER | {"moonep"},
        "a ROCm platform",
        "FlashInfer's NVLink kernels and MoonEP need CUDA (NVLink, NVSwitch multicast)",
        (
            Cite(
                "vllm/distributed/device_communicators/all2all.py",
                "FlashInferNVLinkOneSidedManager.__init__",
                "has_flashinfer_nvlink_one_sided()",
            ),
            Cite("vllm/utils/import_utils.py", "check_moonep_system_support", "multicast"),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "deepep_v2_nccl",
        frozenset({"deepep_v2"}),
        "DeepEP with ElasticBuffer and a runtime NCCL >= 2.30.4",
        "vLLM's deepep_v2 needs DeepEP v2 and NCCL >= 2.30.4",
        (Cite("vllm/utils/import_utils.py", "deep_ep_v2_unavailable_reason", "DEEPEP_V2_MIN_NCCL_VERSION_RAW"),),
        "states",
    ),
    Rule(
        "vllm",
        _V,
        "package",
        frozenset(PACKAGES["vllm"]),
        "the backend's package not importable in vLLM's environment (flashinfer, deep_ep, nixl_ep, mori, moonep)",
        "not importable in vLLM's environment",
        (
            Cite("vllm/utils/import_utils.py", "has_deep_ep", '_has_module("deep_ep")'),
            Cite("vllm/utils/import_utils.py", "has_nixl_ep", '_has_module("nixl_ep")'),
            Cite("vllm/utils/import_utils.py", "has_mori", '_has_module("mori")'),
            Cite("vllm/utils/import_utils.py", "has_moonep", '_has_module("moonep")'),
            Cite("vllm/utils/flashinfer.py", "has_flashinfer", 'find_spec("flashinfer")'),
        ),
    ),
    Rule(
        "vllm",
        _V,
        "deepep_ht_graphs",
        frozenset({"deepep_high_throughput"}),
        "DP > 1",
        "vLLM turns CUDA graphs off with DeepEP high-throughput",
        (Cite("vllm/config/compilation.py", "CompilationConfig.set_splitting_ops_for_v1", "Disabling CUDA Graphs"),),
        "states",
    ),
    Rule(
        "vllm",
        _V,
        "ubatching",
        _VLLM_ALL - {"deepep_high_throughput", "deepep_low_latency", "nixl_ep"},
        "micro-batching (--enable-dbo) on CUDA (ROCm adds allgather_reducescatter)",
        "vLLM's micro-batching refuses them: it runs only DeepEP and NIXL EP",
        (Cite("vllm/config/vllm.py", "VllmConfig.__post_init__", "Microbatching currently only supports"),),
        "states",
    ),
    Rule(
        "sglang",
        _S,
        "flashinfer_runner",
        frozenset({"flashinfer"}),
        "--moe-runner-backend other than flashinfer_cutlass, flashinfer_cutedsl, flashinfer_trtllm, "
        "flashinfer_trtllm_routed or deep_gemm",
        "SGLang's FlashInfer a2a runs only with the flashinfer_cutlass/cutedsl/trtllm(_routed) or deep_gemm MoE runner",
        (
            Cite(
                "sglang/srt/arg_groups/moe_hook.py",
                "handle_a2a_moe",
                "FlashInfer MoE A2A is supported with flashinfer_cutlass",
            ),
        ),
    ),
    Rule(
        "sglang",
        _S,
        "flashinfer_dp_attention",
        frozenset({"flashinfer"}),
        "DP attention with --attn-dp-size equal to --tp-size",
        "SGLang's FlashInfer a2a needs DP attention over the whole TP group",
        (
            Cite(
                "sglang/srt/arg_groups/moe_hook.py", "_flashinfer_a2a_topology_is_supported", "attn_dp_size == tp_size"
            ),
        ),
        "states",
    ),
    Rule(
        "sglang",
        _S,
        "platform_not_cuda",
        frozenset({"flashinfer", "deepep", "deepep_v2", "flashinfer_megamoe", "megamoe"}),
        "a platform other than CUDA",
        "FlashInfer and DeepEP kernels need CUDA",
        (Cite("sglang/srt/arg_groups/moe_hook.py", "handle_a2a_moe", 'a2a_now == "flashinfer"'),),
    ),
    Rule(
        "trtllm",
        _T,
        "moe_tp",
        engines.ACCEPTED["trtllm"] - {"ALLGATHER"},
        "MoE tensor parallelism (moe_tp_size != 1)",
        "TensorRT-LLM uses ALLGATHER whenever moe_tp_size != 1, before it reads TRTLLM_FORCE_COMM_METHOD",
        (
            Cite(
                "tensorrt_llm/_torch/modules/fused_moe/communication/communication_factory.py",
                "CommunicationFactory.create_strategy",
                "mapping.moe_tp_size != 1",
            ),
        ),
    ),
    Rule(
        "trtllm",
        _T,
        "uneven_experts",
        engines.ACCEPTED["trtllm"] - engines.TRTLLM_NONDIVISIBLE,
        "experts not divisible by the EP size",
        "TensorRT-LLM accepts only NVLINK_ONE_SIDED or ALLGATHER when experts do not divide over EP",
        (
            Cite(
                "tensorrt_llm/_torch/modules/fused_moe/communication/communication_factory.py",
                "CommunicationFactory._create_forced_method",
                "_NONDIVISIBLE_EP_ALLOWED",
            ),
        ),
    ),
    Rule(
        "trtllm",
        _T,
        "deepep_bf16",
        frozenset({"DEEPEP", "DEEPEPLOWLATENCY"}),
        "TRTLLM_CAN_USE_DEEP_EP=1 (default) and bf16 activations, for its own choice",
        "TensorRT-LLM tries DeepEP only with TRTLLM_CAN_USE_DEEP_EP=1 and bf16 activations",
        (
            Cite(
                "tensorrt_llm/_torch/modules/fused_moe/communication/communication_factory.py",
                "CommunicationFactory.create_strategy",
                'TRTLLM_CAN_USE_DEEP_EP", "1") == "1" and act_dtype == torch.bfloat16',
            ),
        ),
        "states",
    ),
    Rule(
        "trtllm",
        _T,
        "platform_not_cuda",
        engines.ACCEPTED["trtllm"] - {"ALLGATHER"},
        "a platform other than CUDA",
        "TensorRT-LLM's all2all kernels need CUDA",
        (
            Cite(
                "tensorrt_llm/_torch/modules/fused_moe/communication/communication_factory.py",
                "CommunicationFactory.create_strategy",
                "NVLinkOneSided(",
            ),
        ),
    ),
)


def _platform_is(kind: str):
    return lambda d, shape: platform_parts(d.platform)[0] == kind


def _not_cuda(d: Deployment, shape) -> bool:
    return d.platform is not None and platform_parts(d.platform)[0] != "cuda"


#: (engine, rule name) -> the rule's test on (deployment, shape); "package" is per backend.
_APPLIES = {
    ("vllm", "lora_ep"): lambda d, shape: bool(d.lora),
    ("vllm", "naive_dispatch"): lambda d, shape: d.quantization in LEGACY_MOE_QUANTIZATIONS,
    ("vllm", "no_expert_kernel"): _unquantized_sm_without_kernel,
    ("vllm", "one_sided_payload"): lambda d, shape: d.quantization in ("fp8_per_tensor",),
    ("vllm", "platform_cpu"): _platform_is("cpu"),
    ("vllm", "platform_rocm"): _platform_is("rocm"),
    ("sglang", "flashinfer_runner"): lambda d, shape: (
        d.moe_runner is not None
        and d.moe_runner
        not in (
            "flashinfer_cutlass",
            "flashinfer_cutedsl",
            "flashinfer_trtllm",
            "flashinfer_trtllm_routed",
            "deep_gemm",
        )
    ),
    ("sglang", "platform_not_cuda"): _not_cuda,
    ("trtllm", "moe_tp"): lambda d, shape: d.moe_tp_size is not None and d.moe_tp_size != 1,
    ("trtllm", "uneven_experts"): lambda d, shape: shape is not None and shape.num_experts % shape.ep_size != 0,
    ("trtllm", "platform_not_cuda"): _not_cuda,
}
_BY_ENGINE = {e: tuple(r for r in RULES if r.engine == e and r.kind == "refuses") for e in engines.ENGINES}


def refused(engine: str, literal: str, deployment: Deployment, shape=None) -> Rule | None:
    """The first rule by which ``engine`` cannot start with ``literal`` in ``deployment`` (at
    ``shape``, a :class:`~a2a_tune.tuner.runtime.point.Shape`, for shape rules), or None."""
    for rule in _BY_ENGINE.get(engine, ()):
        if literal not in rule.backends:
            continue
        if rule.name == "package":
            if PACKAGES[engine].get(literal) in deployment.missing:
                return rule
        elif _APPLIES[(engine, rule.name)](deployment, shape):
            return rule
    return None


def reason(rule: Rule, engine: str, literal: str) -> str:
    """The words ``<rule>: <why>`` for a backend ``rule`` refused (the package rule names the package)."""
    if rule.name == "package":
        return f"package: {PACKAGES[engine][literal]} {rule.why}"
    return f"{rule.name}: {rule.why}"


def describe(backends=None) -> list:
    """One dict per rule (``engine``, ``version``, ``rule``, ``kind``, ``backends`` -- those of
    ``backends`` when given, an iterable of engine literals --, ``when``, ``why``, ``source``:
    "file:function" of its first citation), for ``a2a-tune backends`` and ``report``."""
    keep = None if backends is None else set(backends)
    out = []
    for r in RULES:
        names = sorted(r.backends if keep is None else r.backends & keep)
        if names:
            first = r.cites[0]
            out.append(
                {"engine": r.engine, "version": r.version, "rule": r.name, "kind": r.kind, "backends": names}
                | {"when": r.when, "why": r.why, "source": f"{first.file}:{first.function}", "function": first.function}
            )
    return out


def describe_line(d: dict) -> str:
    """A :func:`describe` row as one line of text."""
    verb = "cannot start with" if d["kind"] == "refuses" else "note for"
    return (
        f"{engines.NAMES[d['engine']]} {d['version']}: {verb} {', '.join(d['backends'])} "
        f"when {d['when']} ({d['why']}; {d['function']})"
    )


def nearest_version(engine: str, version: str | None) -> tuple:
    """(the rules' version for ``engine``, a note or ""): the rules are kept for a version
    they were not read from, and the note says so."""
    known = VERSIONS.get(engine)
    if version is None or version == known:
        return known, ""
    return known, f"{engines.NAMES.get(engine, engine)} {version}: rules read from {known}, the nearest known"
