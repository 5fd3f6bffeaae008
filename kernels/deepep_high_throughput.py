"""`deepep_high_throughput`: DeepEP's normal-mode (high-throughput) intranode kernels, the
backend vLLM names `deepep_high_throughput`, SGLang `deepep` with `--deepep-mode normal` and
TensorRT-LLM `DEEPEP`.

Mechanism (DeepEP's): a layout kernel counts the tokens bound for each rank and expert;
dispatch sends each token once to every rank owning one of its experts, with its top-k ids
and weights, through NVLink ring buffers (half the SMs send, half receive, in chunks of
tokens); the received count is read on the host, so the received rows are exact: [N, H], N
the tokens this rank received. Combine sends every received row back to its source, which
sums a token's rows without weights: expert outputs arrive weighted, as our contract says.

The host read of the count makes it uncapturable: timed eagerly, as engines run it (vLLM
turns CUDA graphs off with it). Payloads: bf16, and block-FP8 (rows quantized before the
dispatch with one fp32 scale per 128 elements, as vLLM does before DeepEP's normal
dispatch); combine carries bf16. Intranode only: 2, 4 or 8 ranks in one NVLink island.

Knobs: DeepEP's `Config` per direction, of which `Buffer.get_dispatch_config(W)` /
`get_combine_config(W)` hold its hand-tuned defaults per rank count: SMs (`num_sms`, shared
by both directions, DeepEP's `Buffer.num_sms`) and per direction the NVLink chunk sizes in
tokens (`*_send_tokens`: what a sender moves per step; `*_recv_tokens`: each channel's ring
buffer). A send size of 0 stands for DeepEP's default for the rank count, so the defaults are
DeepEP's own on any number of ranks; `knobs()` reports the numbers in effect. SGLang takes
the same numbers in `--deepep-config`. The buffer is sized for the largest setting in the
space, so `set_knobs` never reallocates.
"""

from __future__ import annotations

from typing import Any

import torch

from ._deepep import deepep_availability, import_deepep, world_group
from .base import All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape
from .quant import quantize_fp8_blocks
from .registry import register_backend

# DeepEP's NVLink send chunk sizes (dispatch, combine) per rank count, from its
# Buffer.get_dispatch_config / get_combine_config (commit 73b6ea4); SMs and ring sizes are
# the same for every rank count (20 SMs, 256 tokens).
DEEPEP_SEND_TOKENS = {2: (24, 10), 4: (6, 9), 8: (6, 4)}
DEEPEP_DEFAULT_SEND = (6, 6)  # Config's own defaults, for rank counts DeepEP has no entry for
MAX_EXPERTS_PER_RANK = 128  # its layout kernel's threads per block
MAX_TOPK = 32
MAX_ROW_BYTES = 16368  # half a row plus an 8-byte barrier in one warp's 8 KiB of TMA staging


@register_backend
class DeepEPHighThroughput(All2AllBackend):
    name = "deepep_high_throughput"
    reach = "island"  # DeepEP's intranode kernels: NVLink peer access within one node
    engine_names = {"vllm": "deepep_high_throughput", "sglang": "deepep", "trtllm": "DEEPEP"}
    engine_options = {"sglang": ("--deepep-mode", "normal")}
    # bf16, or FP8 with 128-wide blocks: what DeepEP's kernels take (block-FP8 rows and their scales travel as DeepEP's (x, x_scales));
    # no MXFP8, no NVFP4
    payloads = frozenset({"bf16", "fp8_e4m3"})
    knob_space = {
        "num_sms": (8, 12, 16, 20, 24, 32, 48, 64),  # even: senders and receivers pair up
        "dispatch_send_tokens": (0, 4, 6, 8, 12, 16, 24, 32),
        "dispatch_recv_tokens": (128, 256, 512),
        "combine_send_tokens": (0, 1, 2, 4, 6, 8, 10, 16),
        "combine_recv_tokens": (128, 256, 512),
    }
    knob_defaults = {
        "num_sms": 20,
        "dispatch_send_tokens": 0,
        "dispatch_recv_tokens": 256,
        "combine_send_tokens": 0,
        "combine_recv_tokens": 256,
    }

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        return deepep_availability(env, low_latency=False)

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if shape.num_experts // world_size > MAX_EXPERTS_PER_RANK:
            return Availability(False, f"DeepEP's layout kernel takes at most {MAX_EXPERTS_PER_RANK} experts per rank")
        if shape.topk > MAX_TOPK:
            return Availability(False, f"DeepEP's normal kernels take at most {MAX_TOPK} experts per token")
        row = shape.hidden * 2  # combine always moves bf16 rows; an fp8 row is half of it
        if row % 32 or row > MAX_ROW_BYTES or (shape.dtype == "fp8_e4m3" and shape.hidden % 32):
            return Availability(
                False,
                f"DeepEP's normal kernels move rows of a multiple of 32 bytes up to {MAX_ROW_BYTES}: hidden {shape.hidden}",
            )
        return super().feasibility(shape, world_size)

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        self._ep = import_deepep()
        space = self.knob_space
        # The NVLink buffer grows with the channels (SMs / 2) and the ring size: the largest setting.
        widest = self._ep.Config(max(space["num_sms"]), 1, max(max(space["dispatch_recv_tokens"]), 2))
        nvl_bytes = widest.get_nvl_buffer_size_hint(shape.hidden * 2, self.world_size)
        self._buffer = self._ep.Buffer(
            world_group(group),
            num_nvl_bytes=nvl_bytes,
            num_rdma_bytes=0,
            low_latency_mode=False,
            explicitly_destroy=True,
        )
        self.set_knobs({})

    def apply_knobs(self, knobs: dict[str, Any]) -> None:
        dispatch_send, combine_send = DEEPEP_SEND_TOKENS.get(self.world_size, DEEPEP_DEFAULT_SEND)
        resolved = dict(knobs)
        resolved["dispatch_send_tokens"] = knobs["dispatch_send_tokens"] or dispatch_send
        resolved["combine_send_tokens"] = knobs["combine_send_tokens"] or combine_send
        sms = resolved["num_sms"]
        self._dispatch_config = self._ep.Config(sms, resolved["dispatch_send_tokens"], resolved["dispatch_recv_tokens"])
        self._combine_config = self._ep.Config(sms, resolved["combine_send_tokens"], resolved["combine_recv_tokens"])
        self._resolved = resolved

    def knobs(self) -> dict[str, int]:
        return dict(self._resolved)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        self.check_inputs(x, topk_ids, topk_weights)
        buf = self._buffer
        idx = topk_ids.to(self._ep.topk_idx_t).contiguous()
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, self.shape.num_experts)
        payload = quantize_fp8_blocks(x) if self.wire_dtype is not None else x.contiguous()
        recv, recv_ids, recv_weights, _, handle, _ = buf.dispatch(
            payload,
            topk_idx=idx,
            topk_weights=topk_weights.to(torch.float32).contiguous(),
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            config=self._dispatch_config,
        )
        rx, scales = recv if isinstance(recv, tuple) else (recv, None)
        lo, _ = self.local_expert_range()
        ids = torch.where(recv_ids >= 0, recv_ids + lo, -1)  # DeepEP returns local expert ids
        return Dispatched(x=rx, topk_ids=ids, topk_weights=recv_weights, handle=handle, x_scale=scales)

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        y, _, _ = self._buffer.combine(
            expert_out.to(torch.bfloat16).contiguous(), dispatched.handle, config=self._combine_config
        )
        return y

    def close(self) -> None:
        buf, self._buffer = getattr(self, "_buffer", None), None
        if buf is not None:
            buf.destroy()  # collective (a barrier): every rank closes its instance in turn
