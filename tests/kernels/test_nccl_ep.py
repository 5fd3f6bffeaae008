"""NCCL EP's and DeepEP V2's backends where they cannot run: one line for each way, found without
importing either library; and the staging script's pruning of NCCL's device code.

Their kernels run on GPUs only (scripts/nccl_ep_one_gpu.sh at one rank; scripts/device_run.sh
MODE=x2 at two); the GPU-free facts are tested here against planted installs in tmp_path.
"""

from __future__ import annotations

import importlib.util
import shutil
import struct
import sys

import paths
import pytest

from a2a_tune.kernels import BackendEnv, get_backend

NCCL_EP = ["nccl_ep_low_latency", "nccl_ep_high_throughput"]
DEEPEP_V2 = ["deepep_v2_low_latency", "deepep_v2_high_throughput"]


def h100(world: int = 2, **kw) -> BackendEnv:
    fields = dict(world_size=world, device_type="cuda", dist_backend="nccl", compute_capability=(9, 0), gpus=world)
    return BackendEnv(**{**fields, "peer_access": True, **kw})


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """A planted install: nccl.ep and deep_ep V2 packages, a libnccl saying 2.32.6, an nvcc."""
    site = tmp_path / "site"
    (site / "nccl" / "ep").mkdir(parents=True)
    (site / "nccl" / "ep" / "__init__.py").write_text("raise ImportError('planted: never imported')\n")
    pkg = site / "deep_ep"
    (pkg / "buffers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('planted: never imported')\n")
    (pkg / "buffers" / "elastic.py").write_text("class ElasticBuffer: ...\n")
    (pkg / "_C.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\0")
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(b"\0" * 64 + b"NCCL version 2.32.6+cuda13.5\0")
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("LD_PRELOAD", str(lib))
    monkeypatch.setenv("PATH", str(nvcc.parent))
    monkeypatch.delenv("NCCL_EP_JIT_NVCC", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    for name in [m for m in sys.modules if m == "nccl" or m.startswith(("nccl.", "deep_ep"))]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    return tmp_path


@pytest.mark.parametrize("name", NCCL_EP + DEEPEP_V2)
def test_staged_and_preloaded_they_are_available_on_two_hopper_ranks_without_importing(staged, name):
    assert get_backend(name).availability(h100()) == (True, "")
    assert "nccl" not in sys.modules and "deep_ep" not in sys.modules


@pytest.mark.parametrize(
    ("name", "env", "change", "reason"),
    [
        ("nccl_ep_low_latency", dict(device_type="cpu", gpus=0), None, "needs CUDA GPUs (NCCL EP); none visible"),
        ("deepep_v2_low_latency", dict(device_type="cpu", gpus=2), None, "needs CUDA ranks (DeepEP V2)"),
        ("nccl_ep_high_throughput", {}, "no-nccl-ep", "nccl.ep not installed (nccl-extensions"),
        ("deepep_v2_high_throughput", {}, "no-deep-ep", "deep_ep not installed (DeepEP V2"),
        ("deepep_v2_low_latency", {}, "deep-ep-v1", "predates V2 (no ElasticBuffer)"),
        ("deepep_v2_low_latency", {}, "not-built", "not its extension deep_ep._C (not built?)"),
        ("nccl_ep_low_latency", dict(compute_capability=(8, 0)), None, "compute capability >= 9.0, found 8.0"),
        ("nccl_ep_low_latency", {}, "old-nccl", "needs NCCL >= 2.30 in the process; it would load NCCL 2.28.9"),
        ("deepep_v2_low_latency", {}, "old-nccl", "LD_PRELOAD=<staged>/nvidia/nccl/lib/libnccl.so.2"),
        ("nccl_ep_high_throughput", {}, "no-nvcc", "compiles its kernels at run time: no nvcc"),
        ("deepep_v2_high_throughput", dict(world_size=1, gpus=1), None, "needs at least 2 ranks"),
        ("deepep_v2_high_throughput", dict(peer_access=False), None, "needs NVLink between a node's GPUs"),
    ],
)
def test_each_way_they_cannot_run_is_one_line(staged, monkeypatch, name, env, change, reason):
    site = staged / "site"
    if change == "no-nccl-ep":
        (site / "nccl" / "ep" / "__init__.py").unlink()
    elif change == "no-deep-ep":
        shutil.rmtree(site / "deep_ep")
    elif change == "deep-ep-v1":
        (site / "deep_ep" / "buffers" / "elastic.py").unlink()
    elif change == "not-built":
        next((site / "deep_ep").glob("_C*.so")).unlink()
    elif change == "old-nccl":
        (staged / "libnccl.so.2").write_bytes(b"NCCL version 2.28.9+cuda13.0\0")
    elif change == "no-nvcc":
        monkeypatch.setenv("PATH", str(staged / "empty"))
    importlib.invalidate_caches()
    ok, why = get_backend(name).availability(h100(**{"world_size": 2, **env}))
    assert not ok and reason in why, why
    assert "\n" not in why


def test_their_engine_literals_are_vllm_deepep_v2_and_trtllm_nccl_ep():
    assert get_backend("nccl_ep_low_latency").engine_names == {"trtllm": "NCCL_EP"}
    for name in DEEPEP_V2:
        assert get_backend(name).engine_names == {"vllm": "deepep_v2"}
    assert get_backend("nccl_ep_high_throughput").engine_names == {}
    assert {get_backend(n).reach for n in NCCL_EP + DEEPEP_V2} == {"anywhere"}


# ------------------------------------------------------ the staging script's fatbin pruning


def _stage_module():
    spec = importlib.util.spec_from_file_location("stage_nccl_ep", paths.REPO / "scripts" / "stage_nccl_ep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    body = b""
    for arch, payload in entries:
        head = bytearray(64)
        struct.pack_into("<HHIQ", head, 0, 2, 0, 64, len(payload))
        struct.pack_into("<I", head, 28, arch)
        body += bytes(head) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_pruning_zeroes_only_the_other_families_code_and_refuses_what_it_cannot_walk(monkeypatch):
    stage = _stage_module()
    sm90, sm100, ptx = b"\x90" * 48, b"\xa0" * 32, b"\x77" * 16
    blob = _fatbin([(90, sm90), (100, sm100), (120, ptx)])
    lib = bytearray(b"HOST" * 4 + blob + b"TAIL")
    monkeypatch.setattr(stage, "sections", lambda elf: {".nv_fatbin": (16, len(blob)), ".text": (0, 16)})
    stats = stage.prune_fatbins(lib, 90)
    assert stats == {".nv_fatbin": {"kept_bytes": 48, "zeroed_bytes": 48}}
    assert sm90 in lib and sm100 not in lib and ptx not in lib
    assert lib[:16] == b"HOST" * 4 and lib.endswith(b"TAIL") and len(lib) == 16 + len(blob) + 4
    broken = bytearray(b"HOST" * 4 + blob + b"TAIL")
    struct.pack_into("<Q", broken, 16 + 16 + 64 + 48 + 8, len(sm100) + 8)  # sm_100's size: past its fatbin
    before = bytes(broken)
    with pytest.raises(ValueError):
        stage.prune_fatbins(broken, 90)
    assert bytes(broken) == before


@pytest.mark.parametrize(
    "team, tokens, refused",
    [
        (1, 2, True),
        (1, 4, False),
        (2, 1, True),
        (2, 2, False),
        (3, 2, True),
        (3, 4, False),
        (4, 1, False),
        (0, 1, False),
    ],
)
def test_high_throughput_refuses_in_one_line_the_counts_the_library_aborts_on(team, tokens, refused):
    """ht_ep_adapter.cu asserts tokens per rank x NVLink team ranks % 4 == 0 (T = 2 aborted a
    rank at world 1 on an H100): refused before the library sees it; LL (team 0) never is."""
    import torch

    from a2a_tune.kernels.errors import ShapeError
    from a2a_tune.kernels.nccl_ep import NcclEPHighThroughput

    backend = object.__new__(NcclEPHighThroughput)  # no group: the check comes before the library
    backend.check_inputs = lambda x, ids, weights: x.shape[0]
    backend._ht_team = team
    x = torch.zeros(tokens, 16)
    with pytest.raises(ShapeError if refused else AttributeError) as caught:
        backend.dispatch(x, torch.zeros(tokens, 1, dtype=torch.int32), torch.ones(tokens, 1))
    assert ("multiples of 4" in str(caught.value)) == refused
