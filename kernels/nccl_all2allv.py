"""`nccl_all2allv`: each token goes once to each rank that owns one of its experts.

Mechanism: per token, the set of destination ranks (owner = expert // experts_per_rank);
(token, destination) pairs sorted by destination; one all_to_all_single exchanges the
counts, then the token rows and their packed routing metadata go with exact splits. Combine runs the same exchange in
reverse and sums each token's returned partial outputs (one per destination) in the
payload dtype, as a reduce-scatter does.

Workspace: the pairs actually sent, at most T_r * min(k, W) rows of H + 2k words each way;
no padding. The count exchange forces a host read per dispatch, so it is timed eagerly.
Engines have no literal for it (closest: DeepEP's two-sided normal mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ._wire import as_dispatched, pack_meta, row_format, send_rows
from .base import PAYLOADS, All2AllBackend, Dispatched
from .registry import register_backend


@dataclass
class _Handle:
    tokens: int
    source_token: torch.Tensor  # [S] token index of each sent (token, destination) pair
    send_splits: list[int]  # rows sent to each rank
    recv_splits: list[int]  # rows received from each rank


@register_backend
class NcclAll2Allv(All2AllBackend):
    name = "nccl_all2allv"
    # No engine runs it; vLLM's nearest is also an all-to-all-v (vLLM once called it flashinfer_all2allv).
    closest_names = {"vllm": "flashinfer_nvlink_two_sided"}
    payloads = frozenset(PAYLOADS)  # quantized ones as packed rows (values + scales), quantized in dispatch

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        tokens = self.check_inputs(x, topk_ids, topk_weights)
        w, s = self.world_size, self.shape
        owner = topk_ids.to(torch.int64) // self.experts_per_rank  # [T, k]
        goes_to = torch.zeros(tokens, w, dtype=torch.bool, device=self.device)
        goes_to.scatter_(1, owner, True)  # [T, W]
        send_counts = goes_to.sum(0)  # [W]
        recv_counts = torch.empty_like(send_counts)
        # Launch the count exchange before nonzero(), whose host sync then waits for both.
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        _, source_token = goes_to.t().nonzero(as_tuple=True)  # [S] pairs ordered by destination rank
        splits = torch.stack([send_counts, recv_counts]).tolist()
        send_splits, recv_splits = splits[0], splits[1]

        n_recv = sum(recv_splits)
        width, row_dtype = row_format(s)
        rx = torch.empty(n_recv, width, dtype=row_dtype, device=self.device)
        meta = torch.empty(n_recv, 2 * s.topk, dtype=torch.int32, device=self.device)
        rows = send_rows(s, x).index_select(0, source_token)
        dist.all_to_all_single(rx, rows, recv_splits, send_splits, group=self.group)
        meta_send = pack_meta(topk_ids, topk_weights).index_select(0, source_token)
        dist.all_to_all_single(meta, meta_send, recv_splits, send_splits, group=self.group)
        return as_dispatched(
            s, rx, meta, self.local_expert_range(), _Handle(tokens, source_token, send_splits, recv_splits)
        )

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        h: _Handle = dispatched.handle
        hidden = self.shape.hidden
        back = torch.empty(len(h.source_token), hidden, dtype=self.dtype, device=self.device)
        dist.all_to_all_single(
            back, expert_out.to(self.dtype).contiguous(), h.send_splits, h.recv_splits, group=self.group
        )
        # At most one partial sum per destination rank meets here; summing them in the payload
        # dtype rounds as often as a reduce-scatter does, and saves an fp32 copy of every row.
        y = torch.zeros(h.tokens, hidden, dtype=self.dtype, device=self.device)
        return y.index_add_(0, h.source_token, back)
