"""vLLM general plugin: start vLLM with the fastest all2all backend it can start with here.

Enabled by installing a2a-tune into vLLM's environment (entry point ``a2a_tune`` in the
group ``vllm.general_plugins``; with ``VLLM_PLUGINS`` set, name ``a2a_tune`` there);
``A2A_TUNE_VLLM_PLUGIN=0`` turns it off. :func:`register` wraps
``EngineArgs.create_engine_config``: vLLM builds its config, :func:`decide` reads the model
shape, payload, phase and the deployment's facts from it (LoRA, pipeline size, quantization,
the platform and its compute capability, which backend packages import), asks
:func:`~a2a_tune.tuner.runtime.lookup.lookup` for vLLM (only literals vLLM accepts, only
backends the start-up rules of :mod:`~a2a_tune.tuner.runtime.engine_rules` allow), and when
the answer differs sets ``EngineArgs.all2all_backend`` and lets vLLM build again, so vLLM's
own validation applies; if that build fails the first config is kept.

Nothing is changed when the user chose the backend (any spelling of ``--all2all-backend``,
a ``--config`` YAML key, a non-default ``EngineArgs`` value), when vLLM set it itself
(``passthrough``), when vLLM runs no all2all kernels, or when the check cannot run (a
platform or quantization the rules do not know, a config it cannot read): vLLM's default is
kept. One line per engine start on the logger ``vllm.a2a_tune`` says what was chosen, what
the rules excluded and why, or why the default was kept. Never raises. docs/engines.md
gives the whole route, the payload mapping and the environment variables.

Importing this module imports only the standard library (no torch, no vLLM).
"""

from __future__ import annotations

import logging
import os
import sys
from collections import namedtuple

from a2a_tune.tuner.runtime import engine_rules, engines, savings
from a2a_tune.tuner.runtime.environ import env_text
from a2a_tune.tuner.runtime.text import one_line, quoted

__all__ = ["DISABLE_ENV", "PHASE_ENV", "WORKLOAD_ENV", "Decision", "decide", "register"]

DISABLE_ENV = "A2A_TUNE_VLLM_PLUGIN"
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
PHASE_ENV = "A2A_TUNE_PHASE"
WORKLOAD_ENV = "A2A_TUNE_WORKLOAD"

#: vLLM's default (``ParallelConfig.all2all_backend``), when the EngineArgs class does not say.
VLLM_DEFAULT = engines.DEFAULT["vllm"]
# vLLM's option, and the shortest abbreviation its parser takes for it (argparse accepts any
# unambiguous prefix; "--all" and shorter also match --allowed-* options).
_OPTION = "all2all-backend"
_SHORTEST = "all2all"[:4]
_MARK = "__a2a_tune_wrapped__"

log = logging.getLogger("vllm.a2a_tune")


class Decision(namedtuple("Decision", "literal message level", defaults=("info",))):
    """What the plugin does to one engine config: ``literal`` to set (None: keep), and the
    one line it logs at ``level`` ("info" or "warning"). Whatever the message quotes (names
    from the table, paths from the environment, vLLM's own values) is escaped and bounded."""

    __slots__ = ()

    def __new__(cls, literal, message, level="info"):
        return super().__new__(cls, literal, one_line(message), level)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wrap ``EngineArgs.create_engine_config``.

    Runs in every vLLM process, possibly several times; wraps once. Never raises.
    """
    try:
        switch = os.environ.get(DISABLE_ENV, "").strip().lower()
        if switch in _OFF:
            return
        if switch not in _ON:  # a word we do not know: say so, and stay as if unset
            _log(
                Decision(
                    None,
                    f"a2a-tune: {DISABLE_ENV}={quoted(os.environ.get(DISABLE_ENV))} is not one of "
                    f"{'/'.join(_OFF)} (off) or {'/'.join(_ON[1:])} (on); the plugin stays on",
                    "warning",
                )
            )
        from vllm.engine.arg_utils import EngineArgs  # lazy: only inside vLLM

        _install(EngineArgs)
    except Exception as exc:  # never break vLLM's start-up
        _log(
            Decision(None, f"a2a-tune: plugin not active ({one_line(exc)}); vLLM keeps its all2all backend", "warning")
        )


def _install(cls) -> None:
    original = cls.create_engine_config
    if getattr(original, _MARK, False):
        return

    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        return _apply(self, config, lambda: original(self, *args, **kwargs))

    create_engine_config.__doc__ = original.__doc__
    create_engine_config.__wrapped__ = original
    setattr(create_engine_config, _MARK, True)
    cls.create_engine_config = create_engine_config


def _apply(engine_args, config, rebuild):
    """Set the table's backend on ``engine_args`` and rebuild, or keep ``config``. Never raises."""
    current = getattr(getattr(config, "parallel_config", None), "all2all_backend", None)
    try:
        if not hasattr(engine_args, "all2all_backend"):
            decision = Decision(
                None, "a2a-tune: this vLLM has no all2all_backend engine argument; nothing changed", "warning"
            )
        elif current != engine_args.all2all_backend:
            decision = Decision(
                None,
                f"a2a-tune: vLLM set all2all backend {current!r} itself "
                f"(asked for {engine_args.all2all_backend!r}); not changed",
            )
        else:
            decision = decide(config, explicit=_user_chose(engine_args))
    except Exception as exc:
        decision = Decision(None, f"a2a-tune: keeping vLLM's all2all backend {current!r} ({one_line(exc)})", "warning")
    if decision.literal is None or decision.literal == current:
        _log(decision)
        return config
    previous = engine_args.all2all_backend
    engine_args.all2all_backend = decision.literal
    try:
        new_config = rebuild()
    except Exception as exc:
        engine_args.all2all_backend = previous
        _log(
            Decision(
                None,
                f"a2a-tune: vLLM refused all2all backend {decision.literal!r} ({one_line(exc)}); keeping {current!r}",
                "warning",
            )
        )
        return config
    _log(decision)
    return new_config


def _log(decision: Decision) -> None:
    (log.warning if decision.level == "warning" else log.info)("%s", decision.message)


def _user_chose(engine_args) -> bool:
    """True when the backend was chosen explicitly (see the module docstring)."""
    args = [a for a in sys.argv[1:] if isinstance(a, str)]
    if any(a.startswith("--") and _names_option(a[2:].split("=", 1)[0]) for a in args):
        return True
    if any(_config_sets_option(path) for path in _config_files(args)):
        return True
    return getattr(engine_args, "all2all_backend", None) != _default_of(type(engine_args))


def _names_option(key: str) -> bool:
    """Whether ``key`` (an option name without the dashes, or a YAML key) means
    ``all2all-backend`` to vLLM's parser: underscores are dashes there, and argparse takes
    any unambiguous prefix."""
    key = key.replace("_", "-")
    return len(key) >= len(_SHORTEST) and _OPTION.startswith(key)


def _config_files(args: list) -> list:
    """The files given to vLLM's ``--config`` (as ``--config F`` or ``--config=F``)."""
    files = [b for a, b in zip(args, args[1:]) if a == "--config"]
    return files + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


def _config_sets_option(path: str) -> bool:
    """Whether vLLM's YAML ``--config`` file sets the option (a top-level key); unreadable (a FIFO, a
    device, over the cap, not UTF-8): no."""
    from a2a_tune.tuner.runtime.files import MAX_JSON_BYTES, read_capped

    try:  # never blocks: a FIFO vLLM's parser has drained is refused at once (runtime.files)
        lines = read_capped(path, MAX_JSON_BYTES).decode("utf-8").splitlines()
    except (OSError, ValueError):  # FileRefused and UnicodeDecodeError are ValueErrors
        return False
    for line in lines:
        if line[:1].isspace() or ":" not in line:  # nested keys and list items are not options
            continue
        key = line.split(":", 1)[0].strip().strip("\"'")
        if _names_option(key):
            return True
    return False


def _default_of(cls) -> str:
    import dataclasses

    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name == "all2all_backend" and isinstance(f.default, str):
                return f.default
    return VLLM_DEFAULT


# --------------------------------------------------------------------------- decide

# Hugging Face config keys, as `a2a-tune sweep --model-config` reads them.
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")
_HIDDEN_KEYS = ("hidden_size", "d_model")


def _first_int(cfg, keys):
    for key in keys:
        v = getattr(cfg, key, None)
        if v is None and isinstance(cfg, dict):
            v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _model_shape(model_config) -> tuple:
    """(hidden, topk, num_experts) of an MoE model; ValueError if it is none."""
    for attr in ("hf_text_config", "hf_config"):
        cfg = getattr(model_config, attr, None)
        if cfg is None:
            continue
        for candidate in (cfg, getattr(cfg, "text_config", None)):
            if candidate is None:
                continue
            shape = (
                _first_int(candidate, _HIDDEN_KEYS),
                _first_int(candidate, _TOPK_KEYS),
                _first_int(candidate, _EXPERT_KEYS),
            )
            if all(shape):
                return shape
    raise ValueError(
        f"no MoE shape in the model config (need one of {_EXPERT_KEYS}, one of {_TOPK_KEYS}, one of {_HIDDEN_KEYS})"
    )


# vLLM 0.33 quantization methods that quantize weights only: the MoE dispatches activations in
# the model dtype.
_WEIGHT_ONLY = frozenset(
    {
        "awq",
        "auto_awq",
        "awq_marlin",
        "gptq",
        "auto_gptq",
        "gptq_marlin",
        "moe_wna16",
        "experts_int8",
        "int8_per_channel_weight_only",
    }
)
# The block width of the table's fp8_e4m3 payloads (one scale per 128 elements of a row).
_FP8_GROUP = 128


def _model_dtype(model_config) -> str:
    text = str(getattr(model_config, "dtype", "bfloat16")).lower()
    if "bfloat16" in text:
        return "bf16"
    if "float16" in text or "half" in text:
        return "fp16"
    if "float32" in text or text in ("float", "torch.float"):
        return "fp32"
    return "bf16"


def _quant_config(model_config) -> dict:
    for attr in ("hf_config", "hf_text_config"):
        q = getattr(getattr(model_config, attr, None), "quantization_config", None)
        if isinstance(q, dict):
            return q
        if q is not None and hasattr(q, "to_dict"):
            return q.to_dict()
    return {}


def _quant_method(model_config, qcfg: dict) -> str:
    """The checkpoint's quantization method: vLLM's ``quantization``, else the config's
    ``quant_method`` ("" for none)."""
    return str(getattr(model_config, "quantization", None) or qcfg.get("quant_method") or "")


def _payload_dtype(model_config) -> tuple:
    """(table dtype of what vLLM's all2all carries for this checkpoint, a note or "") or (None,
    why the table cannot say). Read in vLLM 0.33: every all2all prepare() quantizes the MoE
    input with the layer's ``FusedMoEQuantConfig.quant_dtype`` (``fused_moe/config.py``) before
    dispatching (``prepare_finalize/naive_dp_ep.py``, ``flashinfer_nvlink_one_sided.py``)."""
    qcfg = _quant_config(model_config)
    method = _quant_method(model_config, qcfg)
    if not method or method in _WEIGHT_ONLY:
        return _model_dtype(model_config), ""
    algo = str((qcfg.get("quantization") or {}).get("quant_algo", "") or qcfg.get("quant_algo", "")).upper()
    if method == "modelopt_fp4" or (method.startswith("modelopt") and "FP4" in algo):
        return "nvfp4", "ModelOpt NVFP4: e2m1 rows + e4m3 scales per 16 (nvfp4_moe_quant_config)"
    if method == "modelopt_mxfp8" or (method.startswith("modelopt") and "MXFP8" in algo):
        return "mxfp8", "ModelOpt MXFP8: e4m3 rows + E8M0 scales per 32"
    if method == "modelopt" and algo == "FP8":
        return "fp8_e4m3", _PER_TENSOR_NOTE
    if method == "mxfp4":
        return _model_dtype(model_config), (
            "MXFP4 (gpt-oss): vLLM's Marlin / Triton MXFP4 MoE (mxfp4_w4a16, Hopper) dispatches the model dtype; "
            "its FlashInfer MXFP4 x MXFP8 kernels (Blackwell) dispatch mxfp8"
        )
    if method == "fp8":
        block = qcfg.get("weight_block_size")
        if block is None:
            return "fp8_e4m3", _PER_TENSOR_NOTE
        if isinstance(block, (list, tuple)) and len(block) == 2 and block[1] == _FP8_GROUP:
            return "fp8_e4m3", "block-FP8: e4m3 rows + fp32 scales per 1 x 128"
        return None, f"quantization fp8 with weight_block_size {block!r} (the table's FP8 is 1x{_FP8_GROUP} blocks)"
    if method == "compressed-tensors":
        acts = [g.get("input_activations") for g in (qcfg.get("config_groups") or {}).values() if isinstance(g, dict)]
        if acts and all(a is None for a in acts):
            return _model_dtype(model_config), "compressed-tensors weight-only: activations dispatched unquantized"
        kinds = {_activation_kind(a) for a in acts}
        if len(kinds) == 1 and None not in kinds:
            return kinds.pop()
        return None, "compressed-tensors activations other than NVFP4 or FP8"
    return None, f"quantization {method!r}"


# Per-tensor (or per-token) FP8: e4m3 rows with one scale per tensor (per token); the table's
# nearest payload is block-FP8 (the same e4m3 rows, 3% more bytes of scales).
_PER_TENSOR_NOTE = "per-tensor FP8 rows: looked up as block-FP8 (fp8_e4m3), the nearest measured payload"


def _activation_kind(spec) -> tuple | None:
    """(dtype, note) of a compressed-tensors ``input_activations`` scheme, or None."""
    if not isinstance(spec, dict) or spec.get("type") != "float":
        return None
    bits, strategy, group = spec.get("num_bits"), spec.get("strategy"), spec.get("group_size")
    if bits == 4 and group == 16:
        return "nvfp4", "compressed-tensors NVFP4 (W4A4): e2m1 rows + e4m3 scales per 16"
    if bits == 8 and strategy == "group" and group == _FP8_GROUP:
        return "fp8_e4m3", "compressed-tensors FP8, groups of 128: block-FP8"
    if bits == 8 and strategy in ("tensor", "token", "channel"):
        return "fp8_e4m3", _PER_TENSOR_NOTE
    return None


def _pos_int(obj, name: str) -> int:
    v = getattr(obj, name, None)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{type(obj).__name__}.{name} is {v!r}, not a positive integer")
    return v


def _phase(config) -> tuple:
    """(lookup keyword arguments, phrase) for this engine's token distribution."""
    workload = env_text(WORKLOAD_ENV)  # blank: unset
    if workload:
        return {"workload": workload}, f"workload {one_line(workload, 200)} (${WORKLOAD_ENV})"
    phase = os.environ.get(PHASE_ENV, "").strip().lower() or None
    why = f"${PHASE_ENV}"
    if phase is None:
        role = getattr(getattr(config, "kv_transfer_config", None), "kv_role", None)
        phase, why = {
            "kv_producer": ("prefill", "a kv_producer (prefill) engine"),
            "kv_consumer": ("decode", "a kv_consumer (decode) engine"),
        }.get(role, ("decode", "default for an engine serving both phases"))
    if phase not in ("decode", "prefill"):
        raise ValueError(f"{PHASE_ENV}={one_line(repr(phase), 80)}: expected decode or prefill")
    sched = getattr(config, "scheduler_config", None)
    if phase == "decode":
        n = _pos_int(sched, "max_num_seqs")
        return {"phase": "decode", "max_tokens": n}, f"decode, 1..{n} tokens/rank ({why})"
    n = _pos_int(sched, "max_num_batched_tokens")
    return {"phase": "prefill", "max_tokens": n}, f"prefill, {n} tokens/rank per step ({why})"


def _sequence_parallel(par) -> bool:
    """vLLM's ``ParallelConfig.use_sequence_parallel_moe`` where the config has it."""
    try:
        return bool(getattr(par, "use_sequence_parallel_moe", False))
    except Exception:  # a property of a newer vLLM that cannot be evaluated: no
        return False


def decide(config, *, explicit: bool = False) -> Decision:
    """What to do with one vLLM engine config (a ``VllmConfig`` or a stand-in with the same
    attributes). Raises nothing but what reading ``config`` raises (the caller catches)."""
    par = config.parallel_config
    current = getattr(par, "all2all_backend", VLLM_DEFAULT)
    if explicit:
        return Decision(None, f"a2a-tune: all2all backend {current!r} was set explicitly; not changed")
    dp = getattr(par, "data_parallel_size", 1) or 1
    pcp = getattr(par, "prefill_context_parallel_size", 1) or 1
    tp = getattr(par, "tensor_parallel_size", 1) or 1
    if not (getattr(par, "enable_expert_parallel", False) and (dp > 1 or pcp > 1 or _sequence_parallel(par))):
        return Decision(
            None,
            "a2a-tune: vLLM uses no all2all backend here (needs expert parallelism with "
            "data_parallel_size > 1, prefill_context_parallel_size > 1 or sequence-parallel MoE); nothing to choose",
        )
    hidden, topk, experts = _model_shape(config.model_config)
    ep_size = dp * tp * pcp
    dtype, note = _payload_dtype(config.model_config)
    if dtype is None:
        return Decision(
            None,
            f"a2a-tune: keeping vLLM's all2all backend {current!r}: the table has no payload dtype for {note}",
            "warning",
        )
    request, phase_text = _phase(config)
    facts, known = _deployment(config, dtype, note)
    if facts is None:
        return Decision(None, f"a2a-tune: keeping vLLM's all2all backend {current!r}: {known}", "warning")

    from a2a_tune.tuner.runtime.lookup import lookup  # stdlib only

    choice = lookup(
        ep_size=ep_size,
        hidden=hidden,
        topk=topk,
        num_experts=experts,
        dtype=dtype,
        engine="vllm",
        quiet=True,
        **request,
        **facts,
    )
    payload = f"payload {dtype}" + (f" ({note})" if note else "")
    what = f"ep_size={ep_size} hidden={hidden} topk={topk} experts={experts} {payload}, {phase_text}"
    rules = f"; {known}" if known else ""
    if choice.match == "fallback":
        rules = _excluded_text(choice.excluded) + rules
        if choice.excluded:  # the rules left nothing the table measured: vLLM's default is the answer
            return Decision(None, f"a2a-tune: keeps vLLM's all2all backend {current!r} for {what}{rules}; kept")
        reason = choice.reason.split("; using fallback all2all backend")[0]  # we say "keeping" ourselves
        return Decision(
            None, f"a2a-tune: keeping vLLM's all2all backend {current!r} for {what}{rules}: {reason}", "warning"
        )
    literal = choice.engines["vllm"]
    verb = (
        f"keeps --all2all-backend {literal}"
        if literal == current
        else f"sets --all2all-backend {literal} (was {current!r})"
    )
    tpot, ignored = _tpot_ms()
    saving = savings.sentence(
        savings.in_engine_units(choice.vs_default, _moe_layers(config.model_config), tpot), choice.phase
    )
    saving = "".join(f"; {part}" for part in (saving, ignored) if part)
    return Decision(
        literal,
        f"a2a-tune: {verb} for {what}{rules} [hardware {choice.hardware_match}]{saving}: {choice.reason}",
        "warning" if ignored else "info",
    )


def _excluded_text(excluded) -> str:
    """The words ``; <why>: excluded a, b`` per start-up rule that dropped a backend (choice.excluded)."""
    by_why: dict = {}
    for backend, text in sorted(excluded.items()):
        by_why.setdefault(text.split(": ", 1)[-1], []).append(backend)  # "<rule>: <why>"
    return "".join(f"; {why}: excluded {', '.join(bs)}" for why, bs in by_why.items())


def _deployment(config, dtype: str, note: str) -> tuple:
    """(lookup's deployment keywords, a note or "") read from the running vLLM, or (None, why
    the check cannot run): then vLLM's default is kept."""
    platform = _platform_of()
    if platform is None:
        return None, "this vLLM platform has no start-up rules here (CUDA, ROCm and CPU do)"
    par = config.parallel_config
    facts = {
        "lora": getattr(config, "lora_config", None) is not None,
        "pipeline_size": getattr(par, "pipeline_parallel_size", 1) or 1,
        "quantization": _rules_quantization(config, dtype, note),
        "platform": platform,
        "missing_packages": _missing_packages(),
    }
    return facts, _version_note()


def _platform_of() -> str | None:
    """vLLM's platform as the rules name it ("cuda:9.0", "rocm", "cpu"), or None (another)."""
    from vllm.platforms import current_platform as p  # inside vLLM: already imported

    if p.is_cuda():
        cap = p.get_device_capability()
        return f"cuda:{cap.major}.{cap.minor}" if cap is not None else "cuda"
    if p.is_rocm():
        return "rocm"
    if p.is_cpu():
        return "cpu"
    return None


# What a process finds once (packages, vLLM's version) holds for every engine config it builds.
_ONCE: dict = {}


def _missing_packages() -> list:
    """The backends' packages vLLM's process cannot import (found without importing them)."""
    if "missing" not in _ONCE:
        from importlib.util import find_spec

        names = sorted(set(engine_rules.PACKAGES["vllm"].values()))
        _ONCE["missing"] = [n for n in names if find_spec(n) is None]
    return _ONCE["missing"]


def _version_note() -> str:
    """Empty for the vLLM version the rules were read from; else a note that the nearest is used."""
    if "version" not in _ONCE:
        try:
            from importlib.metadata import version

            running = version("vllm")
        except Exception:
            running = None
        _ONCE["version"] = engine_rules.nearest_version("vllm", running)[1]
    return _ONCE["version"]


def _rules_quantization(config, dtype: str, note: str) -> str:
    """The checkpoint's quantization in the rules' words (engine_rules.QUANTIZATIONS). vLLM 0.33
    runs compressed-tensors W4A16 with ``--moe-backend flydsl`` through a MoE method without its
    modular kernel (compressed_tensors_moe.py, ``CompressedTensorsMoEMethod.get_moe_method``)."""
    model_config = config.model_config
    if note == _PER_TENSOR_NOTE:
        return "fp8_per_tensor"
    if dtype == "fp8_e4m3":
        return "fp8_block"
    if dtype in ("nvfp4", "mxfp8"):
        return dtype
    method = _quant_method(model_config, _quant_config(model_config))
    if not method:
        return "none"
    if (
        method == "compressed-tensors"
        and getattr(getattr(config, "kernel_config", None), "moe_backend", None) == "flydsl"
    ):
        return "ct_w4a16_flydsl"
    return "mxfp4" if method == "mxfp4" else "weight_only"


def _moe_layers(model_config):
    """The model's MoE layers (runtime.models), or None."""
    from a2a_tune.tuner.runtime.models import moe_layer_count

    for attr in ("hf_config", "hf_text_config"):
        cfg = getattr(model_config, attr, None)
        if cfg is not None and (n := moe_layer_count(cfg)) is not None:
            return n
    return None


def _tpot_ms() -> tuple:
    """($A2A_TUNE_TPOT_MS as a positive finite float, "") or (None, why a value set is ignored:
    the decision's line says it, and the saving is not stated as a share of TPOT)."""
    from a2a_tune.tuner.runtime.point import MAX_TPOT_MS, MIN_TPOT_MS, PointError, check_tpot_ms

    raw = os.environ.get(savings.TPOT_ENV, "")
    if not raw.strip():
        return None, ""
    try:
        return check_tpot_ms(float(raw)), ""  # the bounds of lookup --tpot-ms
    except (ValueError, PointError):
        bounds = f"{MIN_TPOT_MS:g}..{MAX_TPOT_MS:g}"
        return None, f"${savings.TPOT_ENV}={quoted(raw)} ignored: not a positive number of ms ({bounds})"
