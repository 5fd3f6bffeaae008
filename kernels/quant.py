"""Block-FP8 payloads: one fp32 scale per FP8_BLOCK consecutive elements of a row (DeepSeek-V3's
activation layout), quantized before dispatch, dequantized by the expert (here: the reference)."""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from .base import FP8_BLOCK, FP8_E4M3_MAX

# scale = amax * fp32(1/448), not amax / 448: what torch computes on CUDA anyway (a division by
# a Python scalar there is a multiply by its reciprocal), written out so that CPU, CUDA and the
# Triton kernel agree to the bit (a true division differs in the last bit for ~1/3 of blocks).
_INV_E4M3_MAX = 1.0 / FP8_E4M3_MAX


def scale_blocks(hidden: int) -> int:
    return -(-hidden // FP8_BLOCK)


@functools.cache
def _kernels():
    """The Triton kernel's module, or None without Triton (it is imported on first use)."""
    try:
        from . import _quant_kernels
    except ImportError:
        return None
    return _quant_kernels


_TRITON_FAILED: set = set()  # devices where the Triton kernel failed once: the torch path since


def quantize_fp8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (q float8_e4m3fn [T, H], scales fp32 [T, ceil(H/128)]); x ~= q * scale.

    On CUDA with H % 128 == 0 (bf16 or fp32 x) one Triton kernel, bit-exact with the torch
    path below, which stays the reference and the path everywhere else."""
    if x.is_cuda and x.device not in _TRITON_FAILED and (k := _kernels()) is not None and k.supports(x):
        try:
            return k.quantize_fp8_blocks(x)
        except Exception as exc:  # compile or launch failed (ptxas, libcuda, an old driver...)
            if torch.cuda.is_current_stream_capturing():
                raise  # a capture cannot fall back halfway; the warm-up before it would have
            _TRITON_FAILED.add(x.device)
            first = (str(exc).strip().splitlines() or [""])[0]
            logging.getLogger(__name__).warning(
                "a2a-tune: the Triton FP8 quantizer failed on %s (%s: %s); using the torch path there",
                x.device,
                type(exc).__name__,
                first,
            )
    return quantize_fp8_blocks_torch(x)


def quantize_fp8_blocks_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_fp8_blocks in torch ops (~8 kernels): any device, dtype and H."""
    t, h = x.shape
    s = scale_blocks(h)
    if h % FP8_BLOCK == 0:
        # The common case (H a multiple of 128): stay in x's dtype, no padded fp32 copy; the
        # reciprocal scale rounded to x's dtype costs far less than e4m3's own rounding.
        blocks = x.contiguous().view(t, s, FP8_BLOCK)
        scale = blocks.abs().amax(dim=2).float().clamp_min(1e-12) * _INV_E4M3_MAX
        q = (blocks * (1.0 / scale).to(x.dtype)[..., None]).view(t, h).to(torch.float8_e4m3fn)
        return q, scale
    blocks = F.pad(x.float(), (0, s * FP8_BLOCK - h)).view(t, s, FP8_BLOCK)
    scale = blocks.abs().amax(dim=2).clamp_min(1e-12) * _INV_E4M3_MAX
    q = (blocks / scale[..., None]).view(t, s * FP8_BLOCK)[:, :h].to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def dequantize_fp8_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q [N, H], scales [N, S]) -> fp32 [N, H]."""
    n, h = q.shape
    return q.float().view(n, h) * scale.repeat_interleave(FP8_BLOCK, dim=1)[:, :h]
