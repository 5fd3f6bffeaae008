"""The plugin and the printed launch lines against the real engines (vLLM 0.33.0, SGLang 0.5.23).

Needs the environment ``.ci/engines.sh`` builds (CI runs it before the tests; elsewhere
``bash .ci/engines.sh`` once, or point ``A2A_TUNE_ENGINES_PYTHON`` at another); skipped
without it. vLLM runs on its CPU platform on a local DeepSeek-V3-shaped ``config.json`` (no
weights): ``vllm serve``'s parser, ``AsyncEngineArgs``, plugin loading through the entry
point and ``create_engine_config``, one driver process for every scenario
(tests/support/engines_driver.py). Each backend vLLM ends up with is compared with what
``a2a-tune lookup --format vllm`` prints for the same shape and phase.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from engines_driver import MARK, SPELLINGS

from a2a_tune.tuner.runtime import engine_rules, engines
from a2a_tune.tuner.runtime.vllm_plugin import _names_option

ROOT = paths.REPO
ENGINES_PYTHON = Path(os.environ.get("A2A_TUNE_ENGINES_PYTHON") or ROOT / ".venv-engines" / "bin" / "python")

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(900),  # the first test starts vLLM once for every scenario (~1 min, more under load)
    pytest.mark.skipif(
        not ENGINES_PYTHON.exists(), reason=f"no engines environment ({ENGINES_PYTHON}): .ci/engines.sh"
    ),
]

DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-06,
    "vocab_size": 129280,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
}
BLOCK_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def _ct(weights: dict, acts: dict | None) -> dict:
    """A compressed-tensors quantization_config with one scheme over the Linear layers."""
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group}}


_NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
_FP8_BLOCK_W = {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}
_FP8_GROUP_A = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True}
# Checkpoint quantizations (quantization_config of config.json, no weights) -> the payload vLLM
# 0.33's all2all carries for them, as the plugin's log names it (None: vLLM's default kept).
QUANTIZATIONS = {
    "modelopt_nvfp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "nvfp4"),
    "ct_nvfp4": (_ct(_NVFP4, {**_NVFP4, "dynamic": "local"}), "nvfp4"),
    "ct_fp8_groups": (_ct(_FP8_BLOCK_W, _FP8_GROUP_A), "fp8_e4m3"),
    "per_tensor_fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_e4m3"),
    "mxfp4": ({"quant_method": "mxfp4"}, "bf16"),
    "unknown_method": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]}, None),
}
SHAPE = ("--ep-size", "2", "--hidden", "7168", "--topk", "8", "--experts", "256")
SHIPPED_FP = "h200.nvl18x2.node1"
TEST_FP = "test.engines.node1"

# A table where decode and prefill disagree (DeepSeek-V3's shape, bf16, EP 2): DeepEP's
# low-latency kernels win small steps, its high-throughput kernels large ones, and ours
# (no vLLM literal) is fastest everywhere -- so vLLM's answer shows the engine filter too.
TOKENS = (1, 16, 128, 1024, 8192)
CURVES = {
    "deepep_low_latency": (20, 22, 40, 300, 2400),
    "deepep_high_throughput": (80, 85, 100, 200, 1200),
    "allgather_reducescatter": (60, 70, 150, 900, 7000),
    "nvlink_one_sided": (10, 11, 20, 150, 1000),
}


# The quantized payloads' entries (same shape): DeepEP does not carry NVFP4 or MXFP8, FlashInfer's
# one-sided kernels do and are the fastest vLLM can be told there; per-tensor and block FP8 share
# fp8_e4m3 (DeepEP carries it).
QUANTIZED_CURVES = {
    "flashinfer_nvlink_one_sided": (15, 16, 30, 200, 1500),
    "allgather_reducescatter": (60, 70, 150, 900, 7000),
    "nvlink_one_sided": (10, 11, 20, 150, 1000),
}
PAYLOAD_CURVES = {"bf16": CURVES, "fp8_e4m3": CURVES, "nvfp4": QUANTIZED_CURVES, "mxfp8": QUANTIZED_CURVES}


def _phase_table(directory: Path) -> None:
    from a2a_tune.kernels.registry import engine_names
    from a2a_tune.tuner.runtime.measurement import Measurement
    from a2a_tune.tuner.select import build_profile, write_profile

    shape = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, routing="uniform")
    ms = [
        Measurement.from_columns(
            dict(
                shape,
                dtype=d,
                backend=b,
                tokens_per_rank=t,
                timing="eager",
                median_us=float(v),
                p10_us=v * 0.99,
                p90_us=v * 1.01,
            )
        )
        for d, curves in PAYLOAD_CURVES.items()
        for b, values in curves.items()
        for t, v in zip(TOKENS, values)
    ]
    hardware = {"fingerprint": TEST_FP, "facts_hash": "0" * 16, "facts": {"gpus": [{"name": "Test GPU"}] * 2}}
    run = {"id": 1, "device_type": "cuda", "world_size": 2, "versions": {}, "started_at": dt.datetime(2026, 12, 1)}
    write_profile(build_profile(ms, [], hardware=hardware, run=run, backend_names=engine_names()), directory)


def _scenarios(tmp: Path) -> list:
    bf16, fp8 = tmp / "dsv3-bf16", tmp / "dsv3-fp8"
    for d, extra in ((bf16, {}), (fp8, {"quantization_config": BLOCK_FP8})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**DSV3, **extra}))
    for name, (qcfg, _) in QUANTIZATIONS.items():
        (tmp / f"dsv3-{name}").mkdir()
        (tmp / f"dsv3-{name}" / "config.json").write_text(json.dumps({**DSV3, "quantization_config": qcfg}))
    tables, empty = tmp / "tables", tmp / "empty"
    tables.mkdir()
    empty.mkdir()
    _phase_table(tables)
    yaml = tmp / "serve.yaml"
    yaml.write_text("max-model-len: 8192\nall2all_backend: allgather_reducescatter\n")
    common = ["--skip-tokenizer-init", "--max-model-len", "8192", "--max-num-seqs", "64"]
    common += ["--max-num-batched-tokens", "8192", "--enable-expert-parallel"]
    dp2 = ["--data-parallel-size", "2"]
    ours = {"A2A_TUNE_PROFILE_DIR": str(tables), "A2A_TUNE_FINGERPRINT": TEST_FP}
    shipped = {"A2A_TUNE_PROFILE_DIR": str(empty), "A2A_TUNE_FINGERPRINT": SHIPPED_FP}

    def kv(role):
        return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": role})]

    sc = [
        ("decode", [str(bf16), *common, *dp2], ours),
        ("kv_producer", [str(bf16), *common, *dp2, *kv("kv_producer")], ours),
        ("kv_consumer", [str(bf16), *common, *dp2, *kv("kv_consumer")], ours),
        ("phase_env_prefill", [str(bf16), *common, *dp2], {**ours, "A2A_TUNE_PHASE": "prefill"}),
        ("pcp_dp1", [str(bf16), *common, "--prefill-context-parallel-size", "2"], ours),
        ("stale_env_var", [str(bf16), *common, *dp2], {**ours, "VLLM_ALL2ALL_BACKEND": "allgather_reducescatter"}),
        ("block_fp8_shipped_decode", [str(fp8), *common, *dp2], shipped),
        ("block_fp8_shipped_prefill", [str(fp8), *common, *dp2, *kv("kv_producer")], shipped),
        ("passthrough", [str(bf16), *common, *dp2, "--moe-backend", "flashinfer_moe_ep_cutedsl"], ours),
        (
            "no_table",
            [str(bf16), *common, *dp2],
            {"A2A_TUNE_PROFILE_DIR": str(empty), "A2A_TUNE_FINGERPRINT": "h100.nvl8x8.node1"},
        ),
        ("no_expert_parallel", [str(bf16), *[a for a in common if a != "--enable-expert-parallel"], *dp2], ours),
        ("config_yaml", [str(bf16), *common, *dp2, "--config", str(yaml)], ours),
    ]
    for name in QUANTIZATIONS:
        sc.append((f"quant {name}", [str(tmp / f"dsv3-{name}"), *common, *dp2], ours))
    for spelling in ("--all2all-backend", "--all2all_backend", "--all2all", "--all2all-b"):
        sc.append((f"explicit {spelling}", [str(bf16), *common, *dp2, spelling, "allgather_reducescatter"], ours))
    sc.append(("explicit =", [str(bf16), *common, *dp2, "--all2all-backend=allgather_reducescatter"], ours))
    # The answers above are those of a Hopper engine with every backend's package installed;
    # vLLM builds its config on its CPU platform here, the plugin reads the emulated facts.
    hopper = {"platform": "cuda:9.0", "packages": "all"}
    out = [{"name": n, "argv": a, "env": e, "emulate": hopper} for n, a, e in sc]
    # The two scenarios, with the shipped 2xH200 table, and vLLM's real CPU platform.
    out += [
        {
            "name": "lora_shipped",
            "argv": [str(bf16), *common, *dp2, "--enable-lora"],
            "env": shipped,
            "emulate": hopper,
        },
        {
            "name": "no_flashinfer_shipped",
            "argv": [str(bf16), *common, *dp2],
            "env": shipped,
            "emulate": {"platform": "cuda:9.0"},
        },
        {"name": "cpu_platform", "argv": [str(bf16), *common, *dp2], "env": ours},
    ]
    return out


def _drive(kind: str, payload, tmp: Path) -> list:
    spec = tmp / f"{kind}.json"
    spec.write_text(json.dumps(payload))
    # VLLM_USE_V2_MODEL_RUNNER: without Triton on CPU vLLM falls back to its V1 runner, which
    # refuses prefill context parallelism at config time; the all2all choice does not depend on it.
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    r = subprocess.run(
        [str(ENGINES_PYTHON), str(ROOT / "tests" / "support" / "engines_driver.py"), kind, str(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=900,
    )
    lines = [json.loads(line[len(MARK) :]) for line in r.stdout.splitlines() if line.startswith(MARK)]
    assert r.returncode == 0 and lines, f"driver failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return lines


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    scenarios = _scenarios(tmp)
    results = {r["name"]: r for r in _drive("vllm", scenarios, tmp)}
    return {s["name"]: (s, results.get(s["name"])) for s in scenarios} | {"parser": (None, results["parser"])}


def _lookup_vllm(scenario: dict, result: dict) -> str:
    """What `a2a-tune lookup --format vllm` prints for the scenario's shape and phase."""
    fp8 = "dsv3-fp8" in scenario["argv"][0]
    prefill = result["kv_role"] == "kv_producer" or scenario["env"].get("A2A_TUNE_PHASE") == "prefill"
    ep = result["data_parallel_size"] * result["tensor_parallel_size"] * result["prefill_context_parallel_size"]
    args = ["--ep-size", str(ep), *SHAPE[2:], "--dtype", "fp8_e4m3" if fp8 else "bf16"]
    if prefill:
        args += ["--phase", "prefill", "--max-tokens", str(result["max_num_batched_tokens"])]
    else:
        args += ["--phase", "decode", "--max-batch", str(result["max_num_seqs"])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2A_TUNE_")} | scenario["env"]
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", "lookup", *args, "--format", "vllm"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _ours(result) -> list:
    return [(lvl, msg) for lvl, msg in result["records"] if msg.startswith("a2a-tune")]


@pytest.mark.parametrize(
    "name, literal",
    [
        ("decode", "deepep_low_latency"),
        ("kv_consumer", "deepep_low_latency"),
        ("kv_producer", "deepep_high_throughput"),
        ("phase_env_prefill", "deepep_high_throughput"),
        ("pcp_dp1", "deepep_low_latency"),  # EP over PCP ranks at DP = 1 runs all2all kernels too
        ("stale_env_var", "deepep_low_latency"),  # vLLM no longer reads VLLM_ALL2ALL_BACKEND
        ("block_fp8_shipped_decode", "flashinfer_nvlink_one_sided"),
        ("block_fp8_shipped_prefill", "flashinfer_nvlink_one_sided"),
    ],
)
def test_vllm_starts_with_what_lookup_prints(vllm_runs, name, literal):
    scenario, result = vllm_runs[name]
    assert result and "error" not in result, result
    assert result["all2all_backend"] == literal
    assert _lookup_vllm(scenario, result) == f"--all2all-backend {literal}"
    assert result["builds"] == 2  # vLLM's default, then the choice, validated by vLLM's own rules
    ((level, msg),) = _ours(result)
    assert level == "INFO" and msg.startswith(
        f"a2a-tune: sets --all2all-backend {literal} (was 'allgather_reducescatter')"
    )
    dtype = "fp8_e4m3" if "fp8" in name else "bf16"
    assert f"ep_size=2 hidden=7168 topk=8 experts=256 payload {dtype}" in msg


@pytest.mark.parametrize(
    "name",
    ["config_yaml", "explicit --all2all-backend", "explicit --all2all_backend", "explicit --all2all"]
    + ["explicit --all2all-b", "explicit ="],
)
def test_vllm_keeps_an_explicit_choice_in_any_spelling_its_parser_takes(vllm_runs, name):
    _, result = vllm_runs[name]
    assert result and "error" not in result, result
    assert (result["all2all_backend"], result["builds"]) == ("allgather_reducescatter", 1)
    assert _ours(result) == [
        ("INFO", "a2a-tune: all2all backend 'allgather_reducescatter' was set explicitly; not changed")
    ]


def test_vllm_keeps_the_passthrough_it_binds_itself_without_another_build(vllm_runs):
    _, result = vllm_runs["passthrough"]
    assert result and "error" not in result, result
    assert (result["all2all_backend"], result["builds"]) == ("passthrough", 1)
    ours = _ours(result)
    assert [lvl for lvl, _ in ours] in ([], ["INFO"]) and not any(lvl == "WARNING" for lvl, _ in result["records"])


def test_vllm_keeps_its_default_with_one_warning_without_a_table(vllm_runs):
    _, result = vllm_runs["no_table"]
    assert result and "error" not in result, result
    assert (result["all2all_backend"], result["builds"]) == ("allgather_reducescatter", 1)
    ((level, msg),) = _ours(result)
    assert level == "WARNING" and "no profile for fingerprint 'h100.nvl8x8.node1'" in msg and "\n" not in msg


def test_vllm_without_expert_parallelism_is_left_alone(vllm_runs):
    _, result = vllm_runs["no_expert_parallel"]
    assert (result["all2all_backend"], result["builds"]) == ("allgather_reducescatter", 1)
    ((level, msg),) = _ours(result)
    assert level == "INFO" and "nothing to choose" in msg


def test_vllm_literals_match_its_parser(vllm_runs):
    parser = vllm_runs["parser"][1]
    # Offered by the parser but never printed: removed backends vLLM replaces, and an alias.
    assert set(parser["choices"]) == engines.ACCEPTED["vllm"] | {"naive", "pplx", "flashinfer_all2allv"}
    assert set(parser["literal"]) - set(parser["choices"]) == engines.VLLM_INTERNAL
    assert parser["spellings"] == {s: _names_option(s[2:]) for s in SPELLINGS}
    assert parser["spellings"]["--all2all"] and not parser["spellings"]["--all"]


def test_sglang_takes_every_line_lookup_prints(tmp_path):
    # Each table answer SGLang can get: DeepEP in both modes, FlashInfer, and its default.
    from a2a_tune.kernels.registry import engine_names

    expected, arg_lists = [], []
    for spec in engine_names().values():
        literal, options = spec["engines"]["sglang"], tuple(spec["engine_options"].get("sglang", ()))
        line = engines.engine_flag("sglang", literal, options)
        arg_lists.append(line.split())
        mode = options[1] if options else "auto"  # SGLang's default mode
        expected.append({"moe_a2a_backend": literal or "none", "deepep_mode": mode})
    (out,) = _drive("sglang", arg_lists, tmp_path)
    assert set(out["moe_a2a_backend"]) == engines.ACCEPTED["sglang"]
    assert out["moe_a2a_backend_default"] == engines.DEFAULT["sglang"]
    assert set(out["deepep_mode"]) == engines.OPTION_CHOICES["sglang"]["--deepep-mode"]
    assert out["parsed"] == expected


@pytest.mark.parametrize("name", list(QUANTIZATIONS))
def test_vllm_quantizations_look_up_the_payload_vllm_dispatches(vllm_runs, name):
    """The real vLLM 0.33 config of a checkpoint with that quantization_config: the plugin names
    the payload its all2all carries and looks the table up with it (one line, never a traceback);
    an unknown one keeps vLLM's default with the reason."""
    _, result = vllm_runs[f"quant {name}"]
    assert result, name
    if "error" in result:  # vLLM itself refused the config (e.g. a method its CPU platform lacks)
        pytest.skip(f"vLLM 0.33 refuses this config on its CPU platform: {result['error'][:200]}")
    ((level, msg),) = _ours(result)
    assert "\n" not in msg and "Traceback" not in msg
    dtype = QUANTIZATIONS[name][1]
    if dtype is None:
        assert level == "WARNING" and "the table has no payload dtype for" in msg, msg
        assert result["all2all_backend"] == "allgather_reducescatter"
        return
    assert f"experts=256 payload {dtype}" in msg, msg
    # decode 1..64: nvlink_one_sided fastest (no vLLM literal); vLLM's fastest: DeepEP low latency
    # where it carries the payload (bf16, FP8), FlashInfer's one-sided where it does not (NVFP4)
    literal = "flashinfer_nvlink_one_sided" if dtype in ("nvfp4", "mxfp8") else "deepep_low_latency"
    assert result["all2all_backend"] == literal, msg
    assert "ms per decode step vs vLLM's default (allgather_reducescatter) (58 MoE layers)" in msg, msg


@pytest.mark.parametrize(
    "name, rule",
    [
        ("lora_shipped", "lora_ep: LoRA with EP: vLLM accepts only allgather_reducescatter"),
        ("no_flashinfer_shipped", "package: flashinfer not importable in vLLM's environment"),
        ("cpu_platform", "platform_cpu: vLLM's CPU platform runs only allgather_reducescatter"),
    ],
)
def test_vllm_keeps_its_default_where_the_tables_backend_cannot_start(vllm_runs, name, rule):
    """--enable-lora with the shipped 2xH200 table (whose answer is flashinfer_nvlink_one_sided),
    FlashInfer not importable in vLLM's environment (this one's real state), vLLM's real CPU
    platform: allgather_reducescatter, one INFO line naming the rule, no second build."""
    _, result = vllm_runs[name]
    assert result and "error" not in result, result
    assert (result["all2all_backend"], result["builds"]) == ("allgather_reducescatter", 1)
    ((level, msg),) = _ours(result)
    assert level == "INFO" and rule in msg and "Traceback" not in msg, msg


@pytest.fixture(scope="module")
def revert_failures(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("revert")
    (tmp / "dsv3").mkdir()
    (tmp / "dsv3" / "config.json").write_text(json.dumps(DSV3))
    (tmp / "empty").mkdir()
    argv = [str(tmp / "dsv3"), "--skip-tokenizer-init", "--max-model-len", "8192", "--max-num-seqs", "64"]
    argv += ["--enable-expert-parallel", "--data-parallel-size", "2"]
    spec = {"argv": argv, "env": {"A2A_TUNE_PROFILE_DIR": str(tmp / "empty"), "A2A_TUNE_FINGERPRINT": SHIPPED_FP}}
    return {r["name"]: r for r in _drive("failures", spec, tmp)}


# vLLM PR 53952 reverted flashinfer_nvlink_one_sided as the default for these four failures:
# (case, platform the plugin reads, vLLM's message when the one-sided backend is forced).
REVERT_FAILURES = [
    (
        "sm89_unquantized",
        "cuda:8.9",
        "NotImplementedError: No Unquantized MoE backend supports the deployment configuration. "
        "(raised in vllm/model_executor/layers/fused_moe/oracle/unquantized.py:select_unquantized_moe_backend)",
    ),
    (
        "lora_with_ep",
        "cuda:9.0",
        "AssertionError: Fused MoE LoRA with EP currently only supports all2all_backend='allgather_reducescatter', "
        "got 'flashinfer_nvlink_one_sided'. (raised in vllm/lora/layers/fused_moe.py:_ep_check)",
    ),
    (
        "rocm",
        "rocm",
        "AssertionError: FlashInfer MoEEpCommunication NVLink one-sided API not found. Please install FlashInfer "
        "0.7.2 or later. (raised in vllm/distributed/device_communicators/all2all.py:__init__)",
    ),
    (
        "naive_dispatch",
        "cuda:9.0",
        "NotImplementedError:  (raised in vllm/distributed/device_communicators/base_device_communicator.py:"
        "dispatch_router_logits)",
    ),
]


@pytest.mark.parametrize("case, platform, message", REVERT_FAILURES)
def test_the_reverts_failures_with_vllms_own_code_and_the_plugins_answer_passes(
    revert_failures, case, platform, message
):
    """Each failure with vLLM 0.33's own code under the platform it needs (emulated around that
    code, tests/support/engines_driver.py): forcing flashinfer_nvlink_one_sided fails with vLLM's
    message; the plugin's answer on the shipped 2xH200 table (decode, DSV3 bf16, DP 2 x EP 2) and
    the lookup's answer for the deployment's facts pass the same check."""
    result = revert_failures[case]
    assert "error" not in result, result
    assert result["platform"] == platform
    assert result["forced_error"] == message
    for answer in ("answer", "rules_answer"):
        assert result[answer] != "flashinfer_nvlink_one_sided" and result[f"{answer}_error"] is None, result
    assert "Traceback" not in result["decision"] and "\n" not in result["decision"]


def _site_packages() -> Path:
    (site,) = (ENGINES_PYTHON.parent.parent / "lib").glob("python3*/site-packages")
    return site


def _function_source(path: Path, qualname: str) -> str | None:
    """The source of ``qualname`` (``f`` or ``Class.method``) in the Python file ``path``, or None."""
    import ast

    text = path.read_text()
    scope, node = ast.parse(text).body, None
    for part in qualname.split("."):
        node = next((n for n in scope if getattr(n, "name", None) == part), None)
        if node is None:
            return None
        scope = getattr(node, "body", [])
    return ast.get_source_segment(text, node)


@pytest.mark.parametrize(
    "rule", [r for r in engine_rules.RULES if r.engine in ("vllm", "sglang")], ids=lambda r: f"{r.engine}-{r.name}"
)
def test_each_rule_still_reads_so_in_the_installed_engine(rule):
    """Drift: every cited function still holds the cited condition in the engine CI installs (a
    new vLLM or SGLang that moved or changed it fails here, and the rule is read again)."""
    site = _site_packages()
    installed = {d.name[: -len(".dist-info")].split("-")[1] for d in site.glob(f"{rule.engine}-*.dist-info")}
    assert installed == {rule.version}, f"rules read from {rule.engine} {rule.version}, installed {installed}"
    for cite in rule.cites:
        path = site / cite.file
        assert path.is_file(), f"{rule.name}: {cite.file} is gone"
        source = _function_source(path, cite.function)
        assert source is not None, f"{rule.name}: {cite.function} is gone from {cite.file}"
        assert cite.needle in source, f"{rule.name}: {cite.function} no longer holds {cite.needle!r}"


def test_moe_runners_are_sglangs_choices():
    """lookup --moe-runner takes SGLang's --moe-runner-backend choices (read without importing SGLang)."""
    import ast

    text = (_site_packages() / "sglang" / "srt" / "arg_groups" / "choices.py").read_text()
    (node,) = [
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "MOE_RUNNER_BACKEND_CHOICES"
    ]
    assert tuple(ast.literal_eval(node.value)) == engine_rules.MOE_RUNNERS
