"""A host with one GPU says what it is: expert parallelism needs 2 GPUs (here or across nodes),
`--device cpu` is a CPU rehearsal, and every "unavailable" reason is true on that host.

The host is faked in this process: a 1-GPU recording derived from the 2×H200 fixture
(A2A_TUNE_NVML_RECORDING) and torch.cuda answering for one H200."""

from __future__ import annotations

import json

import paths
import pytest
import torch
from typer.testing import CliRunner

from a2a_tune.kernels import BackendEnv, get_backend, list_backends
from a2a_tune.tuner.cli import app

GPU_BACKENDS = ("nvlink_one_sided", "nvlink_low_latency", "flashinfer_nvlink_one_sided", "deepep_low_latency")


@pytest.fixture
def one_h200(monkeypatch, tmp_path):
    recording = json.loads((paths.FIXTURES / "nvml" / "h200_nv18x2.json").read_text())
    recording.update(device_count=1, devices=recording["devices"][:1], _note="h200_nv18x2.json, its first GPU only")
    path = tmp_path / "h200_single.json"
    path.write_text(json.dumps(recording))
    monkeypatch.setenv("A2A_TUNE_NVML_RECORDING", str(path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)


def a2a(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


REFUSAL = (
    "error: expert parallelism needs at least 2 GPUs; this machine has 1 (NVIDIA H200): use 2 or more here, or "
    "launch one rank per GPU across nodes with torchrun/srun; --device cpu is a rehearsal on CPU ranks (gloo), "
    "not this machine's table"
)


@pytest.mark.parametrize("args", [("run",), ("sweep",), ("run", "--device", "cuda"), ("sweep", "--world", "2")])
def test_gpu_ranks_on_one_gpu_are_refused_in_one_line_saying_what_the_host_can_do(one_h200, args):
    r = a2a(*args)
    assert r.exit_code == 2, r.output
    assert r.output.strip() == REFUSAL  # not 2 CPU ranks and a cpu-x86_64 table


def test_check_on_one_gpu_names_virtual_ranks_too(one_h200):
    r = a2a("check")
    assert r.exit_code == 2
    assert r.output.strip() == REFUSAL + "; --virtual --world N checks backends' kernels on N virtual ranks of this GPU"


def test_cpu_ranks_on_a_gpu_host_are_called_a_rehearsal(one_h200):
    r = a2a("sweep", "--device", "cpu", "--dtype", "no-such-dtype")  # stops right after the ranks are resolved
    lines = r.output.strip().splitlines()
    assert lines[0] == (
        "note: --device cpu on a host with 1 GPU(s): a rehearsal on CPU ranks over gloo; "
        "what it measures is not this machine's table"
    )
    assert r.exit_code == 2 and lines[1].startswith("error: unknown --dtype")


def test_every_unavailable_reason_is_true_on_a_one_gpu_host(one_h200):
    on_cpu = BackendEnv.local(2, "cpu")
    assert on_cpu.gpus == 1
    for name in GPU_BACKENDS:
        ok, reason = get_backend(name).availability(on_cpu)
        assert not ok and "needs CUDA GPUs" not in reason and "these ranks run on the CPU" in reason, (name, reason)
    listed = a2a("backends", "--device", "cpu")
    assert listed.exit_code == 0 and "needs CUDA GPUs" not in listed.output
    reasons = {
        b["backend"]: b["reason"] for b in json.loads(a2a("backends", "--device", "cpu", "--json").output)["backends"]
    }
    assert reasons["nvlink_one_sided"] == "needs CUDA ranks (symmetric memory over NVLink); these ranks run on the CPU"
    here = a2a("backends")  # auto on one GPU: its one cuda rank
    assert here.exit_code == 0 and "backends for 1 cuda rank(s)" in here.output
    assert "needs CUDA" not in here.output
    for name in list_backends():
        ok, reason = get_backend(name).availability(BackendEnv.local(1, "cuda"))
        assert not ok and "needs CUDA" not in reason, (name, reason)


def test_a_host_without_gpus_still_says_it_has_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    ok, reason = get_backend("nvlink_one_sided").availability(BackendEnv.local(2, "cpu"))
    assert not ok and reason == "needs CUDA GPUs (symmetric memory over NVLink); none visible here"


def test_a_job_with_one_gpu_per_task_runs_on_cuda_ranks(one_h200, monkeypatch):
    from a2a_tune.tuner import plans

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")  # torchrun/srun across nodes: one GPU visible to each task
    assert plans.resolve_ranks("auto", None) == ("cuda", 4)


def test_virtual_ranks_run_on_the_one_gpu_at_any_world_size(one_h200):
    from a2a_tune.tuner import plans
    from a2a_tune.tuner.check import virtual_availability

    assert plans.resolve_virtual("auto", 8) == ("cuda", 8)
    assert virtual_availability("nvlink_low_latency", "cuda", 8).ok
    ok, reason = virtual_availability("deepep_low_latency", "cuda", 8)
    assert not ok and reason == "needs a process per rank (collectives), so not on virtual ranks"
