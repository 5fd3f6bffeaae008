"""Metadata packing and collective wrappers shared by the torch.distributed backends.

Token rows travel as they are (no staging copy of the hidden states), or, for a quantized
payload, as packed rows of bytes (the values then their scales, `quant.wire_rows`: one
collective moves both, as vLLM's all-gather moves its quantized rows and scales); each token's
routing metadata travels beside them as one int32 row [topk_ids | topk_weights bit-cast to
int32], so ids and weights cost one small collective together instead of two.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .base import PAYLOADS, Dispatched, MoEShape, torch_dtype
from .quant import quantize_rows, wire_rows


def row_format(shape: MoEShape) -> tuple[int, torch.dtype]:
    """(elements, dtype) of one dispatched row of `shape`'s payload: H activations, or its
    packed bytes."""
    payload = PAYLOADS[shape.dtype]
    if payload.quantized:
        return payload.row_bytes(shape.hidden), torch.uint8
    return shape.hidden, torch_dtype(shape.dtype)


def send_rows(shape: MoEShape, x: torch.Tensor) -> torch.Tensor:
    """The rows a dispatch moves for x [T, H]: x, or its quantized packed rows (the quantize is
    timed with the dispatch, as the engines' dispatch steps quantize)."""
    return quantize_rows(shape.dtype, x) if PAYLOADS[shape.dtype].quantized else x


def received(shape: MoEShape, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x, x_scale) for `Dispatched` from the rows a dispatch received."""
    if PAYLOADS[shape.dtype].quantized:
        return wire_rows(shape.dtype, rows, shape.hidden)
    return rows, None


def pack_meta(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """[T, k] ids + [T, k] fp32 weights -> int32 [T, 2k]."""
    return torch.cat([topk_ids.to(torch.int32), topk_weights.to(torch.float32).view(torch.int32)], dim=1)


def unpack_meta(meta: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [N, 2k] -> topk_ids int64 [N, k], topk_weights fp32 [N, k]."""
    return meta[:, :topk].to(torch.int64), meta[:, topk:].contiguous().view(torch.float32)


def mask_nonlocal(topk_ids: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Global ids with every expert outside [lo, hi) replaced by -1."""
    return torch.where((topk_ids >= lo) & (topk_ids < hi), topk_ids, torch.full_like(topk_ids, -1))


def as_dispatched(
    shape: MoEShape, rows: torch.Tensor, meta: torch.Tensor, experts: tuple[int, int], handle
) -> Dispatched:
    """What a dispatch returns from the rows and metadata it received: the payload (and its
    scales), the routing with every expert outside this rank's `experts` range [lo, hi) as -1."""
    ids, weights = unpack_meta(meta, shape.topk)
    x, scales = received(shape, rows)
    return Dispatched(x=x, topk_ids=mask_nonlocal(ids, *experts), topk_weights=weights, handle=handle, x_scale=scales)


# torch 2.13 renamed the flat collectives and deprecates the old names; 2.11 (the GPU image) has
# only the old ones.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    _all_gather_flat(out, inp, group=group)


def reduce_scatter_flat(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    _reduce_scatter_flat(out, inp, group=group)
