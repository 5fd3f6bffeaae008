"""`deepep_v2_low_latency` / `deepep_v2_high_throughput`: DeepEP V2 (`deep_ep.ElasticBuffer`,
deepseek-ai/DeepEP 2.x), the library vLLM names `deepep_v2`, in the two modes vLLM runs it.

V2 unifies DeepEP's kernels in one buffer over NCCL's device API (GIN for RDMA, NVLink within a
node; EP up to 2048 as it documents), so it needs NCCL >= 2.30, shared with torch: it reuses
torch's NCCL communicator and refuses a process holding two NCCL libraries. Its kernels are JIT
(nvcc at run time); its extension is built from source (scripts/stage_nccl_ep.py).

Modes, as vLLM's DeepEPV2PrepareAndFinalize drives them:
  low latency (decode): no CPU sync, no expansion: [W x capacity] worst-case slots, one per
  source token, with local expert ids (-1 elsewhere); filled up to the handle's prefix count
  (masked on the device here): CUDA-graph capturable, built for a fixed capacity.
  high throughput (prefill): CPU sync for the exact count, expanded layout: one slot per
  (token, local expert), the experts' counts read on the host (timed eagerly).
Combine takes expert outputs already weighted (and, unexpanded, summed per token) in bf16.
Payloads: bf16 and block-FP8 (quantized before the dispatch, one fp32 scale per 128 elements,
as vLLM does); combine carries bf16. vLLM's MXFP8 path (packed e8m0 scales) is not wrapped.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import ClassVar

import torch

from .base import All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape
from .errors import import_failure
from .nccl_ep import STAGE_HINT, cuda_library_availability
from .quant import quantize_fp8_blocks
from .registry import register_backend


def deepep_v2_missing() -> str:
    """Why DeepEP V2 is not importable here ("" when it is), found without importing it."""
    spec = importlib.util.find_spec("deep_ep")
    if spec is None or not spec.submodule_search_locations:
        return f"deep_ep not installed (DeepEP V2: {STAGE_HINT})"
    pkg = Path(next(iter(spec.submodule_search_locations)))
    if not (pkg / "buffers" / "elastic.py").is_file():
        return f"deep_ep at {pkg} predates V2 (no ElasticBuffer): DeepEP V1, see deepep_* backends"
    if not sorted(pkg.glob("_C*.so")):
        return f"deep_ep V2 found at {pkg} but not its extension deep_ep._C (not built?)"
    return ""


def import_deepep_v2():
    """`deep_ep` (V2), imported on first use; an import failure is one line (its own check that
    the loaded NCCL is the one it was built against answers there)."""
    try:
        return importlib.import_module("deep_ep")
    except Exception as exc:  # noqa: BLE001 - AssertionError of check_nccl_so, a missing symbol...
        raise import_failure("deep_ep (V2)", exc) from exc


class _DeepEPV2(All2AllBackend):
    expand: ClassVar[bool]
    reach = "anywhere"  # NVLink within a node, RDMA (NCCL GIN) between nodes, as DeepEP documents
    engine_names = {"vllm": "deepep_v2"}
    payloads = frozenset({"bf16", "fp8_e4m3"})

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        found = cuda_library_availability(env, "DeepEP V2", deepep_v2_missing(), "CUDA_HOME")
        if found.ok and env.gpus > 1 and not env.peer_access:
            return Availability(False, "DeepEP V2 needs NVLink between a node's GPUs (it refuses PCIe-only GPUs)")
        return found

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if (shape.hidden * 2) % 512:  # vLLM pads the hidden size to this transfer atom
            return Availability(False, f"DeepEP V2 moves rows of a multiple of 512 bytes: hidden {shape.hidden}")
        return super().feasibility(shape, world_size)

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        self._ep = import_deepep_v2()
        import torch.distributed as dist

        s, pg = shape, group if group is not None else dist.group.WORLD
        # V2 reuses torch's NCCL communicator: make sure it exists (torch creates it lazily).
        dist.all_reduce(torch.zeros(1, device=device), group=pg)
        self._buffer = self._ep.ElasticBuffer(
            pg,
            num_max_tokens_per_rank=s.max_tokens_per_rank,
            hidden=s.hidden,
            num_topk=s.topk,
            use_fp8_dispatch=self.wire_dtype is not None,
            explicitly_destroy=True,
        )
        self._num_sms = self._buffer.get_theoretical_num_sms(s.num_experts, s.topk)
        lo, hi = self.local_expert_range()
        self._lo = lo
        self._experts = torch.arange(lo, hi, device=device)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        self.check_inputs(x, topk_ids, topk_weights)
        s = self.shape
        payload = quantize_fp8_blocks(x) if self.wire_dtype is not None else x.contiguous()
        recv, recv_ids, recv_weights, handle, _ = self._buffer.dispatch(
            payload,
            topk_idx=topk_ids.to(self._ep.topk_idx_t).contiguous(),
            topk_weights=topk_weights.to(torch.float32).contiguous(),
            num_experts=s.num_experts,
            num_max_tokens_per_rank=s.max_tokens_per_rank,
            num_sms=self._num_sms,
            do_expand=self.expand,
            do_cpu_sync=self.expand,
            async_with_compute_stream=False,
        )
        rx, scales = recv if isinstance(recv, tuple) else (recv, None)
        n, k = rx.shape[0], s.topk
        if self.expand:  # one slot per (token, local expert), grouped by expert; counts on the host
            counts = torch.tensor(handle.num_recv_tokens_per_expert_list, device=self.device)
            ids = torch.full((n, k), -1, dtype=torch.int64, device=self.device)
            ids[:, 0] = torch.repeat_interleave(self._experts, counts, output_size=n)
            weights = torch.zeros((n, k), dtype=torch.float32, device=self.device)
            weights[:, 0] = recv_weights.view(-1)
        else:  # slots past the received count are padding
            filled = torch.arange(n, device=self.device) < handle.psum_num_recv_tokens_per_scaleup_rank[-1]
            keep = filled.unsqueeze(1) & (recv_ids >= 0)
            ids = torch.where(keep, recv_ids.to(torch.int64) + self._lo, -1)
            weights = torch.where(keep, recv_weights, 0.0)
        return Dispatched(x=rx, topk_ids=ids, topk_weights=weights, handle=handle, x_scale=scales)

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        y, _, _ = self._buffer.combine(expert_out.to(torch.bfloat16).contiguous(), dispatched.handle)
        return y

    def close(self) -> None:
        buf, self._buffer = getattr(self, "_buffer", None), None
        if buf is not None:
            buf.destroy()


@register_backend
class DeepEPV2LowLatency(_DeepEPV2):
    name = "deepep_v2_low_latency"
    expand = False
    graph_capturable = True
    capacity_bound = True


@register_backend
class DeepEPV2HighThroughput(_DeepEPV2):
    name = "deepep_v2_high_throughput"
    expand = True
