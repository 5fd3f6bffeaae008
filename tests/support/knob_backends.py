"""A gloo backend whose speed depends on its knobs, for the knob search (tests/test_knobs.py).

Imported in every rank through A2A_TUNE_BACKEND_MODULES=knob_backends (tests/support on the
path), the way an out-of-tree backend would be.

`knobbed_sleepy` sleeps `delay_ms` in every dispatch, so the fastest correct setting is the
smallest delay; `shortcut=True` skips the sleep AND delivers every row one slot off, so it
is the fastest setting of all and wrong: the search must never pick it. The delays are 2x
and 100x apart: a gloo round trip on a loaded 2-core machine adds up to tens of ms (and
varies as much), which must not reorder them or hide the slow one from the pruner.
"""

from __future__ import annotations

import time

import torch

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv


@register_backend
class KnobbedSleepy(NcclAll2Allv):
    name = "knobbed_sleepy"
    knob_space = {"delay_ms": (200, 100, 1), "shortcut": (False, True)}
    knob_defaults = {"delay_ms": 200, "shortcut": False}

    def dispatch(self, x, topk_ids, topk_weights):
        knobs = self.knobs()
        d = super().dispatch(x, topk_ids, topk_weights)
        if knobs["shortcut"]:
            if d.x.shape[0] > 1:
                d.x = torch.roll(d.x, shifts=1, dims=0)
            return d
        time.sleep(knobs["delay_ms"] / 1000)
        return d


@register_backend
class CapacityReporter(NcclAll2Allv):
    """A fixed-capacity backend that reports the capacity it was built with, and the step size
    it was told, among its knobs, which the sweep stores with every measurement
    (tests/test_sweep.py: --capacity)."""

    name = "capacity_reporter"
    capacity_bound = True
    step_sized = True

    def knobs(self):
        return {"built_for_tokens": self.shape.max_tokens_per_rank, "step_tokens": self.step_capacity}
