"""Block-FP8 quantization (`quant.quantize_fp8_blocks`) as one Triton kernel.

Why: the torch path is a chain of ~8 kernels (abs, amax, clamp, scale, reciprocal, casts,
multiply, cast), each a launch inside every fp8 dispatch, captured graph or not, and each a
round trip of the activations through memory. Here one program quantizes BLOCK_N blocks of 128
elements: x read once, q and the scales written once.

With H a multiple of 128, x [T, H] is x [T*S, 128] and the scales [T, S] are [T*S]: a block is
one row of that matrix, wherever it sits in x. The kernel repeats the torch path's arithmetic
(quant.py, H % 128 == 0) operation for operation, bit-exact, NaN and inf included (a NaN's
sign aside, which differs between CPUs and GPUs in torch too).

Torch rounds by casting: to x's dtype (the reciprocal scale, the product), then to e4m3. On
GPUs with an fp8 conversion (sm_89+) the kernel casts the same way (HW_CVT). Elsewhere it
rounds in integer arithmetic on float32 bits: under Triton's interpreter, whose float32 -> bf16
cast truncates and whose fp8 cast rounds wrongly, and on older GPUs, which have no fp8
conversion. That path is what the CPU tests check; the GPU tests check both against torch on
every bf16 value. Its ~15 more operations an element make it compute-bound (BENCHMARKS.md,
"Figures moved from the code"). q is written as e4m3 bit patterns.

Triton is imported here, at the top: quant.py imports this module only for a CUDA tensor.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from .base import FP8_BLOCK, FP8_E4M3_MAX  # not from quant.py: it imports this module

# Dtypes of x the kernel rounds like torch: the product of two bf16 is exact in fp32, so
# rounding it to bf16 afterwards is torch's bf16 multiply. fp16 would need its own exponent
# range (overflow, subnormals) on top of the mantissa rounding: it stays on the torch path.
_ROUND_BITS = {torch.bfloat16: 16, torch.float32: 0}  # float32 mantissa bits x's dtype lacks

BLOCK_N_MAX = 32  # blocks per program: [32, 128] elements, 8 KB of bf16 in flight per program
_MIN_PROGRAMS = 512  # fewer BLOCK_N_MAX-sized programs (small T): smaller ones, to use every SM


def supports(x: torch.Tensor) -> bool:
    return x.dtype in _ROUND_BITS and x.dim() == 2 and x.shape[1] % FP8_BLOCK == 0


@triton.jit
def _round_bits(u, DROP: tl.constexpr):
    """float32 bits u -> bits of u rounded to nearest-even with DROP fewer mantissa bits.

    A carry out of the mantissa lands in the exponent, which is what rounding up must do."""
    if DROP > 0:
        u = u + ((1 << (DROP - 1)) - 1) + ((u >> DROP) & 1)
        u = u & (0xFFFFFFFF ^ ((1 << DROP) - 1))
    return u


@triton.jit(do_not_specialize=["n_blocks"])  # no variant per token count (BLOCK_N aside)
def _quantize_fp8_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_blocks,
    INV_MAX: tl.constexpr,
    ROUND_BITS: tl.constexpr,
    BF16_BITS: tl.constexpr,
    HW_CVT: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_blocks
    offs = rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    if BF16_BITS:  # bf16 loaded as int16: its bits are a float32's upper half, no cast involved
        bits = tl.load(x_ptr + offs, mask=rmask[:, None], other=0).to(tl.int32) << 16
    else:
        bits = tl.load(x_ptr + offs, mask=rmask[:, None], other=0.0).to(tl.int32, bitcast=True)
    x = bits.to(tl.float32, bitcast=True)
    # amax on the bits of |x|: they order as the values do, and NaN's are the largest, so a NaN
    # propagates as in torch's amax (a float max would drop it, a NaN-propagating one is a
    # generic reduction, slow under the interpreter)
    amax = tl.max(bits & 0x7FFFFFFF, axis=1).to(tl.float32, bitcast=True)
    # scale = amax / 448 as torch computes it: clamp, then multiply by fp32(1/448) (see quant.py)
    scale = tl.maximum(amax, 1e-12, propagate_nan=tl.PropagateNan.ALL) * INV_MAX
    tl.store(s_ptr + rows, scale, mask=rmask)
    # torch: (1.0 / scale) is an IEEE reciprocal (the default `/` may be approximate), then
    # rounded to x's dtype; the product again in x's dtype; then the cast to e4m3
    inv = tl.math.div_rn(tl.full([BLOCK_N], 1.0, tl.float32), scale)
    if HW_CVT:  # the same casts, where the GPU has them all (sm_89+: fp8)
        if ROUND_BITS == 16:
            inv = inv.to(tl.bfloat16).to(tl.float32)
            y = (x * inv[:, None]).to(tl.bfloat16).to(tl.float32)
        else:
            y = x * inv[:, None]
        code = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        # cvt.rn.satfinite saturates where torch's cast gives NaN (above 464), but no y gets
        # there: |y| <= 448 * (1 + 2^-8) for finite x, and inf in x makes y NaN, kept as NaN
    else:  # casts as integer arithmetic on float32 bits
        # NaN's are clamped to inf before rounding: rounding up the all-ones mantissa of the
        # GPU's NaN would carry into the sign bit
        inv = inv.to(tl.uint32, bitcast=True)
        inv = _round_bits(tl.minimum(inv, 0x7F800000), ROUND_BITS).to(tl.float32, bitcast=True)
        p = (x * inv[:, None]).to(tl.uint32, bitcast=True)
        mag = _round_bits(tl.minimum(p & 0x7FFFFFFF, 0x7F800000), ROUND_BITS)  # |y|
        # e4m3 in its normal range (|y| >= 2^-6): drop 20 mantissa bits, rebias the exponent
        # (127 -> 7). Below it e4m3 is a fixed grid of 2^-9: adding 2^14 makes the fp32 adder
        # round onto that grid, and the bits above 2^14's are the code. Above 464 (rounding
        # up to 480, or inf and NaN: only from inf/NaN in x) torch's cast gives NaN, 0x7F.
        normal = (_round_bits(mag, 20) >> 20) - (120 << 3)
        sub = (mag.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - 0x46800000
        code = tl.where(mag > 0x43E80000, 0x7F, tl.where(mag >= 0x3C800000, normal, sub))
        code = (code | ((p >> 24) & 0x80)).to(tl.uint8)
    tl.store(q_ptr + offs, code, mask=rmask[:, None])


def _block_n(n_blocks: int) -> int:
    """Blocks per program: BLOCK_N_MAX, unless that leaves the GPU mostly idle (small T)."""
    bn = BLOCK_N_MAX
    while bn > 1 and triton.cdiv(n_blocks, bn) < _MIN_PROGRAMS:
        bn //= 2
    return bn


@functools.cache
def _has_fp8_conversion(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_fp8_blocks(
    x: torch.Tensor, block_n: int | None = None, hw_cvt: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """quant.quantize_fp8_blocks for `supports(x)`: one launch, no host synchronisation.

    Tests' overrides: block_n (a power of 2) for `_block_n()` (the interpreter is slow per
    program), hw_cvt for the GPU's own casts (default: CUDA tensors on sm_89+)."""
    t, h = x.shape
    x = x.contiguous()
    q = torch.empty((t, h), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((t, h // FP8_BLOCK), dtype=torch.float32, device=x.device)
    n = t * (h // FP8_BLOCK)
    if n == 0:
        return q, scale
    if hw_cvt is None:
        hw_cvt = x.is_cuda and _has_fp8_conversion(x.device)
    bn = block_n or _block_n(n)
    bf16 = x.dtype == torch.bfloat16
    # Triton launches on the current device's stream, not x's: make x's device current
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _quantize_fp8_kernel[(triton.cdiv(n, bn),)](
            x.view(torch.int16) if bf16 else x,
            q.view(torch.uint8),
            scale,
            n,
            INV_MAX=1.0 / FP8_E4M3_MAX,
            ROUND_BITS=_ROUND_BITS[x.dtype],
            BF16_BITS=bf16,
            HW_CVT=hw_cvt,
            BLOCK=FP8_BLOCK,
            BLOCK_N=bn,
            num_warps=4,
        )
    return q, scale
