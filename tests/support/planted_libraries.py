"""NCCL EP's and DeepEP V2's backends with a planted bug each: the invariant must fail them.

Imported through A2A_TUNE_BACKEND_MODULES=planted_libraries (tests/support on the path) in the
rank that runs them (scripts/peers_one_rank.py on a GPU with the libraries staged).
"""

from __future__ import annotations

import torch

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.deepep_v2 import DeepEPV2HighThroughput, DeepEPV2LowLatency
from a2a_tune.kernels.nccl_ep import NcclEPHighThroughput, NcclEPLowLatency


def _rolled_dispatch(self, x, topk_ids, topk_weights):
    """Every received row one slot further on: the destination-offset bug."""
    d = type(self).__mro__[1].dispatch(self, x, topk_ids, topk_weights)
    d.x = torch.roll(d.x, shifts=1, dims=0)
    return d


for _base in (NcclEPLowLatency, NcclEPHighThroughput, DeepEPV2LowLatency, DeepEPV2HighThroughput):
    register_backend(
        type(f"Planted{_base.__name__}", (_base,), {"name": f"planted_{_base.name}", "dispatch": _rolled_dispatch})
    )
