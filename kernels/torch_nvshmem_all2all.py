"""`torch_nvshmem_all2all`: torch's NVSHMEM all-to-all-v with the splits kept on the GPU
(`torch.ops.symm_mem.all_to_all_vdev_2d` to dispatch, `all_to_all_vdev_2d_offset` to combine),
the MoE all-to-all torchtitan uses. No engine runs it (no literal).

Mechanism: every (token, expert) pair is one row. A rank sorts its pairs by expert, counts
them per (destination rank, expert group) on the GPU and hands rows and counts to
`all_to_all_vdev_2d`, which exchanges the counts and pulls the rows (NVSHMEM gets) into
expert-group-major order on the receiver, with the chunk lengths and offsets written beside
them: no host read anywhere. Each row carries its expert id and router weight in a 16-byte
tail, so dispatch hands out one expert per row (column 0; -1 in unused rows), weighted as
the contract says. Combine sends the expert outputs back with `all_to_all_vdev_2d_offset`
(the dispatch's lengths and offsets as input), where they land in the source's sorted
order; the source puts them back in (token, k) order and sums a token's k rows in fp32.

Limits of torch's kernels: at least 2 ranks (its NVSHMEM symmetric memory refuses a group of
one), at most 16, and at most 16 expert groups per rank (one
warp-wide tile per group): with more experts per rank, a group is several consecutive
experts (its rows stay sorted by expert). torch ≥ 2.8 with NVSHMEM (the nvidia-nvshmem
wheel); symmetric memory then uses NVSHMEM for the whole process, so this backend cannot
share a process with the NVLink backends once they have allocated (CUDA backend), nor the
other way round: run it in a sweep of its own (`--backend torch_nvshmem_all2all`).

Design notes: docs/architecture.md, "Module notes", `kernels/torch_nvshmem_all2all.py`.
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from a2a_tune.tuner.runtime.text import one_line

from .base import All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape
from .errors import KernelsError
from .quant import quantize_fp8_blocks, scale_blocks
from .registry import register_backend

MAX_RANKS = 16  # all_to_all_vdev_2d_offset: ranks <= its tiles per block (512 threads / 32)
MAX_GROUPS = 16  # all_to_all_vdev_2d: expert groups per rank <= its tiles per block
TAIL = 16  # bytes after each row's payload: int32 expert id, fp32 weight, padding

_POOL: dict[tuple[str, str], torch.Tensor] = {}  # (group, role) -> symmetric byte buffer
_RETIRED: list[torch.Tensor] = []  # outgrown buffers, kept: freeing one is a collective


def expert_groups(experts_per_rank: int) -> int:
    """The most groups (<= MAX_GROUPS) that split a rank's experts evenly."""
    return max(g for g in range(1, MAX_GROUPS + 1) if experts_per_rank % g == 0)


def _align16(n: int) -> int:
    return -(-n // 16) * 16


@register_backend
class TorchNvshmemAll2All(All2AllBackend):
    name = "torch_nvshmem_all2all"
    reach = "island"  # NVSHMEM within one NVLink island (peer access)
    # Its buffers live in one NVSHMEM heap per process, bootstrapped over every rank of the job,
    # and are grown, never freed, per group: groups side by side are not run with it here.
    sub_group_reason = "its NVSHMEM team spans every rank of the job (NVSHMEM is started on the world)"
    closest_names = {"vllm": "flashinfer_nvlink_two_sided"}  # also an all-to-all-v
    graph_capturable = True  # counts stay on the GPU
    # block-FP8 rows and their scales travel in one row of bytes (MXFP8 / NVFP4: not yet)
    payloads = frozenset({"bf16", "fp16", "fp32", "fp8_e4m3"})

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        if env.device_type != "cuda":
            return Availability(False, env.needs_cuda("NVSHMEM"))
        if env.world_size < 2:
            return Availability(False, "needs at least 2 ranks")
        if env.world_size > MAX_RANKS:
            return Availability(False, f"torch's all_to_all_vdev_2d_offset runs at most {MAX_RANKS} ranks")
        try:
            import torch.distributed._symmetric_memory as symm_mem

            torch.ops.symm_mem.all_to_all_vdev_2d_offset  # noqa: B018 - registered by the import above
        except (ImportError, AttributeError, RuntimeError):
            return Availability(False, f"torch {torch.__version__} has no symm_mem.all_to_all_vdev_2d_offset")
        if not symm_mem.is_nvshmem_available():
            return Availability(
                False, "NVSHMEM missing: torch cannot load libnvshmem_host.so.3 (pip install nvidia-nvshmem-cu13)"
            )
        if not env.peer_access:
            return Availability(False, "no peer access between every pair of GPUs (NVSHMEM within one NVLink island)")
        return Availability(True)

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if world_size > MAX_RANKS:
            return Availability(False, f"torch's all_to_all_vdev_2d_offset runs at most {MAX_RANKS} ranks")
        return super().feasibility(shape, world_size)

    @classmethod
    def received_rows(cls, shape: MoEShape, world_size: int) -> int:
        """W x capacity x min(k, experts per rank), plus a padding row per expert group."""
        per_rank = shape.experts_per_rank(world_size)
        return world_size * shape.max_tokens_per_rank * min(shape.topk, per_rank) + expert_groups(max(per_rank, 1))

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        s, w = shape, self.world_size
        self._group_name = (group if group is not None else dist.group.WORLD).group_name
        self._groups = expert_groups(self.experts_per_rank)  # ne of torch's kernels
        self._group_size = self.experts_per_rank // self._groups
        self._use_nvshmem()

        wire = self.wire_dtype or self.dtype
        self._payload = _align16(s.hidden * wire.itemsize)  # row bytes: payload, scales, tail
        self._scales = scale_blocks(s.hidden) * 4 if self.wire_dtype is not None else 0
        row = self._payload + self._scales + TAIL
        send_rows = s.max_tokens_per_rank * s.topk
        recv_rows = w * s.max_tokens_per_rank * min(s.topk, self.experts_per_rank) + self._groups
        chunks = w * self._groups

        self._send = self._take("send", (send_rows, row), torch.uint8)
        self._recv = self._take("recv", (recv_rows, row), torch.uint8)
        self._splits = self._take("splits", (chunks,), torch.int64)
        self._layout = self._take("layout", (2, chunks), torch.int64)  # lengths, offsets per chunk
        self._back_in = self._take("back_in", (recv_rows, s.hidden), self.dtype)
        self._back_out = self._take("back_out", (send_rows, s.hidden), self.dtype)
        self._back_layout = self._take("back_layout", (2, chunks), torch.int64)

        # Typed views of the rows: payload, block scales, tail (id, weight).
        self._send_x, self._send_scale, self._send_id, self._send_w = self._fields(self._send, wire)
        self._recv_x, self._recv_scale, self._recv_id, self._recv_w = self._fields(self._recv, wire)
        # Chunk boundaries in sorted expert ids: chunk c = (rank, group) holds experts from c * group_size.
        self._bounds = torch.arange(chunks + 1, dtype=torch.int64, device=device) * self._group_size
        self._ids = torch.full((recv_rows, s.topk), -1, dtype=torch.int32, device=device)
        self._weights = torch.zeros((recv_rows, s.topk), dtype=torch.float32, device=device)
        self._marks = torch.zeros(recv_rows + 1, dtype=torch.int32, device=device)
        self._ones = torch.ones(chunks, dtype=torch.int32, device=device)

    def _take(self, role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        return self._symmetric(role, nbytes)[:nbytes].view(dtype).view(shape)

    def _fields(self, rows: torch.Tensor, wire: torch.dtype):
        h = self.shape.hidden
        x = rows[:, : h * wire.itemsize].view(wire)
        scale = rows[:, self._payload : self._payload + self._scales].view(torch.float32) if self._scales else None
        tail = rows[:, self._payload + self._scales :]
        return x, scale, tail.view(torch.int32)[:, 0], tail.view(torch.float32)[:, 1]

    # -- what touches NVSHMEM (the CPU tests emulate these three over gloo) --------------------

    def _use_nvshmem(self) -> None:
        """Make NVSHMEM the process's symmetric-memory backend (it can be chosen only once)."""
        import torch.distributed._symmetric_memory as symm_mem

        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")  # no NVLink multicast: this moves rows only
        # get_backend answers "CUDA" before anything was allocated (torch 2.11): ask to switch,
        # which torch refuses once a symmetric tensor exists.
        if symm_mem.get_backend(self.device) != "NVSHMEM":
            try:
                symm_mem.set_backend("NVSHMEM")
            except RuntimeError as exc:
                raise KernelsError(
                    f"torch symmetric memory in this process already allocated with another backend "
                    f"({one_line(str(exc)) or 'set_backend refused'}); "
                    f"run {self.name} in a sweep of its own (--backend {self.name})"
                ) from exc

    def _symmetric(self, role: str, nbytes: int) -> torch.Tensor:
        """A symmetric byte buffer of at least `nbytes` (collective on first use and growth)."""
        import torch.distributed._symmetric_memory as symm_mem

        key = (self._group_name, role)
        buf = _POOL.get(key)
        if buf is None or buf.numel() < nbytes:
            if buf is not None:
                _RETIRED.append(buf)
            size = _align16(max(nbytes, 2 * buf.numel() if buf is not None else 0, 16))
            buf = symm_mem.empty(size, dtype=torch.uint8, device=self.device)
            symm_mem.rendezvous(buf, self._group_name)
            _POOL[key] = buf
        return buf

    def _shuffle(self, send: torch.Tensor, recv: torch.Tensor, splits: torch.Tensor, layout: torch.Tensor) -> None:
        torch.ops.symm_mem.all_to_all_vdev_2d(send, recv, splits, layout, self._group_name)

    def _shuffle_back(self, out: torch.Tensor, back: torch.Tensor, layout: torch.Tensor, back_layout) -> None:
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(out, back, layout, back_layout, self._group_name)

    # -- the contract ---------------------------------------------------------------------------

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        tokens = self.check_inputs(x, topk_ids, topk_weights)
        n = tokens * self.shape.topk
        experts, order = torch.sort(topk_ids.reshape(-1).to(torch.int64), stable=True)
        source = order // self.shape.topk  # the token of each sorted pair
        edges = torch.searchsorted(experts, self._bounds)
        self._splits.copy_(edges[1:] - edges[:-1])
        q, scales = quantize_fp8_blocks(x) if self.wire_dtype is not None else (x, None)
        self._send_x[:n].copy_(q.index_select(0, source))
        if scales is not None:
            self._send_scale[:n].copy_(scales.index_select(0, source))
        self._send_id[:n].copy_(experts)
        self._send_w[:n].copy_(topk_weights.reshape(-1).index_select(0, order))
        self._shuffle(self._send, self._recv, self._splits, self._layout)
        # Rows inside a received chunk are real; the rest (an empty group's row, the tail of
        # the buffer) hold whatever was there before: their id becomes -1.
        lengths, offsets = self._layout[0], self._layout[1]
        self._marks.zero_()
        self._marks.index_add_(0, offsets, self._ones)
        self._marks.index_add_(0, offsets + lengths, -self._ones)
        real = self._marks[:-1].cumsum(0) > 0
        self._ids[:, 0].copy_(torch.where(real, self._recv_id, -1))
        self._weights[:, 0].copy_(torch.where(real, self._recv_w, 0.0))
        return Dispatched(
            x=self._recv_x,
            topk_ids=self._ids,
            topk_weights=self._weights,
            handle=(tokens, order),
            x_scale=self._recv_scale,
        )

    def combine_buffer(self, dispatched: Dispatched) -> torch.Tensor:
        return self._back_in

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        tokens, order = dispatched.handle
        if expert_out.data_ptr() != self._back_in.data_ptr():
            self._back_in.copy_(expert_out)
        self._shuffle_back(self._back_in, self._back_out, self._layout, self._back_layout)
        k, h = self.shape.topk, self.shape.hidden
        rows = self._back_out[: tokens * k]  # the pairs in the sorted order they were sent in
        unsorted = torch.empty_like(rows).index_copy_(0, order, rows)
        return unsorted.view(tokens, k, h).sum(dim=1, dtype=torch.float32).to(self.dtype)

    def close(self) -> None:
        # The symmetric buffers belong to the process-wide pool (see the module docstring).
        self._send = self._recv = self._back_in = self._back_out = None
