import pytest
import torch

from a2a_tune.kernels import BackendEnv, MoEShape, get_backend
from a2a_tune.kernels.quant import FP8_BLOCK, dequantize_fp8_blocks, quantize_fp8_blocks, scale_blocks


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


@pytest.mark.parametrize("name", ["allgather_reducescatter", "nccl_all2allv"])
def test_nccl_backends_say_fp8_is_not_implemented(name):
    ok, reason = get_backend(name).feasibility(MoEShape(8, 2, 128, 4, "fp8_e4m3"), 2)
    assert not ok and reason == "fp8_e4m3 payloads not implemented for this backend"
    assert get_backend(name).feasibility(MoEShape(8, 2, 128, 4, "bf16"), 2).ok


@pytest.mark.parametrize("name", ["nvlink_one_sided", "nvlink_low_latency"])
def test_nvlink_backends_take_fp8_and_explain_why_not_on_cpu(name):
    cls = get_backend(name)
    assert cls.feasibility(MoEShape(8, 2, 128, 4, "fp8_e4m3"), 2).ok
    ok, reason = cls.availability(BackendEnv(world_size=2, device_type="cpu", dist_backend="gloo"))
    assert not ok and "needs CUDA GPUs" in reason


def test_low_latency_capacity_limit_is_a_feasibility_answer():
    ok, reason = get_backend("nvlink_low_latency").feasibility(MoEShape(256, 8, 7168, 4096), 2)
    assert not ok and "at most 1024 tokens per rank" in reason
