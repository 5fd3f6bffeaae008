"""`nvlink_low_latency`: expert-major fixed-capacity slots over symmetric memory, for decode.

Mechanism (kernels in `_low_latency_kernels.py`, DeepEP low-latency semantics): each token
is written once per selected expert into [local expert, source rank, token slot] of the
rank owning the expert, tagged with the round's epoch; the receiver gets every local
expert's W * capacity rows in place, ready for a masked grouped GEMM, with no count
exchange, no compaction and no host synchronisation: dispatch + combine capture in one
CUDA graph. Combine returns each expert's output row into the source's [token, j] row,
and the source sums its k rows.

Workspace per rank: E_local * W * capacity rows of H (dispatch) + capacity * k rows of H
(combine) + 16 bytes of metadata per slot. With DeepSeek-V3 on 2 ranks (128 local experts,
H 7168, bf16) that is 3.7 GB at 1024 tokens per rank, which is why it is for decode:
`MAX_TOKENS_PER_RANK` caps the capacity (the sweep skips larger token counts for it).
"""

from __future__ import annotations

from . import _low_latency_kernels
from ._symmetric_backend import SymmetricMemoryBackend
from .base import Availability, MoEShape
from .registry import register_backend

MAX_TOKENS_PER_RANK = 1024  # decode batches; DeepEP's low-latency mode is used at <= 128-256


@register_backend
class NvlinkLowLatency(SymmetricMemoryBackend):
    name = "nvlink_low_latency"
    closest_names = {"vllm": "deepep_low_latency"}  # the same semantics, not DeepEP's code
    kernels = _low_latency_kernels
    # dispatch_recv is a kernel here (it tags each slot): its rows per program are a knob too
    knob_space = {**SymmetricMemoryBackend.knob_space, "recv_block_rows": (16, 32, 64, 128, 256)}

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if shape.max_tokens_per_rank > MAX_TOKENS_PER_RANK:
            return Availability(False, f"low-latency slots hold at most {MAX_TOKENS_PER_RANK} tokens per rank (decode)")
        return super().feasibility(shape, world_size)

    @classmethod
    def received_rows(cls, shape: MoEShape, world_size: int) -> int:
        """Expert-major slots: E_local x W x capacity rows (module docstring)."""
        return shape.experts_per_rank(world_size) * world_size * shape.max_tokens_per_rank
