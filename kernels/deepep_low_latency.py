"""`deepep_low_latency`: DeepEP's low-latency kernels, the backend vLLM names
`deepep_low_latency`, SGLang `deepep` with `--deepep-mode low_latency` and TensorRT-LLM
`DEEPEPLOWLATENCY`.

Mechanism (DeepEP's, over NVSHMEM; between GPUs of one node through NVLink): dispatch writes
each token once per selected expert into [local expert, source rank, slot] of the rank
owning the expert, with its source position, and counts arrive per expert: the receiver gets
every local expert's W x capacity slots, of which the first `count[e]` are filled, with no
host synchronisation (CUDA-graph capturable, timed under graphs). Combine sends each expert's
output row back to the token's rank, which sums them with the token's top-k weights: so the
rows this adapter hands out carry weight 1 for their one expert (-1 elsewhere and in empty
slots), and the weighting happens in DeepEP's combine.

Capacity: `num_max_dispatch_tokens_per_rank` = the shape's `max_tokens_per_rank` (rounded up
so W x capacity is a multiple of 4, as DeepEP's TMA needs). DeepEP takes it per call, but
vLLM and SGLang pass their fixed maximum at every step, so that is what is timed: not
`step_sized` (its kernels move only the filled slots; the W x capacity slots are allocated
and handed out every step). Payloads: bf16, and FP8 quantized by DeepEP inside the dispatch
(one fp32 scale per 128 elements; its column-major scales are copied to [rows, H / 128] for
the contract). Zero-copy combine for bf16: `combine_buffer` is DeepEP's next combine buffer,
into which the experts write. Hidden sizes: those DeepEP's kernels are instantiated for.
"""

from __future__ import annotations

import os

import torch

from ._deepep import deepep_availability, import_deepep, world_group
from .base import All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape
from .quant import FP8_BLOCK
from .registry import register_backend

HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)  # its kernels' instantiations
MAX_TOPK = 11
MAX_TOKENS_PER_RANK = 1024  # decode: W x E_local x capacity rows of H are allocated per dispatch


def slots_per_source(capacity: int, world_size: int) -> int:
    """The capacity rounded up so that W x capacity is a multiple of 4 (DeepEP's TMA)."""
    slots = capacity
    while (world_size * slots) % 4:
        slots += 1
    return slots


@register_backend
class DeepEPLowLatency(All2AllBackend):
    name = "deepep_low_latency"
    reach = "island"  # as wrapped here: NVSHMEM over NVLink peer access (no internode RDMA)
    engine_names = {"vllm": "deepep_low_latency", "sglang": "deepep", "trtllm": "DEEPEPLOWLATENCY"}
    engine_options = {"sglang": ("--deepep-mode", "low_latency")}
    graph_capturable = True
    # bf16, or FP8 with 128-wide blocks: what DeepEP's kernels take (FP8: DeepEP quantizes inside its dispatch kernel);
    # no MXFP8, no NVFP4
    payloads = frozenset({"bf16", "fp8_e4m3"})
    capacity_bound = True

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        return deepep_availability(env, low_latency=True)

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if shape.hidden not in HIDDEN_SIZES:
            sizes = ", ".join(map(str, HIDDEN_SIZES))
            return Availability(False, f"DeepEP's low-latency kernels take hidden sizes {sizes}, not {shape.hidden}")
        if shape.dtype == "fp8_e4m3" and shape.hidden % 512:
            return Availability(False, f"DeepEP's FP8 low-latency dispatch needs hidden % 512 == 0, not {shape.hidden}")
        if shape.topk > MAX_TOPK:
            return Availability(False, f"DeepEP's low-latency kernels take at most {MAX_TOPK} experts per token")
        if shape.max_tokens_per_rank > MAX_TOKENS_PER_RANK:
            return Availability(False, f"low-latency slots hold at most {MAX_TOKENS_PER_RANK} tokens per rank (decode)")
        return super().feasibility(shape, world_size)

    @classmethod
    def received_rows(cls, shape: MoEShape, world_size: int) -> int:
        """Every local expert's W x slots (of which the first count[e] are filled)."""
        return shape.experts_per_rank(world_size) * world_size * slots_per_source(shape.max_tokens_per_rank, world_size)

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        ep = self._ep = import_deepep()
        w, s = self.world_size, shape
        self._slots = slots_per_source(s.max_tokens_per_rank, w)
        # DeepEP asserts at every call that NVSHMEM's queue-pair depth, read when the buffer
        # is built, covers 2 x (capacity + 1) work requests.
        depth = max(int(os.environ.get("NVSHMEM_QP_DEPTH", "1024")), 2 * (self._slots + 1))
        os.environ["NVSHMEM_QP_DEPTH"] = str(depth)
        self._buffer = ep.Buffer(
            world_group(group),
            num_nvl_bytes=0,
            num_rdma_bytes=ep.Buffer.get_low_latency_rdma_size_hint(self._slots, s.hidden, w, s.num_experts),
            low_latency_mode=True,
            num_qps_per_rank=self.experts_per_rank,  # DeepEP needs one queue pair per local expert
            allow_nvlink_for_low_latency_mode=True,
            explicitly_destroy=True,
        )
        rows = self.experts_per_rank * w * self._slots
        # The ids and weights handed out: one expert per row (column 0), refreshed each dispatch.
        self._ids = torch.full((rows, s.topk), -1, dtype=torch.int32, device=device)
        self._weights = torch.zeros((rows, s.topk), dtype=torch.float32, device=device)
        self._weights[:, 0] = 1.0
        self._slot = torch.arange(w * self._slots, dtype=torch.int32, device=device)
        lo, hi = self.local_expert_range()
        self._experts = torch.arange(lo, hi, dtype=torch.int32, device=device)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        self.check_inputs(x, topk_ids, topk_weights)
        s, fp8 = self.shape, self.wire_dtype is not None
        idx = topk_ids.to(self._ep.topk_idx_t).contiguous()
        recv, counts, handle, _, _ = self._buffer.low_latency_dispatch(
            x.contiguous(), idx, self._slots, s.num_experts, use_fp8=fp8, async_finish=False, return_recv_hook=False
        )
        rx, scales = recv if fp8 else (recv, None)
        filled = self._slot.unsqueeze(0) < counts.unsqueeze(1)  # [E_local, W x slots]
        self._ids[:, 0].copy_(torch.where(filled, self._experts.unsqueeze(1), -1).view(-1))
        rows = self._ids.shape[0]
        # bf16: the experts may write straight into the buffer combine sends from.
        out_buffer = None if fp8 else self._buffer.get_next_low_latency_combine_buffer(handle).view(rows, s.hidden)
        return Dispatched(
            x=rx.view(rows, s.hidden),
            topk_ids=self._ids,
            topk_weights=self._weights,
            handle=(handle, idx, topk_weights.to(torch.float32).contiguous(), rx, out_buffer),
            x_scale=scales.contiguous().view(rows, s.hidden // FP8_BLOCK) if fp8 else None,
        )

    def combine_buffer(self, dispatched: Dispatched) -> torch.Tensor | None:
        return dispatched.handle[4]

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        handle, idx, weights, received, out_buffer = dispatched.handle
        packed = received.shape  # [E_local, W x slots, H]
        zero_copy = out_buffer is not None and expert_out.data_ptr() == out_buffer.data_ptr()
        # With zero_copy DeepEP reads the rows from its buffer; `x` only has to have the shape:
        # the received bf16 rows do.
        x = received if zero_copy else expert_out.to(torch.bfloat16).reshape(packed).contiguous()
        y, _, _ = self._buffer.low_latency_combine(
            x, idx, weights, handle, zero_copy=zero_copy, async_finish=False, return_recv_hook=False
        )
        return y

    def close(self) -> None:
        buf, self._buffer = getattr(self, "_buffer", None), None
        if buf is not None:
            buf.destroy()  # collective (NVSHMEM barrier and finalize): every rank closes in turn
