"""Backends that write into the caller's inputs: the gate must judge them against a copy taken
before dispatch, never against what they left behind (issue 31.1).

Imported in every rank through A2A_TUNE_BACKEND_MODULES=input_writers (tests/support on the path).
Each `planted_writes_<input>_<when>` changes one input in place, before or after sending, and
returns what the changed inputs call for, so the output matches the damaged inputs exactly.
"""

from __future__ import annotations

import torch

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.allgather_reducescatter import AllGatherReduceScatter
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv
from a2a_tune.kernels.nvlink_one_sided import NvlinkOneSided

WRITERS: list[str] = []


def _damage(which: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: int) -> None:
    if which == "x":
        x.mul_(0.5)
    elif which == "topk_ids":  # another expert, still distinct within the row
        ids.copy_((ids + 1) % experts)
    else:
        weights.mul_(0.5)


def _writer(which: str, when: str) -> type:
    class Writer(NcclAll2Allv):
        name = f"planted_writes_{which}_{when}"

        def dispatch(self, x, topk_ids, topk_weights):
            if when == "before":  # sends what it damaged: y matches the damaged inputs
                _damage(which, x, topk_ids, topk_weights, self.shape.num_experts)
            d = super().dispatch(x, topk_ids, topk_weights)
            if when == "after":
                _damage(which, x, topk_ids, topk_weights, self.shape.num_experts)
            return d

        def combine(self, expert_out, dispatched):
            y = super().combine(expert_out, dispatched)
            # after sending, x or the weights halved: return what halved inputs call for
            return y * 0.5 if when == "after" and which != "topk_ids" else y

    Writer.__name__ = Writer.__qualname__ = f"Writes_{which}_{when}"
    register_backend(Writer)
    WRITERS.append(Writer.name)
    return Writer


for _which in ("x", "topk_ids", "topk_weights"):
    for _when in ("before", "after"):
        _writer(_which, _when)


@register_backend
class ZeroesTheWeights(NcclAll2Allv):
    """Zeroes topk_weights in place, moves nothing and returns zeros: y = 0 for every token,
    which the zeroed weights call for ("max error 0" when judged on what it left behind)."""

    name = "planted_zero_weights"

    def dispatch(self, x, topk_ids, topk_weights):
        topk_weights.zero_()
        self._tokens = x.shape[0]
        return super().dispatch(x[:0], topk_ids[:0], topk_weights[:0])

    def combine(self, expert_out, dispatched):
        return torch.zeros(self._tokens, self.shape.hidden, dtype=self.dtype, device=self.device)


def _halves_x(base: type, name: str, send: str, receive: str) -> type:
    """`base` that halves the caller's x once its method `send` has sent it and returns half of
    what its method `receive` returns: the sum the halved x calls for."""

    def sends(self, x, topk_ids, topk_weights):
        out = getattr(base, send)(self, x, topk_ids, topk_weights)
        x.mul_(0.5)
        return out

    def receives(self, *args):
        return getattr(base, receive)(self, *args) * 0.5

    doc = f"{base.__name__} that halves x after `{send}` and returns half of what `{receive}` returns."
    return register_backend(
        type(f"HalvesX_{base.__name__}", (base,), {"name": name, "__doc__": doc, send: sends, receive: receives})
    )


_halves_x(AllGatherReduceScatter, "planted_halves_x", "dispatch", "combine")  # really all-gathers, then halves x
WRITERS += ["planted_zero_weights", "planted_halves_x"]


@register_backend
class WritesOnceTimed(NcclAll2Allv):
    """Leaves its inputs alone in the gate (its first call), halves x from the second call on:
    the sweep's timing must catch it too."""

    name = "planted_writes_when_timed"

    def dispatch(self, x, topk_ids, topk_weights):
        self._calls = getattr(self, "_calls", 0) + 1
        d = super().dispatch(x, topk_ids, topk_weights)
        if self._calls > 1:
            x.mul_(0.5)
        return d


# Virtual ranks: halves x after sending, returns half the sum.
_halves_x(NvlinkOneSided, "planted_virtual_halves_x", "dispatch_send", "combine_recv")
