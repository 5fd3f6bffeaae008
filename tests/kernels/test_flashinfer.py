"""FlashInfer's backends where FlashInfer is absent, too old or cannot run: reported, never raised.

The kernels themselves run only on GPUs (tests/test_backends_gpu.py, with FlashInfer staged by
scripts/stage_flashinfer.py); here: the availability reasons, the shape limits, the names.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from a2a_tune.kernels import BackendEnv, MoEShape, _flashinfer, get_backend, list_backends

FLASHINFER = ["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"]
H200 = BackendEnv(
    world_size=2, device_type="cuda", dist_backend="nccl", gpu_name="H200", compute_capability=(9, 0), peer_access=True
)


def _fake_flashinfer(tmp_path, version: str):
    pkg = tmp_path / "flashinfer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('importing flashinfer is not allowed in this test')\n")
    (pkg / "_build_meta.py").write_text(f'__version__ = "{version}"\n')
    return tmp_path


@pytest.fixture
def no_metadata(monkeypatch):
    """Hide any installed distribution so only the package on sys.path counts."""
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_flashinfer.importlib.metadata, "version", missing)


@pytest.mark.parametrize("name", FLASHINFER)
def test_registered_after_the_nccl_baselines_with_the_vllm_literals(name):
    names = list_backends()
    assert names.index(name) > names.index("nccl_all2allv")
    assert get_backend(name).engine_names["vllm"] == name


def test_without_flashinfer_the_reason_says_how_to_install(monkeypatch, no_metadata):
    monkeypatch.setattr(_flashinfer.importlib.util, "find_spec", lambda name: None)
    for name in FLASHINFER:
        ok, reason = get_backend(name).availability(H200)
        assert not ok and reason == "flashinfer not installed (pip install 'a2a-tune[flashinfer]')"


def test_too_old_flashinfer_is_named_with_its_version(tmp_path, monkeypatch, no_metadata):
    monkeypatch.syspath_prepend(str(_fake_flashinfer(tmp_path, "0.6.3")))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    ok, reason = get_backend("flashinfer_nvlink_one_sided").availability(H200)
    assert not ok
    assert reason == "flashinfer 0.6.3 is too old (needs >= 0.6.16 for single-node NVLink)"
    assert "flashinfer" not in sys.modules  # found without importing it


def test_version_is_read_without_import_from_a_staged_copy(tmp_path, monkeypatch, no_metadata):
    monkeypatch.syspath_prepend(str(_fake_flashinfer(tmp_path, "0.7.2.post1")))
    assert _flashinfer.flashinfer_version() == "0.7.2.post1"
    assert "flashinfer" not in sys.modules


@pytest.mark.parametrize(
    "env, reason",
    [
        (BackendEnv(2, "cpu", "gloo"), "needs CUDA GPUs (FlashInfer's NVLink kernels); none visible here"),
        (
            BackendEnv(2, "cpu", "gloo", gpus=1),
            "needs CUDA ranks (FlashInfer's NVLink kernels); these ranks run on the CPU",
        ),
        (
            BackendEnv(2, "cuda", "nccl", "A100", (8, 0), True),
            "FlashInfer's NVLink all2all needs compute capability >= 9.0, found 8.0",
        ),
        (
            BackendEnv(2, "cuda", "nccl", "H200", (9, 0), False),
            "needs peer access between every pair of GPUs (one NVLink island)",
        ),
    ],
)
def test_unsupported_machines_get_one_line_reasons(tmp_path, monkeypatch, no_metadata, env, reason):
    monkeypatch.syspath_prepend(str(_fake_flashinfer(tmp_path, "0.7.2")))
    assert get_backend("flashinfer_nvlink_one_sided").availability(env) == (False, reason)


def test_cuda_python_is_required(tmp_path, monkeypatch, no_metadata):
    monkeypatch.syspath_prepend(str(_fake_flashinfer(tmp_path, "0.7.2")))
    real = _flashinfer.importlib.util.find_spec
    monkeypatch.setattr(_flashinfer.importlib.util, "find_spec", lambda n: None if n == "cuda" else real(n))
    ok, reason = get_backend("flashinfer_nvlink_two_sided").availability(H200)
    assert not ok and "cuda-python not installed" in reason


@pytest.mark.parametrize(
    "shape, ok, why",
    [
        (MoEShape(256, 8, 7168, 64, "bf16"), True, ""),
        (MoEShape(256, 8, 7168, 64, "fp8_e4m3"), True, ""),  # 56 fp32 scales = 224 bytes
        (MoEShape(10, 2, 7168, 64, "bf16"), False, "experts % 4 == 0, got 10"),
        (MoEShape(128, 4, 2880, 64, "fp8_e4m3"), False, "rows of [2880, 92] bytes"),  # 23 scales: 92 bytes
        (MoEShape(8, 2, 36, 64, "bf16"), False, "rows of [72] bytes"),
    ],
)
def test_two_sided_shape_limits_are_infeasible_not_failures(shape, ok, why):
    verdict = get_backend("flashinfer_nvlink_two_sided").feasibility(shape, 2)
    assert verdict.ok is ok and why in verdict.reason


def test_importing_a2a_tune_never_imports_flashinfer():
    code = "import a2a_tune.kernels, a2a_tune.tuner.runtime.lookup, sys; print('flashinfer' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_block_size_knobs_follow_flashinfers_sanitising(monkeypatch):
    from a2a_tune.kernels.flashinfer_nvlink_one_sided import block_size_knobs

    assert block_size_knobs() == {"dispatch_block_size": 256, "combine_block_size": 256}
    monkeypatch.setenv("TLLM_MOE_A2A_DISPATCH_BLOCK_SIZE", "100")
    monkeypatch.setenv("TLLM_MOE_A2A_COMBINE_BLOCK_SIZE", "5000")
    assert block_size_knobs() == {"dispatch_block_size": 128, "combine_block_size": 1024}
    monkeypatch.setenv("TLLM_MOE_A2A_DISPATCH_BLOCK_SIZE", "junk")
    assert block_size_knobs()["dispatch_block_size"] == 256
