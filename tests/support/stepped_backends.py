"""Gloo backends whose costs cross with a step, for crossover refinement (tests/test_sweep.py).

Imported in every rank through A2A_TUNE_BACKEND_MODULES=stepped_backends. `sleeps_stepped`
sleeps 5 ms per dispatch up to 20 tokens per rank and 250 ms above (a kernel changing its
launch shape); `sleeps_flat` sleeps 80 ms; `sleeps_long` 200 ms (never a contender: over
1.3x the best at both ends). Gloo's own cost on a loaded 2-core CI machine (up to tens of ms
a round trip, and noisy) stays well inside those gaps, so the winner at every token count is
known: stepped up to 20 tokens, flat above.
"""

from __future__ import annotations

import time

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv

STEP_AT = 20


class _Sleeps(NcclAll2Allv):
    """Sleeps `seconds(tokens)` in every dispatch, then moves the tokens over gloo."""

    def seconds(self, tokens: int) -> float:
        raise NotImplementedError

    def dispatch(self, x, topk_ids, topk_weights):
        time.sleep(self.seconds(x.shape[0]))
        return super().dispatch(x, topk_ids, topk_weights)


@register_backend
class SleepsStepped(_Sleeps):
    name = "sleeps_stepped"

    def seconds(self, tokens: int) -> float:
        return 0.005 if tokens <= STEP_AT else 0.250


@register_backend
class SleepsFlat(_Sleeps):
    name = "sleeps_flat"

    def seconds(self, tokens: int) -> float:
        return 0.080


@register_backend
class SleepsLong(_Sleeps):
    name = "sleeps_long"

    def seconds(self, tokens: int) -> float:
        return 0.200
