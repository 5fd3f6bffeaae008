"""The payload quantizers as Triton kernels: block-FP8 (`quant.quantize_fp8_blocks`), here, and
MXFP8 and NVFP4 (`quant.quantize_into`), in the section of their own below.

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

from .base import FP4_E2M1_MAX, FP8_BLOCK, FP8_E4M3_MAX, NVFP4_GLOBAL_SCALE  # not from quant.py: it imports this module

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


@triton.jit
def _e4m3_code(mag):
    """|y| as float32 bits (NaN clamped to inf) -> its e4m3 code without the sign, rounded to
    nearest even as torch's cast does."""
    # e4m3 in its normal range (|y| >= 2^-6): drop 20 mantissa bits, rebias the exponent
    # (127 -> 7). Below it e4m3 is a fixed grid of 2^-9: adding 2^14 makes the fp32 adder
    # round onto that grid, and the bits above 2^14's are the code. Above 464 (rounding
    # up to 480, or inf and NaN: only from inf/NaN in x) torch's cast gives NaN, 0x7F.
    normal = (_round_bits(mag, 20) >> 20) - (120 << 3)
    sub = (mag.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - 0x46800000
    return tl.where(mag > 0x43E80000, 0x7F, tl.where(mag >= 0x3C800000, normal, sub))


@triton.jit
def _load_bits(x_ptr, offs, mask, BF16: tl.constexpr):
    """float32 bits of x at offs (bf16 loaded as int16: its bits are a float32's upper half).

    One return at the end: the compiler, unlike the interpreter, takes no early return from a
    constexpr branch (a second return after it is an error)."""
    if BF16:
        bits = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.int32) << 16
    else:
        bits = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.int32, bitcast=True)
    return bits


@triton.jit
def _block_rows(n_blocks, BLOCK_N: tl.constexpr):
    """This program's BLOCK_N blocks (int64 indices, a block a row of the kernel's view) and
    which of them exist."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, rows < n_blocks


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
    rows, rmask = _block_rows(n_blocks, BLOCK_N)
    offs = rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    bits = _load_bits(x_ptr, offs, rmask[:, None], BF16_BITS)  # bf16: no cast involved
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
        code = _e4m3_code(mag)
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


# ------------------------------------------------- MXFP8 and NVFP4 (quant.py's formats)
#
# One program quantizes a tile of ROWS rows x COLS columns of x (COLS a power of 2 dividing H,
# so a tile holds whole scale blocks of 32 or 16 elements): loaded as [ROWS, COLS / BLOCK, BLOCK]
# (NVFP4: BLOCK / 2 words of two elements) so that each thread reads 16 contiguous bytes and a
# block's amax is a reduction over the last axis; q and the scales are written through their row strides (contiguous tensors: the
# engines' separate q and scales; or the two views of packed rows, quant.wire_rows), a row's
# codes contiguous, so the stores are vectors too. A tile per program, not a block (BENCHMARKS.md,
# "MXFP8 and NVFP4 quantize"). Arithmetic as quant.quantize_mxfp8_torch / quantize_nvfp4_torch,
# bit-exact for finite x: the divisions by a power of two are multiplications by its exact
# inverse; the casts to e4m3 are the GPU's (HW_CVT) or integer arithmetic (the interpreter).


@triton.jit
def _to_e4m3(y, HW_CVT: tl.constexpr):
    """fp32 y (|y| <= 448) -> e4m3 code with its sign, uint8 (one return: see _load_bits)."""
    if HW_CVT:
        code = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        p = y.to(tl.uint32, bitcast=True)
        code = (_e4m3_code(tl.minimum(p & 0x7FFFFFFF, 0x7F800000)) | ((p >> 24) & 0x80)).to(tl.uint8)
    return code


@triton.jit
def _tile(x_ptr, t, h, ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr, BF16: tl.constexpr):
    """This program's tile: its rows [ROWS, 1, 1] (int64), the row mask, the column of each
    block's first element [1, COLS / BLOCK, 1] and of each element in its block [1, 1, BLOCK],
    and x's float32 bits [ROWS, COLS / BLOCK, BLOCK]."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None, None]
    block0 = tl.program_id(1) * COLS + tl.arange(0, COLS // BLOCK)[None, :, None] * BLOCK
    within = tl.arange(0, BLOCK)[None, None, :]
    rmask = rows < t
    return rows, rmask, block0, within, _load_bits(x_ptr, rows * h + block0 + within, rmask, BF16)


@triton.jit(do_not_specialize=["t"])  # no variant per token count; h and the strides: 16-byte vectors
def _quantize_mxfp8_kernel(
    # _launch_tiles' arguments, then this payload's
    x_ptr,
    q_ptr,
    s_ptr,
    t,
    h,
    q_stride,
    s_stride,
    TINY: tl.constexpr,
    BF16: tl.constexpr,
    HW_CVT: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    rows, rmask, block0, within, bits = _tile(x_ptr, t, h, ROWS, COLS, 32, BF16)
    amax = tl.max(bits & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)  # [ROWS, COLS / 32]
    r = tl.math.div_rn(
        tl.maximum(amax, TINY, propagate_nan=tl.PropagateNan.ALL), tl.full(amax.shape, 448.0, tl.float32)
    )
    rb = r.to(tl.int32, bitcast=True)
    field = rb >> 23
    mant = rb & 0x7FFFFF
    normal = tl.minimum(tl.maximum(field + (mant != 0).to(tl.int32), 0), 254)
    s = tl.where(field == 0, (mant > (1 << 22)).to(tl.int32), normal)  # ceil(log2(r)) + 127
    # x / 2^(s-127) is x * 2^(127-s), rounded alike (one rounding of the same real number);
    # 2^(127-s) is a normal float up to s = 253; s = 254 (an inf or NaN amax only) takes 2^-126 * 0.5
    inv = (tl.maximum(254 - s, 1) << 23).to(tl.float32, bitcast=True)
    half = tl.where(s == 254, 0.5, 1.0)
    y = (bits.to(tl.float32, bitcast=True) * inv[:, :, None]) * half[:, :, None]
    tl.store(q_ptr + rows * q_stride + block0 + within, _to_e4m3(y, HW_CVT), mask=rmask)
    tl.store(s_ptr + rows * s_stride + block0 // 32, s[:, :, None].to(tl.uint8), mask=rmask)


@triton.jit
def _e2m1_magnitude(a):
    """fp32 a >= 0 -> its e2m1 code without the sign, to nearest even (quant.e2m1_codes), a
    clamped to 6.

    The e2m1 grid is 0.5 apart below 2, then 1 apart to 4, then 2 apart: in binade E (E = 0
    below 2, else floor(log2 a)) it is spaced 2^(E - 1), which is the spacing of fp32 at
    M = 2^(E + 22). So a + M, rounded once by the fp32 adder, holds round(a / 2^(E - 1)) in its
    low bits: the code, less 2E (codes 0-4 below 2, then 2 more a binade). Four integer
    operations an element where bit rounding took nine: the integer unit bounded NVFP4
    (BENCHMARKS.md, "NVFP4 quantize at the integer unit's limit")."""
    u = tl.minimum(a.to(tl.uint32, bitcast=True), 0x40C00000)  # 6.0
    e = tl.maximum(u, 0x3F800000) & 0x7F800000  # 2^E: fp32 bits (127 + E) << 23
    m = e.to(tl.float32, bitcast=True) * 4194304.0  # M = 2^E * 2^22: bits e + (22 << 23)
    s = (u.to(tl.float32, bitcast=True) + m).to(tl.uint32, bitcast=True)
    return s - e + (e >> 22) - ((22 << 23) + 254)  # (s - bits(M)) + 2E, 2E = (e >> 22) - 254


@triton.jit(do_not_specialize=["t"])
def _quantize_nvfp4_kernel(
    # _launch_tiles' arguments, then this payload's
    x_ptr,
    q_ptr,
    s_ptr,
    t,
    h,
    q_stride,
    s_stride,
    g,
    inv_g,
    INV_FP4_MAX: tl.constexpr,
    BF16: tl.constexpr,
    HW_CVT: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    # x read as words of two elements, 2i and 2i + 1 (bf16: an int32; fp32: an int64): a block of
    # 16 is 8 words, and word i's two codes are byte i of q, so no element is moved between
    # threads (no split of a loaded tile: a layout change through shared memory)
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rows, rmask = row[:, None, None], (row < t)[:, None, None]
    word = tl.program_id(1) * (COLS // 2) + tl.arange(0, COLS // 16)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    w = tl.load(x_ptr + rows * (h // 2) + word, mask=rmask, other=0)
    if BF16:  # a bf16's bits are the upper half of its float32's
        lo, hi = w << 16, w & -65536
    else:
        lo, hi = w.to(tl.int32), (w >> 32).to(tl.int32)
    amax = tl.max(tl.maximum(lo & 0x7FFFFFFF, hi & 0x7FFFFFFF), axis=2)  # [ROWS, COLS / 16]
    sc = tl.minimum(g * (amax.to(tl.float32, bitcast=True) * INV_FP4_MAX), 448.0)
    scode = _to_e4m3(sc, HW_CVT).to(tl.int32)
    # the e4m3 scale back in fp32: normal codes rebias the exponent, subnormal ones are code x 2^-9
    sf = tl.where(
        scode >= 8,
        (((scode >> 3) + 120) << 23) | ((scode & 7) << 20),
        (scode.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True),
    ).to(tl.float32, bitcast=True)
    unit = sf * inv_g
    one = tl.full(unit.shape, 1.0, tl.float32)
    inv = tl.where(unit == 0.0, 0.0, tl.math.div_rn(one, tl.where(unit == 0.0, one, unit)))[:, :, None]
    # |x| * inv: the codes' magnitudes; their signs are x's (the scale is positive), bits 15 and
    # 31 of the word, moved to bits 3 and 7 of its byte
    lo = _e2m1_magnitude(tl.abs(lo.to(tl.float32, bitcast=True)) * inv)
    hi = _e2m1_magnitude(tl.abs(hi.to(tl.float32, bitcast=True)) * inv)
    if BF16:  # one multiply moves bits 15 and 31 to 3 and 7 (and 31 to 19 too: beyond the byte)
        sign = tl.umulhi(w.to(tl.uint32, bitcast=True) & 0x80008000, 0x100100)
    else:
        sign = (((w >> 28) & 0x8) | ((w >> 56) & 0x80)).to(tl.uint32)
    tl.store(q_ptr + rows * q_stride + word, (lo | (hi << 4) | sign).to(tl.uint8), mask=rmask)
    block = tl.program_id(1) * (COLS // 16) + tl.arange(0, COLS // 16)[None, :]
    tl.store(s_ptr + row[:, None] * s_stride + block, scode.to(tl.uint8), mask=(row < t)[:, None])


ELEMS_MAX = 4096  # elements a program: [4 rows, 1024] of bf16, 32 a thread (4 loads of 16 bytes)
ELEMS_MIN = 512


def _tile_shape(t: int, h: int, block: int, elems: int | None = None, programs: int = _MIN_PROGRAMS) -> tuple[int, int]:
    """(ROWS, COLS) of a program's tile: ELEMS_MAX elements, fewer where that leaves fewer than
    `programs` programs (small T: every SM busy); COLS the largest power of 2 dividing H (at
    most 1024, at least the block)."""
    cols = min(h & -h, 1024)
    if elems is None:
        elems = ELEMS_MAX
        while elems > ELEMS_MIN and triton.cdiv(t * h, elems) < programs:
            elems //= 2
    cols = max(block, min(cols, elems))
    rows = max(1, min(elems // cols, triton.next_power_of_2(t)))
    return rows, cols


def _launch_tiles(
    kernel,
    x,
    q,
    scales,
    block: int,
    elems: int | None,
    hw_cvt: bool | None,
    pairs: bool = False,
    programs: int = _MIN_PROGRAMS,
    **args,
) -> None:
    """Launch `kernel` over x's tiles (`_tile_shape`, down to `programs` programs); x as the
    bits of its elements, or of two elements a word (`pairs`: int32 for bf16, int64 for fp32)."""
    t, h = x.shape
    if t == 0:
        return
    if hw_cvt is None:
        hw_cvt = x.is_cuda and _has_fp8_conversion(x.device)
    rows, cols = _tile_shape(t, h, block, elems, programs)
    x = x.contiguous()
    bf16 = x.dtype == torch.bfloat16
    bits = (torch.int32 if bf16 else torch.int64) if pairs else (torch.int16 if bf16 else x.dtype)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        kernel[(triton.cdiv(t, rows), h // cols)](
            x.view(bits),
            q.view(torch.uint8),
            scales.view(torch.uint8),
            t,
            h,
            q.stride(0) * q.element_size(),
            scales.stride(0) * scales.element_size(),
            **args,
            BF16=bf16,
            HW_CVT=hw_cvt,
            ROWS=rows,
            COLS=cols,
            num_warps=max(1, min(4, rows * cols // 256)),
        )


def quantize_mxfp8(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, elems=None, hw_cvt=None) -> None:
    """quant.quantize_mxfp8_torch into q [T, H] e4m3 and scales [T, H/32] uint8 (rows may be
    strided; bf16 or fp32 x, H % 32 == 0). Layout: vLLM 0.33 mxfp8_e4m3_quantize, linear scales
    (``model_executor/layers/quantization/utils/mxfp8_utils.py``). `elems`: elements a program
    (tests: the interpreter pays per program), a power of 2."""
    _launch_tiles(_quantize_mxfp8_kernel, x, q, scales, 32, elems, hw_cvt, TINY=torch.finfo(torch.float32).tiny)


def quantize_nvfp4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, elems=None, hw_cvt=None) -> None:
    """quant.quantize_nvfp4_torch into q [T, H/2] uint8 (element 2i in the low nibble) and scales
    [T, H/16] e4m3 (rows may be strided; H % 16 == 0). Layout: vLLM 0.33 scaled_fp4_quant with
    is_sf_swizzled_layout=False, as its all2all prepares call it (``model_executor/layers/
    fused_moe/prepare_finalize/naive_dp_ep.py``; arithmetic: ``nvfp4_emulation_utils.ref_nvfp4_quant``)."""
    g = torch.tensor(NVFP4_GLOBAL_SCALE, dtype=torch.float32)
    inv_fp4 = float(torch.tensor(1.0 / FP4_E2M1_MAX, dtype=torch.float32))
    _launch_tiles(
        _quantize_nvfp4_kernel,
        x,
        q,
        scales,
        16,
        elems,
        hw_cvt,
        pairs=True,
        programs=256,  # 2048-element tiles beat 1024 at T = 128 on an H100 (BENCHMARKS.md)
        g=float(g),
        inv_g=float(1.0 / g),
        INV_FP4_MAX=inv_fp4,
    )


#: payload -> its kernel (quant.quantize_into).
QUANTIZE = {"mxfp8": quantize_mxfp8, "nvfp4": quantize_nvfp4}
