"""Run the block-FP8 Triton kernel under Triton's interpreter, compare it with the torch path.

Usage (a subprocess: TRITON_INTERPRET must be set before triton is imported):
    TRITON_INTERPRET=1 python emulate_quant.py '<json list of cases>'
prints a JSON list of {id, q_mismatches, scale_mismatches, shapes_ok}. Each case: tokens,
hidden, dtype ("bf16" | "fp32"), block_n (block-FP8: blocks per program) or elems (MXFP8,
NVFP4: elements per program; the interpreter is slow per program), and "values": "mixed" (random magnitudes with zero, huge, tiny and negative rows) or
"all_bf16" (every bf16 bit pattern, inf and NaN included, in blocks of 128 as they come and
beside amaxes of 1, 3, 2^-100 and 2^100). A case {"id", "e2m1": true} runs the NVFP4 kernel's
e2m1 rounding alone on `e2m1_probes()`. The GPU tests import `inputs` and `mismatches`.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import triton
import triton.language as tl

from a2a_tune.kernels._quant_kernels import _e2m1_magnitude

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def every_bf16_value() -> torch.Tensor:
    """[2560, 128] bf16: all 2^16 bit patterns five times, the last four times with the first
    element of each block set to an amax, so that small values meet a larger scale."""
    v = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(-1, 128)
    blocks = [v.clone()]
    for amax in (1.0, 3.0, 2.0**-100, 2.0**100):
        b = v.clone()
        b[:, 0] = amax
        blocks.append(b)
    return torch.cat(blocks)


def inputs(case: dict) -> torch.Tensor:
    if case["values"] == "all_bf16":
        return every_bf16_value()
    t, h = case["tokens"], case["hidden"]
    g = torch.Generator().manual_seed(t * 7919 + h)
    # rows spanning 16 decades, and within each block values far below its amax: those land
    # on e4m3's subnormal grid, or round to zero
    x = torch.randn(t, h, generator=g) * torch.logspace(-8, 8, t)[:, None]
    x *= torch.logspace(-6, 0, 128).repeat(-(-h // 128))[:h][torch.randperm(h, generator=g)]
    x[0, :128] = 0.0  # an all-zero block: the scale clamps at 1e-12/448
    x[0, 128:256] = -0.0
    if t > 1:
        x[1] = -x[1].abs()  # all negative
    if t > 2:
        x[2, ::3] = 3.0e38  # near the top of bf16's (and fp32's) range
        x[2, 1::3] = -1.0e-30
    return x.to(DTYPES[case["dtype"]])


def mismatches(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> tuple[int, int]:
    """(q elements, scales) that differ; a NaN equals a NaN, whatever their signs (inf * 0 is
    -NaN on x86 CPUs and +NaN on GPUs, in torch as in the kernel)."""
    (q, s), (q_ref, s_ref) = got, want
    a, b = q.view(torch.uint8), q_ref.view(torch.uint8)
    both_nan = ((a & 0x7F) == 0x7F) & ((b & 0x7F) == 0x7F)
    return int(((a != b) & ~both_nan).sum()), int((~((s == s_ref) | (s.isnan() & s_ref.isnan()))).sum())


def run_packed_case(case: dict) -> dict:
    """An MXFP8 or NVFP4 case: the kernel into separate tensors (the engines' layout) and into
    packed rows (quant.wire_rows), both against the torch path."""
    from a2a_tune.kernels import _quant_kernels, quant

    x, payload = inputs(case), case["payload"]
    want = quant.QUANTIZE_TORCH[payload](x)
    separate = quant.empty_wire(payload, *x.shape, "cpu")
    _quant_kernels.QUANTIZE[payload](x, *separate, elems=case.get("elems"))
    rows = torch.full((x.shape[0], quant.PAYLOADS[payload].row_bytes(x.shape[1])), 0xAB, dtype=torch.uint8)
    packed = quant.wire_rows(payload, rows, x.shape[1])
    _quant_kernels.QUANTIZE[payload](x, *packed, elems=case.get("elems"))
    as_bytes = [(q.view(torch.uint8), s.view(torch.uint8)) for q, s in (separate, packed)]
    bad = [mismatches(got, (want[0].view(torch.uint8), want[1].view(torch.uint8))) for got in as_bytes]
    return {
        "id": case["id"],
        "q_mismatches": bad[0][0] + bad[1][0],
        "scale_mismatches": bad[0][1] + bad[1][1],
        "shapes_ok": all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(separate, want)),
    }


@triton.jit
def _e2m1_probe(a_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, _e2m1_magnitude(tl.load(a_ptr + i, mask=i < n)).to(tl.int32), mask=i < n)


def e2m1_probes() -> torch.Tensor:
    """fp32 magnitudes where e2m1 rounding can go wrong: each threshold between two codes (a tie)
    and its 4 neighbours either side, every multiple of 2^-12 up to 8, every bf16 value from
    2^-10 to 2^10, and 0, the smallest values, inf and NaN."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    bits = ties.view(torch.int32)[:, None] + torch.arange(-4, 5, dtype=torch.int32)
    bf16 = torch.arange(0x3A80, 0x4481, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    edges = torch.tensor([0.0, 1e-45, 1e-38, 7.0, 8.0, 1e30, 3.4e38, float("inf"), float("nan")])
    return torch.cat([bits.view(torch.float32).flatten(), torch.arange(0, 8 * 4096 + 1) / 4096.0, bf16, edges])


def run_e2m1_case(case: dict) -> dict:
    """_quantize_nvfp4_kernel's e2m1 rounding (`_e2m1_magnitude`) against quant.e2m1_codes on
    `e2m1_probes()`, the clamp to 6 included (NaN: the largest code, as the kernel's clamp gives)."""
    from a2a_tune.kernels.quant import e2m1_codes

    a = e2m1_probes()
    got = torch.empty(a.shape, dtype=torch.int32)
    _e2m1_probe[(triton.cdiv(a.numel(), 4096),)](a, got, a.numel(), BLOCK=4096)
    want = e2m1_codes(a.nan_to_num(6.0).clamp(max=6.0))
    return {"id": case["id"], "q_mismatches": int((got != want).sum()), "scale_mismatches": 0, "shapes_ok": True}


def run_case(case: dict) -> dict:
    from a2a_tune.kernels import _quant_kernels
    from a2a_tune.kernels.quant import quantize_fp8_blocks_torch

    if case.get("e2m1"):
        return run_e2m1_case(case)
    if case.get("payload"):
        return run_packed_case(case)
    x = inputs(case)
    q, s = _quant_kernels.quantize_fp8_blocks(x, block_n=case.get("block_n"))
    q_ref, s_ref = quantize_fp8_blocks_torch(x)
    dq, ds = mismatches((q, s), (q_ref, s_ref))
    return {
        "id": case["id"],
        "q_mismatches": dq,
        "scale_mismatches": ds,
        "shapes_ok": q.shape == q_ref.shape and s.shape == s_ref.shape and q.dtype == q_ref.dtype,
    }


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)  # inf * 0, as in torch
    print(json.dumps([run_case(c) for c in json.loads(sys.argv[1])]))
