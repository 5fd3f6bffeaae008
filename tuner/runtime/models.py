"""How many of a model's decoder layers are MoE layers, read from its Hugging Face config.

Each MoE layer runs one dispatch and one combine per step, so a saving per layer becomes a
saving per step times this count (``vs_default``). The families name their dense layers
differently: DeepSeek-V3/V3.2, Kimi-K2 and GLM-4.x replace the first ``first_k_dense_replace``
layers with dense ones; Llama 4 puts an MoE in every ``interleave_moe_layer_step``-th layer;
Qwen MoE lists dense layers in ``mlp_only_layers`` (and ``decoder_sparse_step``); the rest
(Mixtral, gpt-oss, MiniMax-M2, Qwen3.5) are MoE in every layer. A config whose layer count is
out of bounds (``runtime.point.MAX_MOE_LAYERS``) or whose dense-layer list is not a list of
layer numbers says no count (None): the count only words the saving. Standard library only.
"""

from __future__ import annotations

from a2a_tune.tuner.runtime.point import MAX_MOE_LAYERS

__all__ = ["moe_layer_count"]


def _get(cfg, key):
    return cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def moe_layer_count(cfg) -> int | None:
    """The MoE layers of the config `cfg` (a dict or an object with the same attributes; its
    ``text_config`` where it has one), or None when it does not say how many layers it has."""
    text = _get(cfg, "text_config")
    if text is not None and _int(_get(text, "num_hidden_layers")):
        cfg = text
    layers = _int(_get(cfg, "num_hidden_layers"))
    if not layers or layers > MAX_MOE_LAYERS:
        return None
    step = _int(_get(cfg, "interleave_moe_layer_step"))
    if step and step > 1:
        return layers // step
    dense = _int(_get(cfg, "first_k_dense_replace")) or 0
    mlp_only = _get(cfg, "mlp_only_layers")
    listed = 0
    if mlp_only is not None:
        if not isinstance(mlp_only, (list, tuple)) or any(_int(i) is None for i in mlp_only):
            return None  # e.g. [[1]]: not layer numbers
        listed = len(set(mlp_only))
    dense = max(dense, listed)
    sparse_step = _int(_get(cfg, "decoder_sparse_step"))
    if sparse_step and sparse_step > 1:
        return max(0, layers // sparse_step - listed)
    return max(0, layers - dense)
