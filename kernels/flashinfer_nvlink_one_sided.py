"""`flashinfer_nvlink_one_sided`: FlashInfer's `MoeAlltoAll` (TensorRT-LLM's one-sided NVLink
kernels), the backend vLLM names `flashinfer_nvlink_one_sided` and SGLang `flashinfer`.

Mechanism (FlashInfer's): every rank maps every peer's workspace; dispatch writes each token
once into the receive region of every rank owning one of its experts, several payloads per
token in one kernel (here: the activations, int32 expert ids, fp32 weights, and for a
quantized payload its scales: vLLM's prepare() passes the quantized rows and their linear
scales as two payloads, `prepare_finalize/flashinfer_nvlink_one_sided.py`), and completion flags replace a count exchange. Combine writes each received
row back into its source rank's region, where the rows of a token (one per destination
rank) are summed — so, as our contract says, expert outputs arrive already weighted.

Layout: received rows are [W, capacity] (slot = the token's index on its source); FlashInfer
rewrites the ids of slots beyond a source's count to -1, and this adapter masks the ids of
experts that live elsewhere. The workspace holds the shape's `max_tokens_per_rank`; the
capacity of one step (`runtime_max_tokens_per_rank`) is `set_step_tokens`' value, as vLLM
passes its max over DP ranks each step, else the whole capacity. No host synchronisation:
captured in CUDA graphs by the sweep, as vLLM does.

Knobs (environment, read once per process by FlashInfer): TLLM_MOE_A2A_DISPATCH_BLOCK_SIZE
and TLLM_MOE_A2A_COMBINE_BLOCK_SIZE (threads per CTA, default 256), recorded per measurement.
Read once per process, they cannot change between trials, so the class declares no
`knob_space` (the knob search skips it); `knobs()` reports the values in effect.
"""

from __future__ import annotations

import os
import warnings

import torch

from ._flashinfer import comm_module, ep_mapping, flashinfer_availability
from .base import PAYLOADS, All2AllBackend, Availability, BackendEnv, Dispatched
from .quant import quantize
from .registry import register_backend

KNOB_ENV = {
    "dispatch_block_size": "TLLM_MOE_A2A_DISPATCH_BLOCK_SIZE",
    "combine_block_size": "TLLM_MOE_A2A_COMBINE_BLOCK_SIZE",
}
DEFAULT_BLOCK_SIZE = 256


def block_size_knobs() -> dict[str, int]:
    """The block sizes FlashInfer's kernels use, as it sanitises them (warp multiple, 32..1024)."""
    knobs = {}
    for knob, var in KNOB_ENV.items():
        try:
            value = int(os.environ.get(var, DEFAULT_BLOCK_SIZE))
        except ValueError:
            value = DEFAULT_BLOCK_SIZE
        value = DEFAULT_BLOCK_SIZE if value <= 0 else min(value, 1024)
        knobs[knob] = (value + 31) // 32 * 32
    return knobs


@register_backend
class FlashInferNvlinkOneSided(All2AllBackend):
    name = "flashinfer_nvlink_one_sided"
    # FlashInfer's one-sided kernels are TensorRT-LLM's MoeAlltoAll.
    engine_names = {"vllm": "flashinfer_nvlink_one_sided", "sglang": "flashinfer", "trtllm": "NVLINK_ONE_SIDED"}
    graph_capturable = True
    # payloads are bytes to FlashInfer: the quantized rows + their scales, quantized in dispatch
    # (vLLM's prepare() quantizes, then dispatches)
    payloads = frozenset(PAYLOADS)
    capacity_bound = True
    step_sized = True  # runtime_max_tokens_per_rank: vLLM passes its max over DP ranks each step
    reach = "domain"  # MNNVL memory: fabric handles across the nodes of an NVLink domain (GB200 NVL72)

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        return flashinfer_availability(env)

    def __init__(self, group, shape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        s = shape
        a2a = comm_module("trtllm_moe_alltoall")
        mapping, config = ep_mapping(group, self.rank, self.world_size)
        workspace = (
            a2a.moe_a2a_get_workspace_size_per_rank(
                self.world_size,
                s.max_tokens_per_rank,
                PAYLOADS[s.dtype].row_bytes(s.hidden) + 2 * s.topk * 4,  # dispatch bytes per token
                s.hidden * self.dtype.itemsize,  # combine bytes per token
            )
            + 128 * 8
        )  # FlashInfer aligns each payload's region to 128 bytes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 0.7.1+ points to moe_ep, which wraps it
            self._a2a = a2a.MoeAlltoAll(
                mapping,
                s.max_tokens_per_rank,
                s.topk,
                s.num_experts,
                workspace_size_per_rank=workspace,
                mnnvl_config=config,
            )

    def knobs(self) -> dict[str, int]:
        return block_size_knobs()

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        self.check_inputs(x, topk_ids, topk_weights)
        s, w, cap = self.shape, self.world_size, self.step_capacity
        ids = topk_ids.to(torch.int32).contiguous()
        q, scales = quantize(s.dtype, x) if self.wire_dtype is not None else (x.contiguous(), None)
        payloads = [q, ids, topk_weights.to(torch.float32).contiguous()] + ([scales] if scales is not None else [])
        received = self._a2a.dispatch(ids, payloads, cap, invalid_token_expert_id=-1, expert_id_payload_index=1)
        rids = received[1].view(w * cap, s.topk)  # FlashInfer's receive region: ours until combine
        rids.masked_fill_(rids.div(self.experts_per_rank, rounding_mode="floor") != self.rank, -1)
        x_scale = received[3].view(w * cap, -1).view(scales.dtype) if scales is not None else None
        # The handle is the workspace region combine reads: where the experts may write (combine_buffer).
        buffer = self._a2a.get_combine_payload_tensor_in_workspace(cap, s.hidden, self.dtype).view(w * cap, s.hidden)
        return Dispatched(
            x=received[0].view(w * cap, q.shape[1]).view(q.dtype),
            topk_ids=rids,
            topk_weights=received[2].view(w * cap, s.topk),
            handle=buffer,
            x_scale=x_scale,
        )

    def combine_buffer(self, dispatched: Dispatched) -> torch.Tensor:
        return dispatched.handle

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        s = self.shape
        cap = dispatched.x.shape[0] // self.world_size  # the dispatch's step, whatever was set since
        out = expert_out.to(self.dtype).view(self.world_size, cap, s.hidden)
        # Written in place by the experts (combine_buffer): FlashInfer skips its staging copy.
        in_place = out.data_ptr() == dispatched.handle.data_ptr()
        return self._a2a.combine(out, cap, payload_in_workspace=in_place)

    def close(self) -> None:
        a2a, self._a2a = getattr(self, "_a2a", None), None
        if a2a is not None:
            # FlashInfer caches one workspace per (size, capacity) for the process: drop it, or a
            # sweep over capacities keeps every workspace it ever built.
            a2a._reset_workspace()
