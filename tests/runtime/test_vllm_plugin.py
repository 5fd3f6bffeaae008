"""The vLLM general plugin against a minimal stand-in for vLLM (the real vLLM runs in
tests/runtime/test_engines_real.py, where CI installs it).

The stand-in mimics what the plugin relies on in vLLM (vllm/engine/arg_utils.py): a
dataclass ``EngineArgs`` with an ``all2all_backend`` field (default
"allgather_reducescatter") whose ``create_engine_config()`` validates the literal, binds
``passthrough`` for a MoE backend that communicates itself (as vLLM 0.33's
``bind_passthrough_all2all_backend``) and returns a config with ``model_config.hf_config``,
``parallel_config`` and ``scheduler_config``. The fixture table (tests/fixtures/profiles, see
tests/support/lookups.py) has vLLM literals for allgather_reducescatter and (failed)
flashinfer_nvlink_one_sided only; tests that need the table to pick another vLLM literal give
nvlink_one_sided one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import paths
import pytest
import tomllib
from hostile_env import BLANK, HOSTILE, hostile

from a2a_tune.tuner.runtime import fingerprint as fingerprint_module
from a2a_tune.tuner.runtime import vllm_plugin
from a2a_tune.tuner.runtime.lookup import clear_cache

ROOT = paths.REPO
FIXTURES = paths.FIXTURES / "profiles"
FP = "test.fixture.node1"
ACCEPTED = {"allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput", "flashinfer_nvlink_one_sided"}


def make_vllm(calls: list):
    """A fake `vllm` package with `vllm.engine.arg_utils.EngineArgs`."""

    @dataclasses.dataclass
    class EngineArgs:
        model: str = "deepseek-ai/DeepSeek-V3"
        all2all_backend: str = "allgather_reducescatter"
        enable_expert_parallel: bool = True
        data_parallel_size: int = 2
        tensor_parallel_size: int = 1
        prefill_context_parallel_size: int = 1
        moe_backend: str = "auto"
        quantization: str | None = None
        max_num_seqs: int = 64
        max_num_batched_tokens: int = 1024
        kv_role: str | None = None
        enable_lora: bool = False
        pipeline_parallel_size: int = 1
        hf: dict = dataclasses.field(
            default_factory=lambda: {"hidden_size": 7168, "num_experts_per_tok": 8, "n_routed_experts": 256}
        )

        def create_engine_config(self, usage_context=None):
            calls.append(self.all2all_backend)
            if self.all2all_backend not in ACCEPTED:  # vLLM's pydantic Literal check
                raise ValueError(f"Input should be one of ... got {self.all2all_backend!r}")
            a2a = self.all2all_backend
            if self.moe_backend == "flashinfer_moe_ep_cutedsl":  # dispatches and combines itself
                if a2a != "allgather_reducescatter":
                    raise ValueError(f"moe_backend ... cannot be paired with all2all_backend={a2a!r}")
                a2a = "passthrough"
            tp, dp, ep = self.tensor_parallel_size, self.data_parallel_size, self.enable_expert_parallel
            return SimpleNamespace(
                model_config=SimpleNamespace(
                    hf_config=SimpleNamespace(**self.hf), dtype="torch.bfloat16", quantization=self.quantization
                ),
                parallel_config=SimpleNamespace(
                    all2all_backend=a2a,
                    enable_expert_parallel=ep,
                    data_parallel_size=dp,
                    tensor_parallel_size=tp,
                    prefill_context_parallel_size=self.prefill_context_parallel_size,
                    use_sequence_parallel_moe=ep and tp > 1 and dp > 1,
                    pipeline_parallel_size=self.pipeline_parallel_size,
                ),
                scheduler_config=SimpleNamespace(
                    max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens
                ),
                kv_transfer_config=SimpleNamespace(kv_role=self.kv_role) if self.kv_role else None,
                lora_config=SimpleNamespace(max_loras=1) if self.enable_lora else None,
                kernel_config=SimpleNamespace(moe_backend=self.moe_backend),
                usage_context=usage_context,
            )

    vllm = types.ModuleType("vllm")
    engine = types.ModuleType("vllm.engine")
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.EngineArgs = EngineArgs
    vllm.engine, engine.arg_utils = engine, arg_utils
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = Platform()
    vllm.platforms = platforms
    modules = {"vllm": vllm, "vllm.engine": engine, "vllm.engine.arg_utils": arg_utils, "vllm.platforms": platforms}
    return modules, EngineArgs


class Platform:
    """vLLM's ``current_platform`` as the plugin asks it: CUDA, compute capability 9.0 unless set."""

    def __init__(self, kind="cuda", capability=(9, 0)):
        self.kind, self.capability = kind, capability

    def is_cuda(self):
        return self.kind == "cuda"

    def is_rocm(self):
        return self.kind == "rocm"

    def is_cpu(self):
        return self.kind == "cpu"

    def get_device_capability(self):
        return SimpleNamespace(major=self.capability[0], minor=self.capability[1])


@pytest.fixture
def fake_vllm(monkeypatch, caplog, tmp_path):
    clear_cache()
    caplog.set_level(logging.INFO, logger="vllm.a2a_tune")  # (a2a_tune's warnings pass the root's WARNING)
    calls: list = []
    modules, engine_args = make_vllm(calls)
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    # A copy of the fixture table in which vLLM can express nvlink_one_sided (as deepep_low_latency).
    data = json.loads((FIXTURES / f"{FP}.json").read_text())
    data["backends"]["nvlink_one_sided"]["engines"]["vllm"] = "deepep_low_latency"
    (tmp_path / f"{FP}.json").write_text(json.dumps(data))
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("A2A_TUNE_FINGERPRINT", FP)
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "deepseek-ai/DeepSeek-V3"])
    # vLLM's environment with every backend's package importable (the tests that lack one say so)
    monkeypatch.setattr(vllm_plugin, "_missing_packages", lambda: [])
    monkeypatch.setattr(vllm_plugin, "_ONCE", {})  # a fresh vLLM process: its version read again
    for var in (
        "A2A_TUNE_VLLM_PLUGIN",
        "A2A_TUNE_PHASE",
        "A2A_TUNE_WORKLOAD",
        "A2A_TUNE_MAX_WORKSPACE_MIB",
        "VLLM_ALL2ALL_BACKEND",
    ):
        monkeypatch.delenv(var, raising=False)
    yield SimpleNamespace(
        EngineArgs=engine_args, calls=calls, dir=tmp_path, platform=modules["vllm.platforms"].current_platform
    )
    clear_cache()


def lines(caplog):
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name in ("vllm.a2a_tune", "a2a_tune")]


def test_sets_the_tables_backend_and_logs_one_line(fake_vllm, caplog):
    vllm_plugin.register()
    args = fake_vllm.EngineArgs()
    config = args.create_engine_config(usage_context="serve")
    # decode over 1..64 tokens/rank: nvlink_one_sided (vLLM literal deepep_low_latency here).
    assert config.parallel_config.all2all_backend == "deepep_low_latency"
    assert config.usage_context == "serve"  # arguments reach vLLM's own function
    assert fake_vllm.calls == ["allgather_reducescatter", "deepep_low_latency"]  # rebuilt by vLLM with the choice
    ((level, msg),) = lines(caplog)
    assert level == "INFO"
    assert msg.startswith(
        "a2a-tune: sets --all2all-backend deepep_low_latency (was 'allgather_reducescatter') for "
        "ep_size=2 hidden=7168 topk=8 experts=256 payload bf16, decode, 1..64 tokens/rank "
        "(default for an engine serving both phases) [hardware exact]; expected \u221215.3 us per MoE layer vs "
        "vLLM's default (allgather_reducescatter) (MoE layers unknown): profile test.fixture.node1.json"
    )
    assert "\n" not in msg


def test_a_workspace_budget_keeps_backends_above_it_out_and_says_so(fake_vllm, monkeypatch, caplog):
    """nvlink_one_sided holds 3072 MiB per rank in the table: under a 1024 MiB budget the decode
    engine keeps vLLM's default, and the one log line names what was skipped."""
    monkeypatch.setenv("A2A_TUNE_MAX_WORKSPACE_MIB", "1024")
    vllm_plugin.register()
    config = fake_vllm.EngineArgs().create_engine_config()
    assert config.parallel_config.all2all_backend == "allgather_reducescatter"
    assert fake_vllm.calls == ["allgather_reducescatter"]  # nothing to rebuild
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and "keeps --all2all-backend allgather_reducescatter" in msg
    assert msg.endswith("; workspace budget 1024 MiB: skipped nvlink_one_sided (3072 MiB)")
    monkeypatch.setenv("A2A_TUNE_MAX_WORKSPACE_MIB", "4096")  # room for it: the table's pick again
    assert fake_vllm.EngineArgs().create_engine_config().parallel_config.all2all_backend == "deepep_low_latency"


def test_prefill_engine_of_disaggregated_serving_gets_its_own_answer(fake_vllm, caplog):
    vllm_plugin.register()
    # A kv_producer only prefills: chunks of 1024 tokens/rank -> nccl_all2allv, which vLLM
    # cannot express; the fastest it can is its default.
    config = fake_vllm.EngineArgs(kv_role="kv_producer").create_engine_config()
    assert config.parallel_config.all2all_backend == "allgather_reducescatter"
    assert fake_vllm.calls == ["allgather_reducescatter"]  # nothing to rebuild
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and "keeps --all2all-backend allgather_reducescatter" in msg
    assert "prefill, 1024 tokens/rank per step (a kv_producer (prefill) engine)" in msg
    # ... and the decode side of the pair picks the decode backend.
    assert (
        fake_vllm.EngineArgs(kv_role="kv_consumer").create_engine_config().parallel_config.all2all_backend
        == "deepep_low_latency"
    )


def test_phase_and_workload_from_the_environment(fake_vllm, monkeypatch, caplog):
    vllm_plugin.register()
    monkeypatch.setenv("A2A_TUNE_PHASE", "prefill")
    assert fake_vllm.EngineArgs().create_engine_config().parallel_config.all2all_backend == "allgather_reducescatter"
    w = fake_vllm.dir / "steps.csv"
    w.write_text("1,10\n16,5\n")
    monkeypatch.setenv("A2A_TUNE_WORKLOAD", str(w))
    assert fake_vllm.EngineArgs().create_engine_config().parallel_config.all2all_backend == "deepep_low_latency"
    assert f"workload {w} ($A2A_TUNE_WORKLOAD)" in lines(caplog)[-1][1]


@pytest.mark.parametrize(
    "how",
    [
        ["--all2all-backend", "B"],
        ["--all2all-backend=B"],
        ["--all2all_backend", "B"],
        ["--all2all", "B"],  # argparse takes an unambiguous prefix
        ["--all2", "B"],
        ["--all2all-b=B"],
        "config_yaml",
        "non_default_value",
    ],
    ids=str,
)
def test_an_explicit_user_choice_is_never_overridden(how, fake_vllm, monkeypatch, caplog):
    vllm_plugin.register()
    backend = "allgather_reducescatter"
    if isinstance(how, list):
        monkeypatch.setattr(sys, "argv", ["vllm", "serve", "m", *(a.replace("B", backend) for a in how)])
    elif how == "config_yaml":
        cfg = fake_vllm.dir / "serve.yaml"
        cfg.write_text(f"# launch settings\nmodel: m\nall2all_backend: {backend}\nmax-num-seqs: 64\n")
        monkeypatch.setattr(sys, "argv", ["vllm", "serve", "--config", str(cfg)])
    else:
        backend = "deepep_high_throughput"
    config = fake_vllm.EngineArgs(all2all_backend=backend).create_engine_config()
    assert config.parallel_config.all2all_backend == backend
    assert fake_vllm.calls == [backend]
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and msg == f"a2a-tune: all2all backend {backend!r} was set explicitly; not changed"


@pytest.mark.parametrize(
    "argv",
    [
        ["--all", "x"],  # ambiguous for vLLM's parser (--allowed-*): vLLM refuses it anyway
        ["--all2all-backends", "x"],  # not the option
        ["--model", "--all2all-backend-config"],
        ["--config", "/nonexistent.yaml"],
    ],
)
def test_what_is_not_a_choice(argv, fake_vllm, monkeypatch, caplog):
    vllm_plugin.register()
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "m", *argv])
    monkeypatch.setenv("VLLM_ALL2ALL_BACKEND", "allgather_reducescatter")  # vLLM no longer reads it
    assert fake_vllm.EngineArgs().create_engine_config().parallel_config.all2all_backend == "deepep_low_latency"


def test_config_yaml_without_the_option_is_no_choice(fake_vllm, monkeypatch):
    vllm_plugin.register()
    cfg = fake_vllm.dir / "serve.yaml"
    cfg.write_text("model: m\nkv-transfer-config:\n  all2all_backend: nested, not an option\n")
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", f"--config={cfg}"])
    assert fake_vllm.EngineArgs().create_engine_config().parallel_config.all2all_backend == "deepep_low_latency"


def test_a_backend_vllm_set_itself_is_kept_without_a_second_build(fake_vllm, caplog):
    vllm_plugin.register()
    config = fake_vllm.EngineArgs(moe_backend="flashinfer_moe_ep_cutedsl").create_engine_config()
    assert config.parallel_config.all2all_backend == "passthrough"
    assert fake_vllm.calls == ["allgather_reducescatter"]  # one build
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and msg == (
        "a2a-tune: vLLM set all2all backend 'passthrough' itself (asked for 'allgather_reducescatter'); not changed"
    )


def test_no_all2all_without_expert_parallelism_across_ranks(fake_vllm, caplog):
    vllm_plugin.register()
    for kwargs in (
        {"enable_expert_parallel": False},
        {"data_parallel_size": 1},
        {"data_parallel_size": 1, "tensor_parallel_size": 2},
    ):
        caplog.clear()
        config = fake_vllm.EngineArgs(**kwargs).create_engine_config()
        assert config.parallel_config.all2all_backend == "allgather_reducescatter"
        ((level, msg),) = lines(caplog)
        assert level == "INFO" and "vLLM uses no all2all backend here" in msg


def test_expert_parallelism_over_prefill_context_parallel_ranks_uses_all2all(fake_vllm, caplog):
    # vLLM 0.33 runs all2all kernels with EP and PCP > 1 even at DP = 1; the EP group is TP x DP x PCP.
    vllm_plugin.register()
    config = fake_vllm.EngineArgs(data_parallel_size=1, prefill_context_parallel_size=2).create_engine_config()
    assert config.parallel_config.all2all_backend == "deepep_low_latency"
    assert "ep_size=2 hidden=7168" in lines(caplog)[0][1]


DSV3_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}


def _cfg_groups(acts):
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"input_activations": acts}}}


@pytest.mark.parametrize(
    "qcfg, dtype",
    [
        (DSV3_FP8, "fp8_e4m3"),  # DeepSeek-V3: block FP8, activations dispatched with 1x128 scales
        ({"quant_method": "awq", "bits": 4}, "bf16"),  # weight-only: activations in the model dtype
        (_cfg_groups(None), "bf16"),
        (_cfg_groups({"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128}), "fp8_e4m3"),
        # per-tensor / per-token FP8: block-FP8 is the nearest measured payload (said so)
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_e4m3"),
        (_cfg_groups({"num_bits": 8, "type": "float", "strategy": "token"}), "fp8_e4m3"),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}, "fp8_e4m3"),
        # NVFP4: vLLM quantizes to e2m1 + e4m3 scales per 16 before its all2all
        ({"quant_method": "modelopt_fp4"}, "nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
        (_cfg_groups({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}), "nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, "mxfp8"),
        ({"quant_method": "mxfp4"}, "bf16"),  # gpt-oss on Hopper: vLLM dispatches bf16 (said so)
        # what the table has no payload for: vLLM's default, one line with the reason
        ({"quant_method": "fp8", "weight_block_size": [64, 64]}, None),
        (_cfg_groups({"num_bits": 8, "type": "int", "strategy": "token"}), None),
        ({"quant_method": "bitsandbytes_fp3"}, None),
    ],
)
def test_payload_dtype_follows_the_checkpoints_quantization(qcfg, dtype, fake_vllm, caplog):
    vllm_plugin.register()
    hf = {"hidden_size": 7168, "num_experts_per_tok": 8, "n_routed_experts": 256, "quantization_config": qcfg}
    config = fake_vllm.EngineArgs(hf=hf, quantization=qcfg["quant_method"]).create_engine_config()
    ((level, msg),) = lines(caplog)
    if dtype is None:
        assert config.parallel_config.all2all_backend == "allgather_reducescatter"
        assert level == "WARNING" and "the table has no payload dtype for" in msg and "\n" not in msg
    else:
        assert f"experts=256 payload {dtype}" in msg and ", decode" in msg, msg
        assert "nearest measured payload" in msg if "per-tensor" in msg else True


def test_the_log_states_the_saving_per_step_over_the_models_moe_layers(fake_vllm, monkeypatch, caplog):
    """DeepSeek-V3's 61 layers, 3 dense: 58 MoE layers; with a TPOT, its share too."""
    monkeypatch.setenv("A2A_TUNE_TPOT_MS", "29.2")
    vllm_plugin.register()
    hf = {"hidden_size": 7168, "num_experts_per_tok": 8, "n_routed_experts": 256}
    hf |= {"num_hidden_layers": 61, "first_k_dense_replace": 3}
    fake_vllm.EngineArgs(hf=hf).create_engine_config()
    ((_, msg),) = lines(caplog)
    # the fixture table: decode 1..64, nvlink_one_sided 26.502 us against allgather 41.791 us
    saving_ms = (41.791 - 26.502) * 58 / 1000
    assert f"expected \u2212{saving_ms:.2f} ms per decode step vs vLLM's default (allgather_reducescatter) " in msg
    assert f"(58 MoE layers), \u2212{saving_ms / 29.2 * 100:.1f}% of a 29.2 ms TPOT" in msg


# case -> (prepare(fake, monkeypatch), EngineArgs keyword arguments)
FAILURES = {
    "no_table": (lambda f, mp: mp.setenv("A2A_TUNE_FINGERPRINT", "h100-sxm.nvl18x8.node1"), {}),
    "garbled_table": (lambda f, mp: (f.dir / f"{FP}.json").write_bytes(b"\x00\xff garbage"), {}),
    "truncated_table": (lambda f, mp: (f.dir / f"{FP}.json").write_text('{"schema": 2, "entries": ['), {}),
    "schema_99": (lambda f, mp: (f.dir / f"{FP}.json").write_text('{"schema": 99}'), {}),
    "unreadable_table": (lambda f, mp: _deny_reading(f.dir / f"{FP}.json", mp), {}),
    "probe_fails": (
        lambda f, mp: (
            mp.delenv("A2A_TUNE_FINGERPRINT"),
            mp.setattr(fingerprint_module, "_probe_child", _broken_probe),
        ),
        {},
    ),
    "dense_model": (lambda f, mp: None, {"hf": {"hidden_size": 4096}}),
    "shape_not_in_table": (lambda f, mp: None, {"data_parallel_size": 8}),
    "bad_phase_env": (lambda f, mp: mp.setenv("A2A_TUNE_PHASE", "mixed"), {}),
    "bad_workload_env": (lambda f, mp: mp.setenv("A2A_TUNE_WORKLOAD", str(f.dir / "missing.csv")), {}),
    "no_scheduler_limits": (lambda f, mp: None, {"max_num_seqs": None}),
    "vllm_rejects_choice": (
        lambda f, mp: mp.setattr(sys.modules[__name__], "ACCEPTED", ACCEPTED - {"deepep_low_latency"}),
        {},
    ),
}


def _deny_reading(path: Path, mp):
    import builtins

    def denying(real):
        def deny(file, *a, **k):
            if str(file) == str(path):
                raise PermissionError(13, "Permission denied", str(path))
            return real(file, *a, **k)

        return deny

    mp.setattr(builtins, "open", denying(builtins.open))
    mp.setattr(os, "open", denying(os.open))


def _broken_probe(timeout_s):
    """The probe's child, failing as it does on a host whose NVML cannot start."""
    raise fingerprint_module.ProbeError("the probe exited with code 1: NvmlQueryError: Unknown: boom")


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_any_failure_keeps_vllms_default_with_one_warning(case, fake_vllm, monkeypatch, caplog):
    vllm_plugin.register()
    prepare, kwargs = FAILURES[case]
    prepare(fake_vllm, monkeypatch)
    config = fake_vllm.EngineArgs(**kwargs).create_engine_config()
    assert config.parallel_config.all2all_backend == "allgather_reducescatter"
    recs = lines(caplog)
    assert [lvl for lvl, _ in recs] == ["WARNING"], recs
    msg = recs[0][1]
    assert msg.startswith("a2a-tune: ") and "\n" not in msg
    assert "allgather_reducescatter" in msg


def test_register_wraps_once_and_tolerates_reloading(fake_vllm):
    vllm_plugin.register()
    wrapped = fake_vllm.EngineArgs.create_engine_config
    vllm_plugin.register()  # vLLM may load plugins again in the same process
    assert fake_vllm.EngineArgs.create_engine_config is wrapped
    fake_vllm.EngineArgs().create_engine_config()
    assert fake_vllm.calls == ["allgather_reducescatter", "deepep_low_latency"]


def test_disabled_by_environment(fake_vllm, monkeypatch):
    monkeypatch.setenv("A2A_TUNE_VLLM_PLUGIN", "0")
    original = fake_vllm.EngineArgs.create_engine_config
    vllm_plugin.register()
    assert fake_vllm.EngineArgs.create_engine_config is original


def test_register_without_vllm_warns_once_and_returns(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vllm.a2a_tune")
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    vllm_plugin.register()
    ((level, msg),) = lines(caplog)
    assert level == "WARNING" and msg.startswith("a2a-tune: plugin not active (ModuleNotFoundError")


def test_engine_without_the_argument_is_left_alone(fake_vllm, monkeypatch, caplog):
    class OldEngineArgs:  # a vLLM from before --all2all-backend
        def create_engine_config(self):
            return SimpleNamespace(parallel_config=SimpleNamespace())

    monkeypatch.setattr(sys.modules["vllm.engine.arg_utils"], "EngineArgs", OldEngineArgs)
    vllm_plugin.register()
    OldEngineArgs().create_engine_config()
    ((level, msg),) = lines(caplog)
    assert level == "WARNING" and "no all2all_backend engine argument" in msg


def test_module_import_is_light():
    code = (
        "import sys, json; import a2a_tune.tuner.runtime.vllm_plugin as p; "
        "print(json.dumps([m for m in ('torch', 'vllm', 'sqlalchemy', 'pynvml', 'jsonschema', 'a2a_tune.tuner.runtime.lookup') "
        "if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_entry_point_is_declared_and_resolves():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["vllm.general_plugins"]["a2a_tune"]
    assert target == "a2a_tune.tuner.runtime.vllm_plugin:register"
    module, func = target.split(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), func))


# ------------------------------------------------------------------ what the plugin prints

EVIL = "ours\n\x1b]0;pwned\x07\x1b[2J"


def _safe(msg: str) -> bool:
    return "\n" not in msg and "\x1b" not in msg and "\x07" not in msg and len(msg) <= 2000


def test_a_backend_name_from_the_table_is_escaped_in_the_log_line(fake_vllm, caplog):
    # The table's name for the chosen backend carries a newline and escape sequences.
    path = fake_vllm.dir / f"{FP}.json"
    data = json.loads(path.read_text())
    data["backends"][EVIL] = data["backends"].pop("nvlink_one_sided")
    for e in data["entries"]:
        if "nvlink_one_sided" in e["backends"]:
            e["backends"][EVIL] = e["backends"].pop("nvlink_one_sided")
        e["winners"] = []
    data["tie_preference"] = [EVIL if b == "nvlink_one_sided" else b for b in data["tie_preference"]]
    path.write_text(json.dumps(data))
    vllm_plugin.register()
    config = fake_vllm.EngineArgs().create_engine_config()
    assert config.parallel_config.all2all_backend == "deepep_low_latency"  # what vLLM is told is its literal
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and _safe(msg) and "ours \\x1b]0;pwned\\x07\\x1b[2J expected" in msg


@pytest.mark.parametrize(
    "env, kwargs",
    [
        ({"A2A_TUNE_FINGERPRINT": "h" * 10_000}, {}),
        ({"A2A_TUNE_FINGERPRINT": "bad\n\x1b[2J"}, {}),
        ({"A2A_TUNE_PROFILE_DIR": "/nowhere/\x1b[31m\n" + "d" * 5000}, {}),
        ({"A2A_TUNE_WORKLOAD": "/tmp/\x1b[2J\nsteps.csv"}, {}),
        ({"A2A_TUNE_PHASE": "decode\x1b[2J" + "x" * 10_000}, {}),
        ({}, {"max_num_seqs": 10**4000}),  # a 4,000-digit batch
    ],
    ids=["10k-fingerprint", "control-fingerprint", "profile-dir", "workload-path", "phase", "4000-digit-batch"],
)
def test_what_the_environment_and_vllm_say_is_one_bounded_line(env, kwargs, fake_vllm, monkeypatch, caplog):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    vllm_plugin.register()
    fake_vllm.EngineArgs(**kwargs).create_engine_config()
    recs = lines(caplog)
    assert len(recs) == 1 and all(_safe(m) for _, m in recs), [m[:300] for _, m in recs]


def test_vllms_own_error_is_one_line(fake_vllm, monkeypatch, caplog):
    monkeypatch.setattr(sys.modules[__name__], "ACCEPTED", ACCEPTED - {"deepep_low_latency"})
    vllm_plugin.register()
    fake_vllm.EngineArgs().create_engine_config()
    ((level, msg),) = lines(caplog)
    assert level == "WARNING" and _safe(msg)
    assert msg.startswith("a2a-tune: vLLM refused all2all backend 'deepep_low_latency' (ValueError: Input should be")


def test_a_config_fifo_in_argv_never_blocks_the_engine(fake_vllm, monkeypatch, fifo):
    """vLLM's parser has drained the pipe already: an open() would wait forever (issue 31.3)."""
    import threading

    vllm_plugin.register()
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "--config", str(fifo), "--config=/dev/zero"])
    got = []
    t = threading.Thread(target=lambda: got.append(fake_vllm.EngineArgs().create_engine_config()), daemon=True)
    t.start()
    t.join(20)
    assert got, "create_engine_config blocked on a --config FIFO"
    assert got[0].parallel_config.all2all_backend == "deepep_low_latency"


PLUGIN_VARS = (
    "A2A_TUNE_VLLM_PLUGIN",
    "A2A_TUNE_PHASE",
    "A2A_TUNE_WORKLOAD",
    "A2A_TUNE_TPOT_MS",
    "A2A_TUNE_FINGERPRINT",
    "A2A_TUNE_PROFILE_DIR",
    "A2A_TUNE_MAX_WORKSPACE_MIB",
)


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("name", PLUGIN_VARS)
def test_every_variable_the_plugin_reads_survives_hostile_values(name, kind, fake_vllm, monkeypatch, caplog, fifo):
    """Empty, blank, 1 MB, a newline, terminal escapes, bytes that are not UTF-8, an unknown word,
    a FIFO, /dev/zero, a directory: the engine starts (at once), every line is one safe line, a
    blank value is the variable unset, and a value the plugin does not take is said, not
    silently dropped."""
    import threading

    value = hostile(kind, fifo, fake_vllm.dir)
    monkeypatch.setenv(name, value)
    got = []
    vllm_plugin.register()
    t = threading.Thread(target=lambda: got.append(fake_vllm.EngineArgs().create_engine_config()), daemon=True)
    t.start()
    t.join(30)
    assert got, f"{name}={kind} blocked the engine's start-up"
    recs = lines(caplog)
    assert recs and all(_safe(m) for _, m in recs), [m[:300] for _, m in recs]
    said = " ".join(m for _, m in recs)
    if kind in BLANK:  # unset: nothing is said about it; the fixture's table answers (if still found)
        assert name not in said and "invalid" not in said and "cannot read" not in said, said
        if name not in ("A2A_TUNE_FINGERPRINT", "A2A_TUNE_PROFILE_DIR"):  # unset, these find no fixture
            assert got[0].parallel_config.all2all_backend == "deepep_low_latency", said
    elif name == "A2A_TUNE_VLLM_PLUGIN":  # not a word it takes: said, and the plugin stays on
        assert recs[0][0] == "WARNING" and recs[0][1].startswith(f"a2a-tune: {name}="), recs[0]
        assert "the plugin stays on" in recs[0][1]
        assert got[0].parallel_config.all2all_backend == "deepep_low_latency"
    elif name == "A2A_TUNE_TPOT_MS":  # the choice stands; the ignored TPOT is said in its line
        ((level, msg),) = recs
        assert level == "WARNING" and f"${name}=" in msg and "ignored: not a positive number of ms" in msg, msg
        assert got[0].parallel_config.all2all_backend == "deepep_low_latency"


# --------------------------------------------------------------------------- start-up rules


@pytest.mark.parametrize(
    "setup, why",
    [
        (
            dict(enable_lora=True),
            "excluded by start-up rules: nvlink_one_sided (lora_ep: LoRA with EP: vLLM accepts only allgather_reducescatter)",
        ),
        (
            dict(platform=("cpu", None)),
            "nvlink_one_sided (platform_cpu: vLLM's CPU platform runs only allgather_reducescatter)",
        ),
        (dict(missing=["deep_ep"]), "nvlink_one_sided (package: deep_ep not importable in vLLM's environment)"),
    ],
)
def test_a_backend_the_engine_cannot_start_with_never_competes(setup, why, fake_vllm, monkeypatch, caplog):
    if "platform" in setup:
        fake_vllm.platform.kind = setup["platform"][0]
    if "missing" in setup:
        monkeypatch.setattr(vllm_plugin, "_missing_packages", lambda: setup["missing"])
    vllm_plugin.register()
    config = fake_vllm.EngineArgs(enable_lora=setup.get("enable_lora", False)).create_engine_config()
    assert config.parallel_config.all2all_backend == "allgather_reducescatter"
    assert fake_vllm.calls == ["allgather_reducescatter"]  # nothing to rebuild
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and why in msg and "Traceback" not in msg, msg


def test_a_platform_without_rules_keeps_vllms_default_and_says_why(fake_vllm, caplog):
    fake_vllm.platform.kind = "tpu"
    vllm_plugin.register()
    config = fake_vllm.EngineArgs().create_engine_config()
    assert (config.parallel_config.all2all_backend, fake_vllm.calls) == (
        "allgather_reducescatter",
        ["allgather_reducescatter"],
    )
    ((level, msg),) = lines(caplog)
    assert level == "WARNING" and "has no start-up rules here" in msg


def test_a_newer_vllm_keeps_the_nearest_rules_and_says_so(fake_vllm, monkeypatch, caplog):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.99.0")
    vllm_plugin.register()
    config = fake_vllm.EngineArgs().create_engine_config()
    assert config.parallel_config.all2all_backend == "deepep_low_latency"
    ((_, msg),) = lines(caplog)
    assert "vLLM 0.99.0: rules read from 0.33.0, the nearest known" in msg


def test_a_moe_method_without_the_modular_kernel_keeps_allgather_reducescatter(fake_vllm, caplog):
    """compressed-tensors W4A16 with --moe-backend flydsl: vLLM 0.33 dispatches it through
    dispatch_router_logits, which only allgather_reducescatter implements (rule naive_dispatch)."""
    w4a16 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}
    qcfg = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": w4a16, "input_activations": None}}}
    hf = {"hidden_size": 7168, "num_experts_per_tok": 8, "n_routed_experts": 256, "quantization_config": qcfg}
    vllm_plugin.register()
    args = fake_vllm.EngineArgs(hf=hf, quantization="compressed-tensors", moe_backend="flydsl")
    assert args.create_engine_config().parallel_config.all2all_backend == "allgather_reducescatter"
    ((level, msg),) = lines(caplog)
    assert level == "INFO" and "(naive_dispatch: MoE method without the modular kernel" in msg, msg


@pytest.mark.parametrize(
    "layers",
    [{"num_hidden_layers": 10**309}, {"num_hidden_layers": 61, "mlp_only_layers": [[1]]}],
    ids=["huge_layer_count", "nested_dense_layers"],
)
def test_a_cosmetic_field_out_of_bounds_keeps_the_tables_choice(fake_vllm, monkeypatch, caplog, layers):
    """The layer count only words the saving (issue 35 items 13, 15): out of bounds, the saving is
    said per layer and the table's choice stands."""
    vllm_plugin.register()
    hf = {"hidden_size": 7168, "num_experts_per_tok": 8, "n_routed_experts": 256}
    chosen = fake_vllm.EngineArgs(hf=hf).create_engine_config().parallel_config.all2all_backend
    caplog.clear()
    config = fake_vllm.EngineArgs(hf=hf | layers).create_engine_config()
    ((level, msg),) = lines(caplog)
    assert config.parallel_config.all2all_backend == chosen != "allgather_reducescatter"
    assert level == "INFO" and "(MoE layers unknown)" in msg, msg
