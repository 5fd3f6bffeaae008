"""What the symmetric-memory backends share above their kernels: availability, the
workspace rendezvous, and the dispatch/combine driver (quantize, send, receive).

A backend names its kernel module; every such module has the same host API (`state`: the
rank's `RankState`; no call synchronises the host):

    workspace(geometry) -> Workspace      the regions of one rank's workspace
    dispatch_send(state, x, topk_ids, topk_weights, x_scale=None)   x_scale: block-FP8 rows;
                                          MXFP8 / NVFP4: x is packed rows of bytes (no x_scale)
    dispatch_recv(state) -> (x, topk_ids, topk_weights)   the received rows, once they arrived
    combine_send(state, expert_out)       expert_out [rows dispatch_recv returned, H]
    combine_recv(state, expert_out, topk_ids, y) -> y     y [T, H]: the source tokens' sums

With `state.phased` (virtual ranks, `a2a_tune.kernels.virtual`) every rank's send runs before
any rank's receive on one stream: only dispatch_recv and combine_recv may wait for peers' flags.
The backend's own calls come in the same four phases (`dispatch_send` ... `combine_recv`), which
`dispatch` and `combine` chain; a process group or a `VirtualRank` is its group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from types import ModuleType
from typing import Any, ClassVar

import torch

from ._nvlink_common import Geometry, LaunchKnobs, RankState
from .base import PAYLOADS, All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape, virtual_world
from .errors import ShapeError
from .quant import quantize_fp8_blocks, quantize_rows, wire_rows


def symmetric_memory_availability(env: BackendEnv) -> Availability:
    """What they need, checked without collectives."""
    if env.device_type != "cuda":
        return Availability(False, env.needs_cuda("symmetric memory over NVLink"))
    if env.world_size < 2:
        return Availability(False, "needs at least 2 ranks")
    if not env.peer_access:
        return Availability(False, "needs peer access between every pair of GPUs (one NVLink island)")
    if not env.has_package("triton"):
        return Availability(False, "triton not installed")
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as exc:
        return Availability(False, f"torch symmetric memory unavailable ({exc})")
    return Availability(True)


def rendezvous_workspace(nbytes: int, group, device: torch.device) -> tuple[torch.Tensor, list[int], object]:
    """Allocate this rank's symmetric workspace and map every peer's: (local, peer bases, handle)."""
    import torch.distributed._symmetric_memory as symm_mem

    try:
        if symm_mem.get_backend(device) is None:
            symm_mem.set_backend("CUDA")  # not NVSHMEM: plain CUDA IPC mappings, multicast unused
    except (AttributeError, RuntimeError):
        pass  # older torch: CUDA is the only backend; or it was chosen before
    buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(buf, group if group is not None else torch.distributed.group.WORLD)
    return buf, list(handle.buffer_ptrs), handle


#: Payloads that travel as packed rows of bytes (values, then scales): one copy per row.
PACKED = frozenset({"mxfp8", "nvfp4"})


@dataclass
class _Handle:
    topk_ids: torch.Tensor  # [T, k] the source tokens' ids: combine sums what came back for them
    tokens: int
    rows: int | None  # slots per source the dispatch used (set_step_tokens): combine must match
    expert_out: torch.Tensor | None = None  # [N, H] what combine_send sent (combine_recv reads ours)


class SymmetricMemoryBackend(All2AllBackend):
    """Base of the NVLink backends: subclasses name their kernel module (`kernels`)."""

    graph_capturable = True  # no host synchronisation anywhere
    # Quantized before dispatch (timed with it, as vLLM's prepare() does): block-FP8 rows with
    # their fp32 scales beside them; MXFP8 and NVFP4 as packed rows (values, then scales).
    payloads = frozenset({"bf16", "fp16", "fp32", "fp8_e4m3", "mxfp8", "nvfp4"})
    capacity_bound = True  # workspaces are W x max_tokens_per_rank slots
    reach = "island"  # CUDA IPC mappings between the GPUs of one node (no fabric handles)
    virtual_ranks = True  # peers only through `rendezvous`: W ranks can share one device
    kernels: ClassVar[ModuleType]  # the kernel module (host API in this module's docstring)
    # How the ranks map each other's workspaces: (nbytes, group, device) -> (this rank's uint8
    # buffer, every rank's base address in this process, a handle that keeps the mappings).
    # Torch symmetric memory here; the CPU tests put shared files in its place.
    rendezvous: ClassVar[Callable[..., tuple[torch.Tensor, list[int], object]]] = staticmethod(rendezvous_workspace)
    # Launch parameters of the kernels (`LaunchKnobs` says what each does); every value keeps
    # the results exact (the kernels only copy, and sum in fp32 in a fixed order).
    knob_space: ClassVar[dict[str, tuple]] = {
        "send_num_warps": (1, 2, 4, 8, 16),
        "recv_num_warps": (1, 2, 4, 8),
        "row_block_bytes": (2048, 4096, 8192, 16384, 32768),
        "recv_block_h": (512, 1024, 2048, 4096),
    }

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        return symmetric_memory_availability(env)

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        self.packed = shape.dtype in PACKED
        geometry = Geometry(
            self.world_size,
            shape.max_tokens_per_rank,
            shape.hidden,
            shape.topk,
            self.experts_per_rank,
            self.dtype,
            self.wire_dtype if not self.packed else None,
            PAYLOADS[shape.dtype].row_bytes(shape.hidden) if self.packed else 0,
        )
        layout = self.kernels.workspace(geometry)
        world = virtual_world(group)  # virtual ranks: their region of the world's one allocation
        rendezvous = self.rendezvous if world is None else world.rendezvous
        buf, bases, self._symm = rendezvous(layout.offsets()["total"], group, device)
        self.state = RankState.create(self.rank, geometry, layout, buf, bases)
        self.state.phased = world is not None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if world is None:  # (virtual ranks are built in turn by one process: none runs a kernel yet)
            torch.distributed.barrier(group=group)  # every rank's flags are zero before anyone signals

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        defaults = asdict(LaunchKnobs())
        cls.knob_defaults = {name: defaults[name] for name in cls.knob_space}

    def apply_knobs(self, knobs: dict[str, Any]) -> None:
        if self.state is not None:
            self.state.launch = replace(self.state.launch, **knobs)

    def set_step_tokens(self, tokens: int | None) -> None:
        super().set_step_tokens(tokens)
        if self.step_sized and self.state is not None:
            self.state.rows = tokens  # the kernels' slots per source (None: the capacity)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        return self.dispatch_recv(self.dispatch_send(x, topk_ids, topk_weights))

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        self.combine_send(expert_out, dispatched)
        return self.combine_recv(dispatched)

    # The four phases (virtual ranks run every rank's phase before the next phase of any).

    def dispatch_send(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> _Handle:
        """Check the inputs (the step too), quantize quantized payloads, send: the handle."""
        tokens = self.check_inputs(x, topk_ids, topk_weights)
        if self.packed:
            q, scales = quantize_rows(self.shape.dtype, x), None
        elif self.wire_dtype is not None:
            q, scales = quantize_fp8_blocks(x)
        else:
            q, scales = x.contiguous(), None
        ids = topk_ids.contiguous()  # the kernels index rows densely: combine needs the same tensor
        self.kernels.dispatch_send(self.state, q, ids, topk_weights.contiguous(), scales)
        return _Handle(ids, tokens, self.state.rows)

    def dispatch_recv(self, handle: _Handle) -> Dispatched:
        rx, rids, rw = self.kernels.dispatch_recv(self.state)
        if self.packed:
            q, scales = wire_rows(self.shape.dtype, rx, self.shape.hidden)
            return Dispatched(x=q, topk_ids=rids, topk_weights=rw, handle=handle, x_scale=scales)
        if self.wire_dtype is None:
            return Dispatched(x=rx, topk_ids=rids, topk_weights=rw, handle=handle)
        x_scale = self.state.received_scales()
        return Dispatched(x=rx.view(self.wire_dtype), topk_ids=rids, topk_weights=rw, handle=handle, x_scale=x_scale)

    def combine_send(self, expert_out: torch.Tensor, dispatched: Dispatched) -> None:
        h: _Handle = dispatched.handle
        if h.rows != self.state.rows:  # the kernels address rows by the step: it cannot change mid-trip
            raise ShapeError(f"set_step_tokens changed between dispatch ({h.rows}) and combine ({self.state.rows})")
        h.expert_out = expert_out.to(self.dtype).contiguous()  # [N, H]
        self.kernels.combine_send(self.state, h.expert_out)

    def combine_recv(self, dispatched: Dispatched) -> torch.Tensor:
        h: _Handle = dispatched.handle
        y = torch.empty(h.tokens, self.shape.hidden, dtype=self.dtype, device=self.device)
        return self.kernels.combine_recv(self.state, h.expert_out, h.topk_ids, y)

    def gave_up(self) -> bool:
        """Whether a flag wait timed out (a peer never signalled): results since are garbage."""
        return self.state is not None and self.state.gave_up()

    def close(self) -> None:
        self.state = None
        self._symm = None
