"""Quantized payloads in the engines' wire layout, quantized before dispatch and dequantized by
the expert (here: the reference). :func:`quantize` / :func:`dequantize` take any quantized
payload name (``runtime.point.PAYLOADS``); the torch paths here are the reference the Triton
kernels (``_quant_kernels``) match bit for bit.

* **fp8_e4m3** (block-FP8, DeepSeek-V3's activations): q float8_e4m3fn [T, H], one fp32 scale
  per 128 elements, scales [T, ceil(H/128)] row-major (vLLM ``per_token_group_quant_fp8``).
* **mxfp8**: q float8_e4m3fn [T, H]; scales uint8 [T, H/32], row-major (linear), each the
  E8M0 biased exponent ``ceil(log2(amax / 448)) + 127`` clamped to 0..254; q = x / 2^(s-127).
  As vLLM 0.33's ``mxfp8_e4m3_quantize`` with ``is_sf_swizzled_layout=False``, the layout
  its all2all prepares carry (``model_executor/layers/quantization/utils/mxfp8_utils.py``,
  ``prepare_finalize/flashinfer_nvlink_one_sided.py``). The exponent is computed on the bits
  of amax / 448 (vLLM's torch path takes ``log2``, which agrees but where log2 of a ratio just
  above a power of two rounds onto the integer).
* **nvfp4**: q uint8 [T, H/2], two e2m1 codes a byte, element 2i in the low nibble and 2i+1 in
  the high one; scales float8_e4m3fn [T, H/16] row-major (linear: vLLM quantizes with
  ``is_scale_swizzled=False`` before its all2alls and swizzles after, ``prepare_finalize/
  naive_dp_ep.py``, ``flashinfer_nvlink_one_sided.py``); with global scale g, per block
  s = e4m3(min(g * amax / 6, 448)), q = e2m1(clamp(x / (s / g), -6, 6)), rounded to nearest
  even: the arithmetic of vLLM's ``ref_nvfp4_quant`` (``quantization/utils/
  nvfp4_emulation_utils.py``) with IEEE divisions (its CUDA kernel takes approximate
  reciprocals). g is a per-layer constant (the checkpoint's input scale) that every rank
  holds: :data:`NVFP4_GLOBAL_SCALE` for our cases.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from .base import FP4_E2M1_MAX, FP8_BLOCK, FP8_E4M3_MAX, NVFP4_GLOBAL_SCALE, PAYLOADS

#: e2m1 magnitudes by code (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

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


# ---------------------------------------------------------------- any quantized payload


def quantize(dtype: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (q, scales) of payload `dtype` in its wire layout (the module docstring).

    On CUDA one Triton kernel each (bit-exact with the torch paths, which run elsewhere)."""
    if dtype == "fp8_e4m3":
        return quantize_fp8_blocks(x)
    q, scales = empty_wire(dtype, x.shape[0], x.shape[1], x.device)
    quantize_into(dtype, x, q, scales)
    return q, scales


def empty_wire(dtype: str, tokens: int, hidden: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, scales) of payload `dtype` (mxfp8 or nvfp4) for `tokens` rows."""
    p = PAYLOADS[dtype]
    if dtype == "mxfp8":
        q = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn, device=device)
        return q, torch.empty(tokens, p.scales(hidden), dtype=torch.uint8, device=device)
    q = torch.empty(tokens, p.value_bytes(hidden), dtype=torch.uint8, device=device)
    return q, torch.empty(tokens, p.scales(hidden), dtype=torch.float8_e4m3fn, device=device)


def wire_rows(dtype: str, rows: torch.Tensor, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) views of packed rows [N, row_bytes] uint8: each row is the packed values
    then the scales (the layout of the backends that move one row of bytes per token)."""
    p = PAYLOADS[dtype]
    qb = p.value_bytes(hidden)
    q, scales = rows[:, :qb], rows[:, qb : qb + p.scales(hidden) * p.scale_bytes]
    if dtype == "mxfp8":
        return q.view(torch.float8_e4m3fn), scales
    if dtype == "nvfp4":
        return q, scales.view(torch.float8_e4m3fn)
    return q.view(torch.float8_e4m3fn), scales.contiguous().view(torch.float32)  # fp8_e4m3


def quantize_rows(dtype: str, x: torch.Tensor) -> torch.Tensor:
    """x [T, H] -> packed rows [T, row_bytes] uint8 (see `wire_rows`), written in place by the
    kernel where it can (mxfp8, nvfp4), else copied."""
    t, h = x.shape
    rows = torch.empty(t, PAYLOADS[dtype].row_bytes(h), dtype=torch.uint8, device=x.device)
    if dtype == "fp8_e4m3":
        q, scales = quantize_fp8_blocks(x)
        rows[:, :h] = q.view(torch.uint8)
        rows[:, h:] = scales.view(torch.uint8).view(t, -1)
        return rows
    quantize_into(dtype, x, *wire_rows(dtype, rows, h))
    return rows


def quantize_into(dtype: str, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> None:
    """Quantize x [T, H] to payload `dtype` (mxfp8 or nvfp4) into q and scales (views whose rows
    may be strided, as `wire_rows` gives): the Triton kernel on CUDA, the torch path elsewhere."""
    if x.is_cuda and x.device not in _TRITON_FAILED and (k := _kernels()) is not None:
        try:
            k.QUANTIZE[dtype](x, q, scales)
            return
        except Exception as exc:  # compile or launch failed
            if torch.cuda.is_current_stream_capturing():
                raise
            _TRITON_FAILED.add(x.device)
            logging.getLogger(__name__).warning(
                "a2a-tune: the Triton %s quantizer failed on %s (%s: %s); using the torch path there",
                dtype,
                x.device,
                type(exc).__name__,
                (str(exc).strip().splitlines() or [""])[0],
            )
    rq, rs = QUANTIZE_TORCH[dtype](x)
    q.copy_(rq)
    scales.copy_(rs)


def dequantize(dtype: str, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(q, scales) of payload `dtype` -> fp32 [N, H]: what the expert computes on."""
    if dtype == "fp8_e4m3":
        return dequantize_fp8_blocks(q, scales)
    if dtype == "mxfp8":
        n, h = q.shape
        factor = (scales.to(torch.int32) << 23).view(torch.float32)  # 2^(s-127); s = 0: 0, never used
        factor = torch.where(scales == 0, torch.tensor(2.0**-127, device=q.device), factor)
        return (q.float().view(n, -1, 32) * factor[..., None]).view(n, h)
    n, half = q.shape  # nvfp4
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=q.device)
    codes = torch.stack((q & 0xF, q >> 4), dim=2).view(n, 2 * half).long()
    block = scales.float() * (1.0 / torch.tensor(NVFP4_GLOBAL_SCALE))
    return (table[codes].view(n, -1, 16) * block[..., None]).view(n, 2 * half)


def _e8m0_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The E8M0 biased exponent ceil(log2(amax / 448)) + 127, clamped to 0..254, from the bits
    of the fp32 ratio (amax clamped to the smallest normal first, as vLLM does)."""
    r = amax.clamp_min(torch.finfo(torch.float32).tiny) / FP8_E4M3_MAX
    bits = r.view(torch.int32)
    field, mant = bits >> 23, bits & 0x7FFFFF
    normal = (field + (mant != 0).to(torch.int32)).clamp(0, 254)
    sub = (mant > (1 << 22)).to(torch.int32)  # subnormal ratio: ceil(log2) + 127 is 1 above 2^-127, else <= 0
    return torch.where(field == 0, sub, normal)


def quantize_mxfp8_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 in torch ops: (q float8_e4m3fn [T, H], E8M0 scales uint8 [T, H/32])."""
    t, h = x.shape
    blocks = x.float().view(t, h // 32, 32)
    s = _e8m0_exponent(blocks.abs().amax(dim=2))
    descale = torch.where(s == 0, 0x00400000, s << 23).view(torch.float32)  # 2^(s-127), exactly
    q = (blocks / descale[..., None]).view(t, h).to(torch.float8_e4m3fn)
    return q, s.to(torch.uint8)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (already scaled into +-6) -> e2m1 codes (int32, sign in bit 3), rounded to
    nearest even: the thresholds sit halfway between neighbours, ties to the even code."""
    a = v.abs()
    mag = (
        (a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
        + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int()
    )  # fmt: skip  # the seven thresholds of the e2m1 grid on two rows, read as one line
    return mag | ((v.view(torch.int32) >> 28) & 0x8)


def quantize_nvfp4_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 in torch ops: (q uint8 [T, H/2], scales float8_e4m3fn [T, H/16])."""
    t, h = x.shape
    g = torch.tensor(NVFP4_GLOBAL_SCALE, dtype=torch.float32)
    blocks = x.float().view(t, h // 16, 16)
    amax = blocks.abs().amax(dim=2)
    s = (g * (amax * torch.tensor(1.0 / FP4_E2M1_MAX))).clamp(max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    block_scale = s.float() * (1.0 / g)  # one e2m1 unit: vLLM's scale * reciprocal(global scale)
    inv = torch.where(block_scale == 0, 0.0, 1.0 / block_scale)
    codes = e2m1_codes((blocks * inv[..., None]).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)).view(t, h // 2, 2)
    q = (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)
    return q, s


QUANTIZE_TORCH = {"mxfp8": quantize_mxfp8_torch, "nvfp4": quantize_nvfp4_torch}
