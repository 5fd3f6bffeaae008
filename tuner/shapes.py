"""Model shapes to sweep: named presets (data in model_presets.json) or a Hugging Face config.json.

A model gives three of a shape's numbers (experts, top-k, hidden); the sweep's EP size,
payload dtype and routing complete it (:meth:`ModelShape.at`) into the one
:class:`~a2a_tune.tuner.runtime.point.Shape` the plan, the ranks, the store and the table carry.
Each number is held to the point's bounds when it is read, so a config with 10^9 experts is
refused in one line here, before any plan is built."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .runtime.models import moe_layer_count
from .runtime.point import MAX_EXPERTS, MAX_HIDDEN, MAX_TOPK, PointError, Shape, check_count, shape_label
from .runtime.text import quoted

# Hugging Face configs name the same three numbers differently per model family.
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")
_HIDDEN_KEYS = ("hidden_size", "d_model")
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a config.json is a few KB; never read a FIFO or /dev/zero


class ShapeSpecError(ValueError):
    """A preset name or model config that does not give an MoE shape (one line)."""


@dataclass(frozen=True)
class ModelShape:
    """A model's MoE layer: its name (for people) and the three numbers of a shape it fixes."""

    name: str
    num_experts: int
    topk: int
    hidden: int
    moe_layers: int | None = None  # decoder layers with an MoE (runtime.models); None: not recorded

    def problem(self) -> str | None:
        """Why no shape of this model can exist (a number beyond the point's bounds), or None."""
        try:
            for field, upper in (("num_experts", MAX_EXPERTS), ("topk", MAX_TOPK), ("hidden", MAX_HIDDEN)):
                check_count(getattr(self, field), field, upper)
        except PointError as exc:
            return str(exc)
        return None

    @classmethod
    def of(cls, shape: Shape) -> ModelShape:
        """The model part of a table entry's shape, named by its numbers (``E=256 k=8 H=7168``)."""
        return cls(
            shape_label(shape.num_experts, shape.topk, shape.hidden), shape.num_experts, shape.topk, shape.hidden
        )

    def at(self, ep_size: int, dtype: str, routing: str) -> Shape:
        """This model's shape on `ep_size` ranks with that payload dtype and routing."""
        return Shape(ep_size, self.hidden, self.topk, self.num_experts, dtype, routing)


#: The presets a sweep or check takes when none is named: the four shapes of the shipped 2xH200
#: table. Every other preset (`a2a-tune presets`) is measured when named with --preset; the default
#: stays four so that a run over EP 2, 4 and 8 costs at most 3x the single-size run it replaced.
DEFAULT_PRESETS = ("deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b")


def presets() -> dict[str, ModelShape]:
    raw = json.loads(resources.files("a2a_tune.tuner").joinpath("model_presets.json").read_text())
    return {
        name: ModelShape(name, v["num_experts"], v["topk"], v["hidden"], v.get("moe_layers")) for name, v in raw.items()
    }


def preset_sources() -> dict[str, str]:
    """preset -> where its numbers were read (the model's config.json)."""
    raw = json.loads(resources.files("a2a_tune.tuner").joinpath("model_presets.json").read_text())
    return {name: v["source"] for name, v in raw.items()}


def preset(name: str) -> ModelShape:
    table = presets()
    try:
        return table[name.lower()]
    except KeyError:
        raise ShapeSpecError(f"unknown model preset {quoted(name)}; known: {', '.join(table)}") from None


def _first(config: dict, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def from_model_config(path: str | Path) -> ModelShape:
    """Read (experts, top-k, hidden) from a Hugging Face config.json (text_config too)."""
    from .runtime.files import FileRefused, read_json

    path = Path(path)
    try:
        config = read_json(path, MAX_CONFIG_BYTES, bom=True)
    except OSError as exc:
        raise ShapeSpecError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except FileRefused as exc:
        raise ShapeSpecError(f"{path}: {exc}") from exc
    if not isinstance(config, dict):
        raise ShapeSpecError(f"{path}: expected a JSON object")
    for key in ("text_config", "llm_config"):  # a multimodal model's language half
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ShapeSpecError(f"{path}: {key}: expected a JSON object, got {type(config[key]).__name__}")
    for candidate in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        experts, topk, hidden = (
            _first(candidate, _EXPERT_KEYS),
            _first(candidate, _TOPK_KEYS),
            _first(candidate, _HIDDEN_KEYS),
        )
        if experts and topk and hidden:
            name = str(candidate.get("_name_or_path") or config.get("model_type") or path.parent.name or path.stem)
            model = ModelShape(name, experts, topk, hidden, moe_layer_count(config))
            problem = model.problem()
            if problem:
                raise ShapeSpecError(f"{path}: {problem}")
            return model
    raise ShapeSpecError(
        f"{path}: no MoE shape found (need one of {_EXPERT_KEYS}, one of {_TOPK_KEYS}, one of {_HIDDEN_KEYS})"
    )
