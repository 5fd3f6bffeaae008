"""`flashinfer_nvlink_two_sided`: FlashInfer's `MnnvlMoe` (TensorRT-LLM's two-sided NVLink
all-to-all-v), the backend vLLM names `flashinfer_nvlink_two_sided`.

Mechanism (FlashInfer's): a prepare kernel exchanges the routing (expert ids, weights) and
per-rank send counts through a small symmetric workspace; the payload then travels as an
all-to-all-v in which sender and receiver kernels move packets through per-peer FIFOs
(workspace size depends on the world size, not on the token count). Combine runs the same
exchange backwards into [T, k] slots that are summed — one slot per destination rank is
filled, so expert outputs arrive already weighted, as our contract says.

Layout: received rows are [W * capacity] in source-rank blocks; FlashInfer marks rows past a
source's count with expert id E (replaced by -1 here) and this adapter masks the ids of
experts that live elsewhere. No host synchronisation: captured in CUDA graphs by the sweep.
FlashInfer requires E % 4 == 0 and keeps one workspace pair per process (for one mapping).
"""

from __future__ import annotations

import warnings

import torch

from ._flashinfer import comm_module, ep_mapping, flashinfer_availability
from ._wire import mask_nonlocal
from .base import All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape, torch_dtype, wire_dtype
from .quant import quantize_fp8_blocks, scale_blocks
from .registry import register_backend


@register_backend
class FlashInferNvlinkTwoSided(All2AllBackend):
    name = "flashinfer_nvlink_two_sided"
    # TensorRT-LLM's MnnvlMoe two-sided kernels.
    engine_names = {"vllm": "flashinfer_nvlink_two_sided", "sglang": None, "trtllm": "NVLINK_TWO_SIDED"}
    graph_capturable = True
    # the fp8 rows and their fp32 block scales travel as two exchanges (MXFP8 / NVFP4: not yet)
    payloads = frozenset({"bf16", "fp16", "fp32", "fp8_e4m3"})
    capacity_bound = True
    reach = "domain"  # MNNVL memory: fabric handles across the nodes of an NVLink domain (GB200 NVL72)

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        return flashinfer_availability(env)

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if shape.num_experts % 4:
            return Availability(False, f"FlashInfer's two-sided kernels need experts % 4 == 0, got {shape.num_experts}")
        wire = wire_dtype(shape.dtype) or torch_dtype(shape.dtype)
        row_bytes = [shape.hidden * wire.itemsize] + (
            [scale_blocks(shape.hidden) * 4] if wire_dtype(shape.dtype) else []
        )
        if any(b % 16 for b in row_bytes):
            return Availability(
                False, f"FlashInfer's two-sided kernels move 16-byte vectors: rows of {row_bytes} bytes"
            )
        return super().feasibility(shape, world_size)

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 0.7.1+ points to moe_ep, which wraps it
            self._moe = comm_module("trtllm_alltoall").MnnvlMoe
            mapping, config = ep_mapping(group, self.rank, self.world_size)
            self._workspace = self._moe.get_moe_workspaces(mapping, config)
            self._prepare_workspace = self._moe.get_moe_prepare_workspace(mapping, config)

    def _exchange(self, rows: torch.Tensor, info) -> torch.Tensor:
        return self._moe.mnnvl_moe_alltoallv(rows, info, self._workspace, self.rank, self.world_size)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        tokens = self.check_inputs(x, topk_ids, topk_weights)
        s = self.shape
        info, rids, rw, _ = self._moe.mnnvl_moe_alltoallv_prepare_without_allgather(
            topk_ids.to(torch.int32).contiguous(),
            topk_weights.to(torch.float32).contiguous(),
            None,
            self._prepare_workspace,
            s.max_tokens_per_rank,
            self.rank,
            self.world_size,
            s.num_experts,
            s.num_experts,
            s.topk,
        )
        lo, hi = self.local_expert_range()
        rids = mask_nonlocal(rids, lo, hi)  # also turns the empty-row marker (id E) into -1
        q, scales = quantize_fp8_blocks(x) if self.wire_dtype is not None else (x.contiguous(), None)
        x_scale = self._exchange(scales, info) if scales is not None else None
        return Dispatched(
            x=self._exchange(q, info), topk_ids=rids, topk_weights=rw, handle=(info, tokens), x_scale=x_scale
        )

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        info, tokens = dispatched.handle
        return self._moe.mnnvl_moe_alltoallv_combine(
            expert_out.to(self.dtype).contiguous(),
            info,
            self._workspace,
            ep_rank=self.rank,
            ep_size=self.world_size,
            top_k=self.shape.topk,
            token_count=tokens,
        )

    def close(self) -> None:
        # The workspaces are FlashInfer's process-wide singletons: nothing of ours to free.
        self._workspace = self._prepare_workspace = None
