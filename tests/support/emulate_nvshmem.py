"""`torch_nvshmem_all2all_emulated`: the torch_nvshmem_all2all backend with torch's two NVSHMEM
kernels replaced by gloo collectives that do what their documentation says, so everything
around them (pair sorting, chunk counts, row packing, the validity of received rows, the
un-sorting and sum of combine) runs over real ranks on CPU.

Loaded like a plugin (`A2A_TUNE_BACKEND_MODULES=emulate_nvshmem`). What the emulation assumes,
from torch's `nvshmem_extension.cu`:
- all_to_all_vdev_2d: splits are rank-major (dest * ne + group); the receiver lays chunks out
  group-major (group, then source rank), contiguously, an empty group taking one row
  (major_align 1); `layout` becomes [lengths; offsets] indexed group * W + source.
- all_to_all_vdev_2d_offset: input chunks at the given lengths/offsets (group-major) go back
  to their source, laid out rank-major (dest * ne + group) without padding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from a2a_tune.kernels.registry import register_backend
from a2a_tune.kernels.torch_nvshmem_all2all import TorchNvshmemAll2All


def _gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


@register_backend
class EmulatedTorchNvshmem(TorchNvshmemAll2All):
    name = "torch_nvshmem_all2all_emulated"

    def _use_nvshmem(self) -> None:
        self._pool: dict[str, torch.Tensor] = {}

    def _symmetric(self, role: str, nbytes: int) -> torch.Tensor:
        # Poisoned (ids 0x3F3F3F3F: no expert), so rows the kernels never wrote are garbage, as in
        # reused symmetric memory.
        return self._pool.setdefault(role, torch.full((nbytes + 16,), 0x3F, dtype=torch.uint8))

    def _shuffle(self, send, recv, splits, layout) -> None:
        w, me, ne = self.world_size, self.rank, self._groups
        all_splits = [s.tolist() for s in _gather(splits, self.group)]
        all_send = _gather(send, self.group)
        pos = 0
        for g in range(ne):
            start = pos
            for src in range(w):
                j = me * ne + g
                length, offset = all_splits[src][j], sum(all_splits[src][:j])
                recv[pos : pos + length] = all_send[src][offset : offset + length]
                layout[0, g * w + src], layout[1, g * w + src] = length, pos
                pos += length
            pos = start + max(pos - start, 1)

    def _shuffle_back(self, out, back, layout, back_layout) -> None:
        w, me, ne = self.world_size, self.rank, self._groups
        all_out = _gather(out, self.group)
        all_layout = [t.tolist() for t in _gather(layout, self.group)]
        pos = 0
        for dest in range(w):
            for g in range(ne):
                length, offset = all_layout[dest][0][g * w + me], all_layout[dest][1][g * w + me]
                back[pos : pos + length] = all_out[dest][offset : offset + length]
                back_layout[0, dest * ne + g], back_layout[1, dest * ne + g] = length, pos
                pos += length
