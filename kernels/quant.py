"""Block-FP8 payloads: one fp32 scale per FP8_BLOCK consecutive elements of a row (DeepSeek-V3's
activation layout), quantized before dispatch, dequantized by the expert (here: the reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_BLOCK = 128
FP8_E4M3_MAX = 448.0


def scale_blocks(hidden: int) -> int:
    return -(-hidden // FP8_BLOCK)


def quantize_fp8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (q float8_e4m3fn [T, H], scales fp32 [T, ceil(H/128)]); x ~= q * scale."""
    t, h = x.shape
    s = scale_blocks(h)
    if h % FP8_BLOCK == 0:
        # The common case (H a multiple of 128): stay in x's dtype, no padded fp32 copy; the
        # reciprocal scale rounded to x's dtype costs far less than e4m3's own rounding.
        blocks = x.contiguous().view(t, s, FP8_BLOCK)
        scale = blocks.abs().amax(dim=2).float().clamp_min(1e-12) / FP8_E4M3_MAX
        q = (blocks * (1.0 / scale).to(x.dtype)[..., None]).view(t, h).to(torch.float8_e4m3fn)
        return q, scale
    blocks = F.pad(x.float(), (0, s * FP8_BLOCK - h)).view(t, s, FP8_BLOCK)
    scale = blocks.abs().amax(dim=2).clamp_min(1e-12) / FP8_E4M3_MAX
    q = (blocks / scale[..., None]).view(t, s * FP8_BLOCK)[:, :h].to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def dequantize_fp8_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q [N, H], scales [N, S]) -> fp32 [N, H]."""
    n, h = q.shape
    return (q.float().view(n, h) * scale.repeat_interleave(FP8_BLOCK, dim=1)[:, :h])
