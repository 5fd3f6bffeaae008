import json

import pytest

from a2a_tune.tuner.shapes import ShapeSpecError, from_model_config, preset, presets


def test_presets_hold_the_four_reference_models():
    p = presets()
    assert (p["deepseek-v3"].num_experts, p["deepseek-v3"].topk, p["deepseek-v3"].hidden) == (256, 8, 7168)
    assert (p["qwen3-235b-a22b"].num_experts, p["qwen3-235b-a22b"].topk, p["qwen3-235b-a22b"].hidden) == (128, 8, 4096)
    assert (p["gpt-oss-120b"].num_experts, p["gpt-oss-120b"].topk, p["gpt-oss-120b"].hidden) == (128, 4, 2880)
    assert (p["mixtral-8x7b"].num_experts, p["mixtral-8x7b"].topk, p["mixtral-8x7b"].hidden) == (8, 2, 4096)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ShapeSpecError, match="unknown model preset 'llama'; known: deepseek-v3"):
        preset("llama")


@pytest.mark.parametrize(
    "config, expected",
    [
        (
            {"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8, "hidden_size": 7168},
            (256, 8, 7168),
        ),
        (
            {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 4096},
            (8, 2, 4096),
        ),
        (
            {"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 4096},
            (128, 8, 4096),
        ),
        (
            {
                "model_type": "llama4",
                "text_config": {"num_local_experts": 16, "num_experts_per_tok": 1, "hidden_size": 5120},
            },
            (16, 1, 5120),
        ),
    ],
)
def test_model_config_families(tmp_path, config, expected):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    s = from_model_config(path)
    assert (s.num_experts, s.topk, s.hidden) == expected


def test_dense_model_config_is_rejected_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    with pytest.raises(ShapeSpecError, match="no MoE shape found"):
        from_model_config(path)


def test_broken_model_config_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ShapeSpecError, match="invalid JSON"):
        from_model_config(path)
    with pytest.raises(ShapeSpecError, match="cannot read"):
        from_model_config(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "numbers, problem",
    [
        ({"num_local_experts": 10**9, "num_experts_per_tok": 2, "hidden_size": 4096}, "num_experts must be in 1..4096"),
        ({"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 10**9}, "hidden must be in 1..65536"),
        ({"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 10**30}, "hidden must be in 1..65536"),
        ({"num_local_experts": 8, "num_experts_per_tok": 100, "hidden_size": 64}, "topk must be in 1..64"),
    ],
)
def test_a_config_beyond_the_points_bounds_is_refused_when_read(tmp_path, numbers, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "huge", **numbers}))
    with pytest.raises(ShapeSpecError) as info:
        from_model_config(path)
    assert str(info.value).startswith(f"{path}: {problem}") and len(str(info.value)) < 200


def test_a_model_on_ranks_is_the_one_shape_type():
    from a2a_tune.tuner.runtime.point import Shape

    s = preset("deepseek-v3").at(8, "fp8_e4m3", "skewed")
    assert type(s) is Shape and s == Shape(8, 7168, 8, 256, "fp8_e4m3", "skewed")
    assert all(p.problem() is None for p in presets().values())


def test_every_preset_has_its_moe_layer_count():
    """Issue 37: three presets had none, so a lookup with --preset could not say a saving per step."""
    from a2a_tune.tuner.shapes import preset_sources, presets

    missing = [name for name, model in presets().items() if not model.moe_layers]
    assert missing == [], missing
    assert not [name for name, source in preset_sources().items() if "not recorded" in source]
    assert {n: presets()[n].moe_layers for n in ("qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b")} == {
        "qwen3-235b-a22b": 94,
        "gpt-oss-120b": 36,
        "mixtral-8x7b": 32,
    }
