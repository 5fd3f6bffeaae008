import json
import os
import subprocess
import sys

import paths
import pytest
import torch

from a2a_tune.kernels import BackendEnv, MoEShape, get_backend
from a2a_tune.kernels.quant import (
    FP8_BLOCK,
    dequantize_fp8_blocks,
    quantize_fp8_blocks,
    quantize_fp8_blocks_torch,
    scale_blocks,
)

EMULATOR = paths.SUPPORT / "emulate_quant.py"


@pytest.mark.parametrize("hidden", [128, 7168, 136, 1])
def test_block_fp8_round_trip_is_within_e4m3_precision(hidden):
    x = (torch.randn(16, hidden, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    q, s = quantize_fp8_blocks(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (16, scale_blocks(hidden))
    back = dequantize_fp8_blocks(q, s)
    rel = ((back - x.float()).norm(dim=1) / x.float().norm(dim=1)).max()
    assert rel < 0.06  # e4m3 keeps 3 significand bits


def test_each_block_gets_its_own_scale():
    x = torch.ones(1, 2 * FP8_BLOCK, dtype=torch.bfloat16)
    x[0, FP8_BLOCK:] = 100.0
    _, s = quantize_fp8_blocks(x)
    assert s[0, 1] / s[0, 0] == pytest.approx(100.0)


@pytest.mark.parametrize("name", ["allgather_reducescatter", "nccl_all2allv", "nvlink_one_sided"])
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "mxfp8", "nvfp4", "bf16"])
def test_ours_and_the_nccl_baselines_carry_every_payload(name, dtype):
    assert dtype in get_backend(name).payloads
    assert get_backend(name).feasibility(MoEShape(8, 2, 128, 4, dtype), 2).ok


@pytest.mark.parametrize("name", ["deepep_low_latency", "deepep_high_throughput"])
@pytest.mark.parametrize("dtype", ["mxfp8", "nvfp4"])
def test_deepep_does_not_carry_mxfp8_or_nvfp4(name, dtype):
    """DeepEP's kernels take FP8 with 128-wide blocks only: never built, never timed with these."""
    ok, reason = get_backend(name).feasibility(MoEShape(8, 2, 7168, 4, dtype), 2)
    assert not ok and reason == f"does not carry {dtype}"


PINNED_ROW_BYTES = [("nvfp4", 4096, 2048 + 256), ("nvfp4", 7168, 3584 + 448), ("mxfp8", 7168, 7168 + 224)]


@pytest.mark.parametrize("dtype, hidden, row", PINNED_ROW_BYTES)
def test_quantized_rows_are_the_packed_values_and_their_scales(dtype, hidden, row):
    """NVFP4: H/2 + H/16 bytes a row; MXFP8: H + H/32; what the kernels write is that long."""
    from a2a_tune.kernels.base import PAYLOADS
    from a2a_tune.kernels.quant import quantize, quantize_rows

    assert PAYLOADS[dtype].row_bytes(hidden) == row
    x = torch.randn(3, hidden).to(torch.bfloat16)
    assert quantize_rows(dtype, x).shape == (3, row)
    q, s = quantize(dtype, x)
    assert q.numel() * q.element_size() + s.numel() * s.element_size() == 3 * row


@pytest.mark.parametrize("dtype, hidden", [("mxfp8", 7168), ("nvfp4", 4096), ("nvfp4", 2880), ("fp8_e4m3", 136)])
def test_dequantized_rows_are_within_the_tolerance_the_format_gives(dtype, hidden):
    from a2a_tune.kernels.quant import dequantize, quantize
    from a2a_tune.kernels.reference import TOLERANCE

    x = torch.randn(64, hidden, generator=torch.Generator().manual_seed(hidden)).to(torch.bfloat16)
    back = dequantize(dtype, *quantize(dtype, x))
    rel = float(((back - x.float()).norm(dim=1) / x.float().norm(dim=1)).max())
    assert 0 < rel < TOLERANCE[dtype]
    assert rel > TOLERANCE["bf16"] / 10  # quantized: worse than bf16, so the test sees the format


def test_nvfp4_packs_element_2i_in_the_low_nibble_with_e4m3_block_scales():
    from a2a_tune.kernels.quant import NVFP4_GLOBAL_SCALE, quantize

    unit = 2.0 / NVFP4_GLOBAL_SCALE * 448 / 448  # one e2m1 unit of a block whose amax is 6 units
    x = torch.zeros(1, 32)
    x[0, :16] = torch.tensor([6, 0.5, -1, 3] + [0] * 12) * unit
    x[0, 16:] = torch.tensor([0, -6] + [0] * 14) * unit
    q, s = quantize("nvfp4", x)
    assert q.dtype == torch.uint8 and q.shape == (1, 16) and s.dtype == torch.float8_e4m3fn and s.shape == (1, 2)
    # codes: 6 -> 7, 0.5 -> 1, -1 -> 8|2, 3 -> 5; -6 -> 8|7
    assert q[0, :2].tolist() == [0x17, 0x5A] and q[0, 8].tolist() == 0xF0
    assert s.float().tolist() == [[2.0, 2.0]]  # g * amax / 6 = 2


def test_mxfp8_scales_are_the_e8m0_exponent_of_amax_over_448():
    from a2a_tune.kernels.quant import dequantize, quantize

    x = torch.zeros(2, 64)
    x[0, 0], x[0, 32], x[1, 5] = 448.0, 449.0, 1.0  # 2^0 exactly; just above: 2^1; 1/448 -> 2^-8
    q, s = quantize("mxfp8", x)
    assert s.dtype == torch.uint8 and s.tolist() == [[127, 128], [119, 0]]  # an all-zero block: 0
    assert torch.equal(dequantize("mxfp8", q, s), x.clamp(max=448.0).where(x != 449.0, 448.0))


@pytest.mark.parametrize("dtype", ["nvfp4", "mxfp8"])
def test_hidden_not_divisible_by_the_block_is_one_line(dtype):
    from a2a_tune.kernels.errors import ShapeError

    with pytest.raises(ShapeError, match=f"--dtype {dtype} needs hidden divisible by its"):
        MoEShape(8, 2, 100, 4, dtype).validate(2)


@pytest.mark.parametrize("name", ["nvlink_one_sided", "nvlink_low_latency"])
def test_nvlink_backends_take_fp8_and_explain_why_not_on_cpu(name):
    cls = get_backend(name)
    assert cls.feasibility(MoEShape(8, 2, 128, 4, "fp8_e4m3"), 2).ok
    ok, reason = cls.availability(BackendEnv(world_size=2, device_type="cpu", dist_backend="gloo"))
    assert not ok and "needs CUDA GPUs" in reason


def test_low_latency_capacity_limit_is_a_feasibility_answer():
    ok, reason = get_backend("nvlink_low_latency").feasibility(MoEShape(256, 8, 7168, 4096), 2)
    assert not ok and "at most 1024 tokens per rank" in reason


# ------------------------------------------------------------ the Triton kernel (CUDA path)

# block_n: blocks per program (None: the GPU's choice, here 1); the interpreter pays per
# program. T*S not a multiple of block_n leaves a masked tail (T=7 and T=130 here).
KERNEL_CASES = [
    {"id": f"{d}-T{t}-H{h}", "tokens": t, "hidden": h, "dtype": d, "values": "mixed", "block_n": bn}
    for d in ("bf16", "fp32")
    for t in (1, 7, 130)
    for h, bn in ((128, None if t < 130 else 16), (4096, 64), (7168, 256))
    if d == "bf16" or t != 130
] + [{"id": "every-bf16-value", "tokens": 2560, "hidden": 128, "dtype": "bf16", "values": "all_bf16", "block_n": 256}]
# MXFP8 and NVFP4 (quant.py's formats): into the engines' separate tensors and into packed rows;
# elems: elements per program (None: the GPU's choice), tiles of 1 row x 64 columns up to 2 rows
# with a masked tail (T=3) and H = 2880 (its tiles are 64 columns wide)
KERNEL_CASES += [
    {"id": f"{p}-{d}-T{t}-H{h}", "payload": p, "tokens": t, "hidden": h, "dtype": d, "values": "mixed", "elems": e}
    for p in ("mxfp8", "nvfp4")
    for d, t, h, e in (("bf16", 7, 128, 64), ("bf16", 5, 4096, 1024), ("fp32", 3, 256, 512), ("bf16", 3, 2880, None))
]


KERNEL_CASES += [{"id": "nvfp4-e2m1-rounding", "e2m1": True}]  # every tie of the e2m1 grid, and its neighbours


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, str(EMULATOR), json.dumps(KERNEL_CASES)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["id"]: r for r in json.loads(out.stdout)}


@pytest.mark.parametrize("case", [c["id"] for c in KERNEL_CASES])
def test_triton_kernel_is_bit_exact_with_the_torch_path(interpreted, case):
    r = interpreted[case]
    assert r["shapes_ok"] and r["q_mismatches"] == 0 and r["scale_mismatches"] == 0, r


def test_scales_do_not_depend_on_the_device():
    """amax * fp32(1/448), as torch computes it on CUDA: a true division would differ here."""
    x = torch.full((1, FP8_BLOCK), 3.0, dtype=torch.bfloat16)
    _, s = quantize_fp8_blocks_torch(x)
    inv = torch.tensor(1.0) / torch.tensor(448.0)
    assert s.item() == (torch.tensor(3.0) * inv).item() != (torch.tensor(3.0) / 448.0).item()


def test_cpu_tensors_take_the_torch_path(monkeypatch):
    from a2a_tune.kernels import quant

    monkeypatch.setattr(quant, "_kernels", lambda: pytest.fail("the Triton kernel is for CUDA tensors"))
    x = torch.randn(3, 2 * FP8_BLOCK).to(torch.bfloat16)
    (q, s), (q0, s0) = quantize_fp8_blocks(x), quantize_fp8_blocks_torch(x)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)


def test_the_kernel_takes_bf16_and_fp32_rows_of_whole_blocks():
    pytest.importorskip("triton")
    from a2a_tune.kernels._quant_kernels import supports

    assert supports(torch.empty(2, 7168, dtype=torch.bfloat16)) and supports(torch.empty(0, 128))
    assert not supports(torch.empty(2, 136, dtype=torch.bfloat16))  # padded blocks: the torch path
    assert not supports(torch.empty(2, 128, dtype=torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("hw_cvt", [True, False], ids=["gpu-casts", "integer-rounding"])
def test_cuda_kernel_is_bit_exact_on_every_bf16_value(hw_cvt):
    from emulate_quant import every_bf16_value, mismatches

    from a2a_tune.kernels import _quant_kernels

    if hw_cvt and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no fp8 conversion before sm_89")
    x = every_bf16_value().cuda()
    got = _quant_kernels.quantize_fp8_blocks(x, hw_cvt=hw_cvt)
    assert mismatches(got, quantize_fp8_blocks_torch(x)) == (0, 0)
    # the CPU reference agrees
    assert mismatches((got[0].cpu(), got[1].cpu()), quantize_fp8_blocks_torch(x.cpu())) == (0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hidden", [(1, 7168), (7, 128), (130, 4096), (4096, 7168), (16384, 8192)])
def test_cuda_kernel_matches_the_torch_path_in_one_launch(tokens, hidden):
    from emulate_quant import mismatches

    g = torch.Generator(device="cuda").manual_seed(tokens + hidden)
    magnitudes = 10 ** torch.randn(tokens, 1, device="cuda", generator=g)  # a few decades apart
    x = (torch.randn(tokens, hidden, device="cuda", generator=g) * magnitudes).to(torch.bfloat16)
    x[0, :FP8_BLOCK] = 0.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = quantize_fp8_blocks(x)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "quantize_fp8" in kernels[0], kernels
    assert mismatches(got, quantize_fp8_blocks_torch(x)) == (0, 0)


@pytest.mark.gpu
def test_cuda_kernel_is_capturable_in_a_cuda_graph():
    from emulate_quant import mismatches

    x = torch.randn(64, 7168, device="cuda").to(torch.bfloat16)
    quantize_fp8_blocks(x)  # compiles the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = quantize_fp8_blocks(x)
    for seed in range(3):  # replays read the current x
        x.copy_(torch.randn(64, 7168, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)) * 5)
        graph.replay()
        torch.cuda.synchronize()
        assert mismatches((q, s), quantize_fp8_blocks_torch(x)) == (0, 0)


def test_a_failing_triton_kernel_falls_back_to_the_torch_path_once(monkeypatch, caplog):
    from types import SimpleNamespace

    from a2a_tune.kernels import quant

    calls = []

    def broken(x):
        calls.append(x.shape)
        raise RuntimeError("ptxas fatal: unsupported arch\nmore")

    fake = SimpleNamespace(supports=lambda x: True, quantize_fp8_blocks=broken)
    monkeypatch.setattr(quant, "_kernels", lambda: fake)
    monkeypatch.setattr(quant, "_TRITON_FAILED", set())
    x = torch.randn(2, FP8_BLOCK).to(torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # pretend: a CUDA tensor
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    q1, s1 = quant.quantize_fp8_blocks(x)
    q2, _ = quant.quantize_fp8_blocks(x)
    q0, s0 = quant.quantize_fp8_blocks_torch(x)
    assert len(calls) == 1  # tried once on that device, then the torch path without retrying
    assert torch.equal(q1.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s1, s0)
    assert torch.equal(q2.view(torch.uint8), q0.view(torch.uint8))
    (record,) = [r for r in caplog.records if "Triton FP8 quantizer failed" in r.getMessage()]
    assert "RuntimeError: ptxas fatal: unsupported arch" in record.getMessage() and "more" not in record.getMessage()


@pytest.mark.gpu
@pytest.mark.parametrize("payload", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("hw_cvt", [True, False], ids=["gpu-casts", "integer-rounding"])
def test_cuda_mxfp8_and_nvfp4_kernels_are_bit_exact_with_the_torch_path(payload, hw_cvt):
    """Every bf16 value (blocks beside amaxes of 1, 3, 2^-100, 2^100) and random rows, into the
    engines' separate tensors and into packed rows; the CPU reference agrees with the GPU's."""
    from emulate_quant import every_bf16_value

    from a2a_tune.kernels import _quant_kernels, quant

    if hw_cvt and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no fp8 conversion before sm_89")
    g = torch.Generator(device="cuda").manual_seed(7)
    randn = (torch.randn(4096, 7168, device="cuda", generator=g) * 10 ** torch.randn(4096, 1, device="cuda")).bfloat16()
    for x in (every_bf16_value().cuda().nan_to_num(0.0, 1e30, -1e30).bfloat16(), randn):
        want = [w.view(torch.uint8) for w in quant.QUANTIZE_TORCH[payload](x)]
        q, s = quant.empty_wire(payload, *x.shape, x.device)
        _quant_kernels.QUANTIZE[payload](x, q, s, hw_cvt=hw_cvt)
        assert torch.equal(q.view(torch.uint8), want[0]) and torch.equal(s.view(torch.uint8), want[1])
        rows = quant.quantize_rows(payload, x)
        q2, s2 = quant.wire_rows(payload, rows, x.shape[1])
        assert torch.equal(q2.view(torch.uint8), want[0]) and torch.equal(s2.view(torch.uint8), want[1])
        cpu = [w.view(torch.uint8) for w in quant.QUANTIZE_TORCH[payload](x.cpu())]
        assert torch.equal(cpu[0], want[0].cpu()) and torch.equal(cpu[1], want[1].cpu())


@pytest.mark.parametrize("payload", ["mxfp8", "nvfp4"])
def test_the_mxfp8_and_nvfp4_kernels_compile_for_hopper_without_a_gpu(payload):
    """The interpreter runs what the compiler refuses (an early return from a constexpr branch,
    then a second return): compile each kernel to a cubin for sm_90 here, as a GPU would, with
    the 16-byte alignment Triton sees at launch (H and the row strides of 16-byte multiples).
    What made the first kernels slow stays out: x is read in 16-byte vectors (not 2-byte
    loads), the codes are stored in vectors (not a byte a store), no 64-bit division."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from a2a_tune.kernels import _quant_kernels as k

    fn = {"mxfp8": k._quantize_mxfp8_kernel, "nvfp4": k._quantize_nvfp4_kernel}[payload]
    x_bits = "*i32" if payload == "nvfp4" else "*i16"  # NVFP4 reads x two elements a word
    sig = {"x_ptr": x_bits, "q_ptr": "*u8", "s_ptr": "*u8"} | dict.fromkeys(("t", "h", "q_stride", "s_stride"), "i32")
    sig |= {"g": "fp32", "inv_g": "fp32"} if payload == "nvfp4" else {}
    consts = {"TINY": torch.finfo(torch.float32).tiny} if payload == "mxfp8" else {"INV_FP4_MAX": 1 / 6}
    consts |= {"BF16": True, "HW_CVT": True, "ROWS": 4, "COLS": 1024}
    sig |= dict.fromkeys(consts, "constexpr")
    aligned = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("x_ptr", "q_ptr", "s_ptr", "h")}
    aligned |= {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("q_stride", "s_stride")}
    constexprs = {(fn.arg_names.index(n),): v for n, v in consts.items()}
    source = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=aligned)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except RuntimeError as exc:  # no NVIDIA backend tools in this Triton build
        if "ptxas" in str(exc):
            pytest.skip(f"no ptxas here: {exc}")
        raise
    assert "cubin" in compiled.asm and b"quantize" in compiled.asm["cubin"]
    ptx = compiled.asm["ptx"]
    assert "ld.global.v4" in ptx and "ld.global.b16" not in ptx
    assert ("st.global.v4" if payload == "mxfp8" else "st.global.v2") in ptx
    assert "div.s64" not in ptx and "rem.s64" not in ptx
