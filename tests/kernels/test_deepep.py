"""DeepEP's and torch's NVSHMEM backends where they cannot run: reported, never raised, never
imported; their shape limits, knobs and engine literals; and torch_nvshmem_all2all's own code
(pair sorting, row packing, validity of received rows, combine) over gloo ranks, with torch's
two NVSHMEM kernels emulated (tests/support/emulate_nvshmem.py).

The kernels themselves run on GPUs only: tests/test_deepep_gpu.py (2 GPUs, DeepEP staged by
scripts/stage_deepep.py).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from invariant_cases import Case, run_cases

from a2a_tune.kernels import BackendEnv, KnobError, MoEShape, _deepep, engine_names, get_backend, list_backends
from a2a_tune.kernels.deepep_high_throughput import DEEPEP_SEND_TOKENS, DeepEPHighThroughput
from a2a_tune.kernels.deepep_low_latency import slots_per_source
from a2a_tune.kernels.torch_nvshmem_all2all import expert_groups
from a2a_tune.tuner.launch import run_ranks

REPO = paths.REPO
DEEPEP = ["deepep_high_throughput", "deepep_low_latency"]
NEW = [*DEEPEP, "torch_nvshmem_all2all"]


def h200(world: int = 2, **kw) -> BackendEnv:
    fields = dict(
        world_size=world, device_type="cuda", dist_backend="nccl", compute_capability=(9, 0), peer_access=True
    )
    return BackendEnv(**{**fields, **kw})


def _fake_deepep(root: Path, *, extension: bytes | None) -> Path:
    """A deep_ep package whose import fails loudly, and optionally an 'extension' file holding
    `extension` (an ELF's strings, as far as availability() reads it)."""
    pkg = root / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing deep_ep is not allowed in this test')\n")
    if extension is not None:
        (root / f"deep_ep_cpp{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF" + extension)
    return root


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """Put a fake DeepEP build on sys.path: staged(nvshmem=True/False/None for no extension)."""

    def stage(nvshmem: bool | None):
        blob = None if nvshmem is None else (b"\0libnvshmem_host.so.3\0" if nvshmem else b"\0libc.so.6\0")
        monkeypatch.syspath_prepend(str(_fake_deepep(tmp_path / f"site-{nvshmem}", extension=blob)))
        importlib.invalidate_caches()

    monkeypatch.delitem(sys.modules, "deep_ep", raising=False)
    return stage


@pytest.fixture
def nvshmem_here(tmp_path, monkeypatch):
    lib = tmp_path / "nvshmem" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvshmem_host.so.3").write_bytes(b"")
    monkeypatch.setenv("NVSHMEM_DIR", str(lib.parent))


@pytest.fixture
def no_nvshmem(monkeypatch):
    monkeypatch.delenv("NVSHMEM_DIR", raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        _deepep.importlib.util, "find_spec", lambda name: None if name == "nvidia.nvshmem" else real(name)
    )


# ------------------------------------------------------------------------ names, registry


def test_registered_after_every_existing_backend_in_order():
    names = list_backends()
    assert names.index("nvlink_low_latency") < names.index("deepep_high_throughput")
    assert [n for n in names if n in NEW] == NEW


@pytest.mark.parametrize(
    "name, vllm, sglang, trtllm, mode",
    [
        ("deepep_high_throughput", "deepep_high_throughput", "deepep", "DEEPEP", "normal"),
        ("deepep_low_latency", "deepep_low_latency", "deepep", "DEEPEPLOWLATENCY", "low_latency"),
    ],
)
def test_engine_literals(name, vllm, sglang, trtllm, mode):
    names = engine_names()[name]
    assert names["engines"] == {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}
    cls = get_backend(name)  # the class's per-engine fields and its map agree
    assert tuple(cls.engine_names[e] for e in ("vllm", "sglang", "trtllm")) == (vllm, sglang, trtllm)
    assert names["engine_options"] == {"sglang": ["--deepep-mode", mode]}


def test_torch_nvshmem_has_no_engine_literal_and_names_the_closest_vllm_backend():
    names = engine_names()["torch_nvshmem_all2all"]
    assert names["engines"] == {"vllm": None, "sglang": None, "trtllm": None}
    assert names["closest"] == {"vllm": "flashinfer_nvlink_two_sided"} and names["engine_options"] == {}
    assert engine_names()["nccl_all2allv"]["engines"]["trtllm"] is None  # the default for the others


# ------------------------------------------------------------------------ availability


@pytest.mark.parametrize("name", NEW)
def test_on_cpu_ranks_the_reason_names_the_gpu(name):
    ok, reason = get_backend(name).availability(BackendEnv(world_size=2, device_type="cpu", dist_backend="gloo"))
    assert not ok and reason.startswith("needs CUDA GPUs")


@pytest.mark.parametrize("name", DEEPEP)
def test_without_deepep_the_reason_says_how_to_build_it(name, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(_deepep.importlib.util, "find_spec", lambda n: None if n == "deep_ep" else real(n))
    ok, reason = get_backend(name).availability(h200())
    assert not ok
    assert (
        reason
        == "deep_ep not installed (build it from source: python scripts/stage_deepep.py --source DIR; README 'DeepEP')"
    )


@pytest.mark.parametrize("name", DEEPEP)
def test_a_source_tree_without_its_extension_is_named(name, staged):
    staged(None)
    ok, reason = get_backend(name).availability(h200())
    assert (
        not ok
        and reason.startswith("deep_ep found at ")
        and reason.endswith("not its extension deep_ep_cpp (not built?)")
    )


def test_a_build_without_nvshmem_runs_only_the_intranode_kernels(staged, no_nvshmem):
    staged(False)
    assert get_backend("deepep_high_throughput").availability(h200()).ok
    ok, reason = get_backend("deepep_low_latency").availability(h200())
    assert not ok and reason == "DeepEP was built without NVSHMEM: its low-latency kernels are disabled"
    assert sys.modules.get("deep_ep") is None  # looked at, never imported


@pytest.mark.parametrize("name", DEEPEP)
def test_a_build_with_nvshmem_needs_the_library(name, staged, no_nvshmem):
    staged(True)
    ok, reason = get_backend(name).availability(h200())
    assert not ok
    assert reason == "NVSHMEM missing: deep_ep_cpp needs libnvshmem_host (pip install nvidia-nvshmem-cu13)"


@pytest.mark.parametrize("name", DEEPEP)
def test_a_build_with_nvshmem_and_the_library_is_available(name, staged, nvshmem_here):
    staged(True)
    assert get_backend(name).availability(h200()) == (True, "")
    assert _deepep.nvshmem_library().name == "libnvshmem_host.so.3"


@pytest.mark.parametrize(
    "name, env, reason",
    [
        (
            "deepep_high_throughput",
            h200(compute_capability=(8, 0)),
            "compute capability >= 9.0 (its SM90 build), found 8.0",
        ),
        ("deepep_low_latency", h200(peer_access=False), "no NVLink peer access between every pair of GPUs"),
        ("deepep_high_throughput", h200(world=1), "needs at least 2 ranks"),
        ("deepep_low_latency", h200(world=1), "needs at least 2 ranks"),
        ("deepep_high_throughput", h200(world=3), "DeepEP's intranode kernels run 2, 4 or 8 ranks, not 3"),
        ("deepep_high_throughput", h200(world=16), "not 16 (more ranks need its internode RDMA kernels"),
    ],
)
def test_machines_deepep_cannot_use_are_named(name, env, reason, staged, nvshmem_here):
    staged(True)
    ok, why = get_backend(name).availability(env)
    assert not ok and reason in why


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_low_latency_runs_any_rank_count(world, staged, nvshmem_here):
    staged(True)
    assert get_backend("deepep_low_latency").availability(h200(world=world)).ok


def test_torch_nvshmem_limits_on_ranks():
    cls = get_backend("torch_nvshmem_all2all")
    assert cls.availability(h200(world=1)) == (False, "needs at least 2 ranks")
    assert cls.availability(h200(world=17)) == (False, "torch's all_to_all_vdev_2d_offset runs at most 16 ranks")


def test_importing_a2a_tune_and_asking_availability_never_imports_deepep(tmp_path):
    site = _fake_deepep(tmp_path, extension=b"\0libnvshmem_host.so.3\0")
    code = (
        "import sys\n"
        "from a2a_tune.kernels import BackendEnv, get_backend\n"
        "import a2a_tune.tuner.cli\n"
        "env = BackendEnv(2, 'cuda', 'nccl', compute_capability=(9, 0), peer_access=True)\n"
        "print([get_backend(n).availability(env).ok for n in ('deepep_high_throughput', 'deepep_low_latency')])\n"
        "print(sorted(m for m in sys.modules if m.startswith('deep_ep')))\n"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "NVSHMEM_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


# ------------------------------------------------------------------------ shapes


@pytest.mark.parametrize(
    "name, shape, world, reason",
    [
        ("deepep_high_throughput", MoEShape(8, 2, 4096, 64, "fp16"), 2, "does not carry fp16"),
        ("deepep_high_throughput", MoEShape(512, 8, 4096, 64), 2, "at most 128 experts per rank"),
        ("deepep_high_throughput", MoEShape(64, 33, 4096, 64), 2, "at most 32 experts per token"),
        ("deepep_high_throughput", MoEShape(8, 2, 8192, 64), 2, "hidden 8192"),
        ("deepep_high_throughput", MoEShape(8, 2, 2056, 64), 2, "hidden 2056"),
        ("deepep_high_throughput", MoEShape(8, 2, 2064, 64, "fp8_e4m3"), 2, "hidden 2064"),
        ("deepep_low_latency", MoEShape(128, 4, 2880, 64), 2, "hidden sizes 2048, 2560, 3072, 4096"),
        ("deepep_low_latency", MoEShape(64, 12, 4096, 64), 2, "at most 11 experts per token"),
        ("deepep_low_latency", MoEShape(8, 2, 4096, 2048), 2, "at most 1024 tokens per rank"),
        ("deepep_low_latency", MoEShape(8, 2, 4096, 64, "fp32"), 2, "does not carry fp32"),
        ("torch_nvshmem_all2all", MoEShape(32, 2, 64, 8), 32, "at most 16 ranks"),
    ],
)
def test_shapes_the_kernels_cannot_take_are_infeasible_with_a_reason(name, shape, world, reason):
    ok, why = get_backend(name).feasibility(shape, world)
    assert not ok and reason in why


@pytest.mark.parametrize(
    "name, shape",
    [
        ("deepep_high_throughput", MoEShape(256, 8, 7168, 128)),  # DeepSeek-V3
        ("deepep_high_throughput", MoEShape(128, 4, 2880, 128, "fp8_e4m3")),  # gpt-oss-120b
        ("deepep_low_latency", MoEShape(256, 8, 7168, 1024, "fp8_e4m3")),
        ("deepep_low_latency", MoEShape(8, 2, 4096, 1)),  # Mixtral, one token
        ("torch_nvshmem_all2all", MoEShape(12, 3, 33, 8, "fp16")),  # odd hidden, any dtype
        ("torch_nvshmem_all2all", MoEShape(256, 8, 7168, 16384, "fp8_e4m3")),
    ],
)
def test_the_presets_shapes_fit(name, shape):
    assert get_backend(name).feasibility(shape, 2).ok


@pytest.mark.parametrize("capacity, world, slots", [(1, 2, 2), (2, 2, 2), (3, 2, 4), (5, 4, 5), (1, 3, 4), (7, 1, 8)])
def test_low_latency_capacity_rounds_up_to_what_deepep_takes(capacity, world, slots):
    assert slots_per_source(capacity, world) == slots


@pytest.mark.parametrize("per_rank, groups", [(1, 1), (8, 8), (16, 16), (20, 10), (17, 1), (128, 16), (18, 9)])
def test_torch_nvshmem_expert_groups_divide_a_ranks_experts(per_rank, groups):
    assert expert_groups(per_rank) == groups


# ------------------------------------------------------------------------ knobs


def test_deepep_knob_defaults_are_valid_and_bad_settings_are_one_line_errors():
    cls = DeepEPHighThroughput
    assert cls.check_knobs({}) == cls.knob_defaults
    assert cls.check_knobs({"num_sms": 32})["num_sms"] == 32
    with pytest.raises(KnobError, match="num_sms=21 not allowed"):
        cls.check_knobs({"num_sms": 21})  # DeepEP pairs sender and receiver SMs: odd counts are not offered
    with pytest.raises(KnobError, match="unknown knob 'num_qps'"):
        cls.check_knobs({"num_qps": 2})
    assert all(v % 2 == 0 for v in cls.knob_space["num_sms"])


class _FakeConfig:
    def __init__(self, *args):
        self.args = args


@pytest.mark.parametrize("world", [2, 4, 8, 3])
def test_a_send_size_of_zero_is_deepeps_default_for_the_rank_count(world):
    backend = object.__new__(DeepEPHighThroughput)  # apply_knobs only needs these
    backend.world_size, backend._ep = world, type("ep", (), {"Config": _FakeConfig})
    backend.set_knobs({})
    dispatch_send, combine_send = DEEPEP_SEND_TOKENS.get(world, (6, 6))
    assert backend._dispatch_config.args == (20, dispatch_send, 256)
    assert backend._combine_config.args == (20, combine_send, 256)
    assert backend.knobs()["dispatch_send_tokens"] == dispatch_send  # what runs is recorded
    backend.set_knobs({"num_sms": 32, "combine_send_tokens": 2, "dispatch_recv_tokens": 512})
    assert backend._dispatch_config.args == (32, dispatch_send, 512)
    assert backend._combine_config.args == (32, 2, 256)


# ------------------------------------------------------------------------ torch_nvshmem_all2all, emulated

EMULATED = "torch_nvshmem_all2all_emulated"


def _nvshmem_cases_w2() -> list[Case]:
    b = EMULATED
    return [
        Case("uniform", b, (5, 7)),
        Case("bf16", b, (6, 3), dtype="bf16"),
        Case("fp16-odd-hidden", b, (5, 6), hidden=33, dtype="fp16"),
        Case("fp8", b, (9, 4), hidden=256, dtype="fp8_e4m3"),
        Case("zero-tokens-rank0", b, (0, 9)),
        Case("zero-tokens-all", b, (0, 0)),
        Case("skewed", b, (32, 17), experts=32, topk=6, routing="skewed"),
        Case("all-local", b, (8, 8), routing="local"),
        Case("topk-equals-experts", b, (3, 2), experts=4, topk=4),
        Case("repeated-calls", b, (7, 5), repeats=4),
        Case("random-scales", b, (9, 9), scales="random"),
        Case("experts-in-groups", b, (12, 10), experts=64, topk=6),  # 32 per rank: 16 groups of 2
        Case("empty-groups", b, (2, 1), experts=64, topk=2),  # most groups get nothing: padding rows
        Case("capacity-above-tokens", b, (5, 3), capacity=32, repeats=2),
    ]


def _nvshmem_cases_w3() -> list[Case]:
    b = EMULATED
    return [
        Case("w3-uniform", b, (4, 9, 2), experts=12, topk=3),
        Case("w3-zero-middle", b, (5, 0, 7), experts=12, topk=3, dtype="bf16"),
        Case("w3-skewed-odd", b, (11, 3, 8), experts=24, topk=5, hidden=47, routing="skewed"),
        Case("w3-groups", b, (6, 6, 6), experts=54, topk=4),  # 18 per rank: 9 groups of 2
    ]


@pytest.fixture(scope="module")
def emulated():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "emulate_nvshmem")
        return {
            **run_ranks(run_cases, 2, "cpu", _nvshmem_cases_w2())[0],
            **run_ranks(run_cases, 3, "cpu", _nvshmem_cases_w3())[0],
        }


@pytest.mark.parametrize("case", _nvshmem_cases_w2() + _nvshmem_cases_w3(), ids=lambda c: c.id)
def test_torch_nvshmem_keeps_the_invariant_around_torchs_kernels(emulated, case):
    ok, err, reason, _ = emulated[case.id]
    assert ok, reason


# ------------------------------------------------------------------------ staging


def _stage(*args: str) -> subprocess.CompletedProcess:
    script = REPO / "scripts" / "stage_deepep.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)


def _tree(root: Path, buffer: str) -> Path:
    (root / "deep_ep").mkdir(parents=True)
    (root / "setup.py").write_text("")
    (root / "deep_ep" / "buffer.py").write_text(buffer)
    return root


V1 = "class Buffer:\n def get_dispatch_layout(): ...\n def low_latency_dispatch(): ...\n def low_latency_combine(): ..."


def test_staging_checks_the_tree_and_says_what_it_would_build(tmp_path):
    done = _stage("--source", str(_tree(tmp_path / "DeepEP", V1)), "--arch", "9.0", "--dry-run")
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)
    assert settings["arch"] == "9.0" and settings["source"] == str(tmp_path / "DeepEP")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source", "/nonexistent/DeepEP", "--arch", "9.0"], "--source /nonexistent/DeepEP: no such folder"),
        (
            ["--source", "TREE", "--arch", "8.0"],
            "arch 8.0: a2a-tune's DeepEP backends need its SM90 build (compute capability >= 9.0)",
        ),
    ],
)
def test_staging_refuses_in_one_line(tmp_path, args, message):
    args = [str(_tree(tmp_path / "DeepEP", V1)) if a == "TREE" else a for a in args]
    done = _stage(*args)
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [f"[stage_deepep] error: {message}"]


def test_staging_refuses_deepeps_v2_tree(tmp_path):
    done = _stage("--source", str(_tree(tmp_path / "DeepEP", "class ElasticBuffer: ...")), "--arch", "9.0")
    assert done.returncode != 0
    assert "has not DeepEP's V1 API" in done.stderr and "73b6ea4" in done.stderr
