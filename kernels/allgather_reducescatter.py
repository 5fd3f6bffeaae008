"""`allgather_reducescatter`: every rank sees every token; partial outputs are summed back.

Mechanism: exchange token counts (one tiny all_gather), all_gather the token rows and their
packed routing metadata, padded to the largest count, keep the rows of every rank, and mask
top-k ids that are not local. Combine scatters the expert outputs into the padded layout and reduce_scatters it,
so each token's partial sums from all ranks meet on its source rank.

Workspace: W * max(T_r) rows of H + 2k words for dispatch and W * max(T_r) x H for combine;
it moves W times more bytes than a targeted exchange, but each collective is a plain NCCL
ring/tree that works on every interconnect. This is vLLM's default (`--all2all-backend
allgather_reducescatter`) and the baseline every other backend is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._wire import all_gather_flat, as_dispatched, pack_meta, reduce_scatter_flat, row_format, send_rows
from .base import PAYLOADS, All2AllBackend, Dispatched
from .registry import register_backend


@dataclass
class _Handle:
    tokens: int  # T_r of this rank
    max_tokens: int  # max over ranks: the padded rows per rank
    valid_rows: torch.Tensor | None  # [N] rows of the padded gather that hold real tokens; None if no padding


@register_backend
class AllGatherReduceScatter(All2AllBackend):
    name = "allgather_reducescatter"
    # SGLang's default (`none`) runs no all2all at all; TensorRT-LLM's AllGatherReduceScatter.
    engine_names = {"vllm": "allgather_reducescatter", "sglang": None, "trtllm": "ALLGATHER"}
    # Quantized payloads gathered as packed rows (values + scales), quantized inside dispatch:
    # vLLM's naive_dp_ep prepare() quantizes, then all-gathers rows and scales.
    payloads = frozenset(PAYLOADS)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        tokens = self.check_inputs(x, topk_ids, topk_weights)
        w, s = self.world_size, self.shape
        counts = torch.empty(w, dtype=torch.int64, device=self.device)
        # torch.full, not torch.tensor: a fill kernel instead of a synchronous host copy.
        all_gather_flat(counts, torch.full((1,), tokens, dtype=torch.int64, device=self.device), self.group)
        counts_host = counts.tolist()  # host sync: the padded size is data dependent
        max_tokens = max(counts_host)

        width, row_dtype = row_format(s)
        x_send, meta_send = send_rows(s, x), pack_meta(topk_ids, topk_weights)
        if tokens < max_tokens:  # pad to the common size; padding rows are never read back
            rows = x_send
            x_send = torch.empty(max_tokens, width, dtype=row_dtype, device=self.device)
            x_send[:tokens] = rows
            meta_send = torch.cat([meta_send, meta_send.new_empty(max_tokens - tokens, 2 * s.topk)])
        rx = torch.empty(w * max_tokens, width, dtype=row_dtype, device=self.device)
        meta = torch.empty(w * max_tokens, 2 * s.topk, dtype=torch.int32, device=self.device)
        all_gather_flat(rx, x_send.contiguous(), self.group)
        all_gather_flat(meta, meta_send, self.group)

        valid = None
        if any(c != max_tokens for c in counts_host):
            valid = torch.cat(
                [
                    torch.arange(r * max_tokens, r * max_tokens + c, device=self.device)
                    for r, c in enumerate(counts_host)
                ]
            )
            rx, meta = rx.index_select(0, valid), meta.index_select(0, valid)
        return as_dispatched(s, rx, meta, self.local_expert_range(), _Handle(tokens, max_tokens, valid))

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        h: _Handle = dispatched.handle
        w, hidden = self.world_size, self.shape.hidden
        if h.valid_rows is None:
            padded = expert_out.to(self.dtype).contiguous()
        else:
            padded = torch.zeros(w * h.max_tokens, hidden, dtype=self.dtype, device=self.device)
            padded.index_copy_(0, h.valid_rows, expert_out.to(self.dtype))
        out = torch.empty(h.max_tokens, hidden, dtype=self.dtype, device=self.device)
        reduce_scatter_flat(out, padded, self.group)
        return out[: h.tokens]


@register_backend
class AllGatherReduceScatterPadded(AllGatherReduceScatter):
    """The same collectives with every rank padded to one size (`set_step_tokens`' value, as
    vLLM pads its data-parallel ranks to their max in CUDA-graph decode; else the capacity):
    no count exchange, no host synchronisation, so the round trip can be captured and replayed.

    Padding rows travel with topk ids of -1 (no expert computes them) and are dropped from y.
    Buffers: W * step rows each way (the step's size, else max_tokens_per_rank), allocated per call.
    """

    name = "allgather_reducescatter_padded"
    # Its engine names are the parent's: vLLM's allgather_reducescatter pads this way in decode.
    graph_capturable = True
    capacity_bound = True
    step_sized = True  # vLLM pads to the step's max over DP ranks, not to a fixed capacity

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        tokens = self.check_inputs(x, topk_ids, topk_weights)
        w, s, cap = self.world_size, self.shape, self.step_capacity
        width, row_dtype = row_format(s)
        x_send = torch.zeros(cap, width, dtype=row_dtype, device=self.device)
        x_send[:tokens] = send_rows(s, x)
        ids = torch.full((cap, s.topk), -1, dtype=torch.int32, device=self.device)
        ids[:tokens] = topk_ids
        weights = torch.zeros(cap, s.topk, dtype=torch.float32, device=self.device)
        weights[:tokens] = topk_weights
        rx = torch.empty(w * cap, width, dtype=row_dtype, device=self.device)
        meta = torch.empty(w * cap, 2 * s.topk, dtype=torch.int32, device=self.device)
        all_gather_flat(rx, x_send, self.group)
        all_gather_flat(meta, pack_meta(ids, weights), self.group)
        return as_dispatched(s, rx, meta, self.local_expert_range(), _Handle(tokens, cap, None))
