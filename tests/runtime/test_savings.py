"""The answer in the engine's units (runtime.savings): the engine's default by its rule, the
saving per layer scaled to a step and a TPOT, and the sentence the plugin and lookup print."""

from __future__ import annotations

import pytest

from a2a_tune.tuner.policies import registry_names
from a2a_tune.tuner.runtime.models import moe_layer_count
from a2a_tune.tuner.runtime.savings import default_backends, in_engine_units, sentence

NAMES = registry_names()  # backend -> BackendNames: the engines' literals the kernels declare


def test_each_engines_default_is_its_own_rule_on_what_ran_here():
    both = {"allgather_reducescatter", "allgather_reducescatter_padded"}  # one literal, two of ours
    measured = [*sorted(both), "flashinfer_nvlink_one_sided", "deepep_low_latency", "nvlink_one_sided"]
    assert default_backends("vllm", NAMES, measured, 256, 8) == ("allgather_reducescatter", both)
    assert default_backends("sglang", NAMES, measured, 256, 8)[1] == both  # none: all-gather and reduce
    # TensorRT-LLM: the first of its priority list that ran here
    assert default_backends("trtllm", NAMES, measured, 256, 8) == ("NVLINK_ONE_SIDED", {"flashinfer_nvlink_one_sided"})
    without = [b for b in measured if b != "flashinfer_nvlink_one_sided"]
    assert default_backends("trtllm", NAMES, without, 256, 8) == ("DEEPEPLOWLATENCY", {"deepep_low_latency"})
    # experts that do not divide over the ranks: NVLINK_ONE_SIDED or ALLGATHER only
    assert default_backends("trtllm", NAMES, without, 255, 8)[0] == "ALLGATHER"


def test_the_saving_per_step_is_per_layer_times_moe_layers_and_a_share_of_tpot():
    per_layer = {"engine": "vllm", "engine_default": "allgather_reducescatter", "default_us": 40.0}
    per_layer["saving_us_per_layer"] = 22.5
    vs = in_engine_units(per_layer, 58, 29.2)
    assert vs["saving_ms_per_step"] == pytest.approx(22.5 * 58 / 1000) and vs["moe_layers"] == 58
    assert vs["share_of_tpot"] == pytest.approx(22.5 * 58 / 1000 / 29.2, abs=1e-4)
    assert sentence(vs, "decode") == (
        "expected \u22121.30 ms per decode step vs vLLM's default (allgather_reducescatter) (58 MoE layers), "
        "\u22124.5% of a 29.2 ms TPOT"
    )
    unknown = in_engine_units(per_layer)
    assert unknown["saving_ms_per_step"] is None and "us per MoE layer" in sentence(unknown)
    slower = in_engine_units({**per_layer, "saving_us_per_layer": -5.0}, 10)
    assert sentence(slower, "prefill").startswith("expected +0.05 ms per prefill step")
    assert sentence(in_engine_units({**per_layer, "saving_us_per_layer": 0.0}, 10)).startswith("expected 0.00 ms")
    assert in_engine_units({}) is None and sentence(None) == ""


@pytest.mark.parametrize(
    "config, layers",
    [
        ({"num_hidden_layers": 61, "first_k_dense_replace": 3}, 58),  # DeepSeek-V3 / V3.2
        ({"text_config": {"num_hidden_layers": 48, "interleave_moe_layer_step": 2}}, 24),  # Llama 4 Maverick
        ({"num_hidden_layers": 24}, 24),  # gpt-oss: every layer
        ({"num_hidden_layers": 48, "mlp_only_layers": [0, 1]}, 46),  # Qwen MoE with dense layers
        ({"hidden_size": 7168}, None),  # no layer count: unknown, not guessed
    ],
)
def test_moe_layers_are_the_layers_less_the_dense_ones(config, layers):
    assert moe_layer_count(config) == layers
