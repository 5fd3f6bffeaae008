"""The answer in the engine's own units: what the table's choice saves against the engine's
default, per MoE layer, per step of the model, and as a share of the time per output token.

* **The engine's default** is its own rule on this machine (the rules are here, and
  ``tuner.policies`` scores the same ones): vLLM runs ``allgather_reducescatter``; SGLang's
  ``none`` gathers every token and reduces (scored as our all-gather backends); TensorRT-LLM
  takes the first method of its priority list that runs here (measured without failing).
  Where a literal stands for several of our backends (vLLM's all-gather: eager and padded),
  the fastest counts: the engine's best case, so the saving is never flattered.
* ``saving_us_per_layer`` = the default's expected round trip - the choice's, under the same
  load distribution (the lookup's); ``saving_ms_per_step`` = that x ``moe_layers`` / 1000
  (every MoE layer dispatches and combines once a step); with a TPOT, its share of it.

Standard library only (the engines' start-up path and the vLLM plugin use it).
"""

from __future__ import annotations

from a2a_tune.tuner.runtime import engines

__all__ = ["TPOT_ENV", "default_backends", "in_engine_units", "sentence"]

#: The vLLM plugin's TPOT (ms) to state the saving as a share of.
TPOT_ENV = "A2A_TUNE_TPOT_MS"
#: Whose default is meant when the lookup names no engine.
DEFAULT_ENGINE = "vllm"


def default_backends(engine: str, names, candidates, num_experts: int, ep_size: int) -> tuple:
    """(the engine's default in its words, our backends among ``candidates`` that stand for it).

    ``names``: backend -> ``table.BackendNames``; ``candidates``: the backends measured without
    failing at the point (or over the load)."""

    def with_literal(eng, literal):
        return {b for b in candidates if b in names and names[b].literal(eng) == literal}

    if engine == "trtllm":
        order = engines.TRTLLM_PRIORITY
        if num_experts % ep_size:
            order = tuple(m for m in order if m in engines.TRTLLM_NONDIVISIBLE)
        for method in order:
            found = with_literal("trtllm", method)
            if found:
                return method, found
        return None, set()
    # SGLang's default runs no all2all kernel: all-gather and reduce, as vLLM's default does
    return engines.DEFAULT["vllm"] if engine == "sglang" else engines.DEFAULT[engine], with_literal(
        "vllm", engines.DEFAULT["vllm"]
    )


def in_engine_units(per_layer, moe_layers=None, tpot_ms=None) -> dict | None:
    """``vs_default`` of ``lookup --format json``: the lookup's per-layer figures (``Choice.
    vs_default``) with ``moe_layers``, ``saving_ms_per_step`` and, with a TPOT, ``tpot_ms`` and
    ``share_of_tpot`` (None where unknown). None when the lookup has no default to compare."""
    if not per_layer:
        return None
    out = dict(per_layer)
    out["moe_layers"] = moe_layers
    saving = out["saving_us_per_layer"]
    step = None if moe_layers is None else round(saving * moe_layers / 1000, 4)
    out["saving_ms_per_step"] = step
    out["tpot_ms"] = tpot_ms
    out["share_of_tpot"] = None if step is None or not tpot_ms else round(step / tpot_ms, 4)
    return out


def sentence(vs: dict | None, phase: str = "tokens") -> str:
    """ "expected -1.3 ms per decode step vs vLLM's default (58 MoE layers)", or the per-layer
    saving where the layer count is unknown; "" without a default to compare."""
    if not vs:
        return ""
    who = f"{engines.NAMES.get(vs['engine'], vs['engine'])}'s default ({vs['engine_default']})"
    step = {"decode": "decode step", "prefill": "prefill step"}.get(phase, "step")
    if vs.get("saving_ms_per_step") is None:
        return f"expected {_change(vs['saving_us_per_layer'], 1)} us per MoE layer vs {who} (MoE layers unknown)"
    text = f"expected {_change(vs['saving_ms_per_step'], 2)} ms per {step} vs {who} ({vs['moe_layers']} MoE layers)"
    if vs.get("share_of_tpot") is not None:
        text += f", {_change(vs['share_of_tpot'] * 100, 1)}% of a {vs['tpot_ms']:g} ms TPOT"
    return text


def _change(saving: float, digits: int) -> str:
    """A saving as the change it makes to the time: "\u22121.33" (faster), "+0.20" (slower),
    "0.00" (none at that precision)."""
    text = f"{-saving:+.{digits}f}"
    if float(text) == 0:
        return f"{0:.{digits}f}"
    return text.replace("-", "\u2212")
