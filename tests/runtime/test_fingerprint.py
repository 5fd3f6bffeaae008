"""This machine's fingerprint at start-up: the runtime runs the tuner's probe as a bounded child
(`python -m a2a_tune.tuner.probe --fingerprint`) and never imports it. (The cache's keys and a
hung NVML: tests/tuner/test_robustness.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest

from a2a_tune.tuner.runtime import fingerprint as fpmod

RECORDING = paths.FIXTURES / "nvml" / "h200_nv18x2.json"


def child(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.probe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def fake_pynvml(tmp_path, body: str) -> str:
    """A PYTHONPATH whose `pynvml` is `body` (what the probe's child imports instead of NVML's)."""
    (tmp_path / "fake_nvml").mkdir()
    (tmp_path / "fake_nvml" / "pynvml.py").write_text(body)
    return os.pathsep.join([str(tmp_path / "fake_nvml"), os.environ.get("PYTHONPATH", "")])


def test_the_probe_child_prints_the_fingerprint_of_a_replayed_machine():
    r = child("--fingerprint", A2A_TUNE_NVML_RECORDING=str(RECORDING))
    assert (r.returncode, r.stdout, r.stderr) == (0, "h200.nvl18x2.node1\n", "")


def nvml_failing_with(error: str) -> str:
    """A `pynvml` whose nvmlInit fails with NVML's error `error` (pynvml's class naming)."""
    return f"class NVMLError_{error}(Exception):\n    pass\ndef nvmlInit():\n    raise NVMLError_{error}('boom')\n"


def test_the_probe_child_on_a_host_without_a_driver_prints_the_cpu_fingerprint(tmp_path):
    r = child("--fingerprint", PYTHONPATH=fake_pynvml(tmp_path, nvml_failing_with("DriverNotLoaded")))
    assert r.returncode == 0 and r.stdout.startswith("cpu-") and r.stdout.count("\n") == 1, r.stderr


def test_a_failing_nvml_fails_the_probe_child_in_one_line_rather_than_borrow_a_cpu_fingerprint(tmp_path):
    r = child("--fingerprint", PYTHONPATH=fake_pynvml(tmp_path, nvml_failing_with("Unknown")))
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "NvmlQueryError: Unknown: boom\n")


def test_the_probe_child_refuses_other_arguments():
    r = child()
    assert r.returncode == 2 and r.stdout == "" and "--fingerprint" in r.stderr


def test_a_probed_fingerprint_comes_from_the_child_and_is_cached(monkeypatch):
    monkeypatch.setenv("A2A_TUNE_NVML_RECORDING", str(RECORDING))
    started = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: started.append(argv) or run(argv, **kw))
    assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1"
    assert started == [[sys.executable, "-m", "a2a_tune.tuner.probe", "--fingerprint"]]
    if os.path.exists("/proc/sys/kernel/random/boot_id"):  # a key to cache under
        assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1" and len(started) == 1


def test_the_runtime_does_not_import_the_tuners_probe_to_fingerprint():
    code = (
        "import os, sys\n"
        "from a2a_tune.tuner.runtime.fingerprint import probed_fingerprint\n"
        "print(probed_fingerprint())\n"
        "print(sorted(m for m in sys.modules if m.startswith('a2a_tune.') and '.runtime' not in m and m != 'a2a_tune.tuner'))\n"
    )
    env = {**os.environ, "A2A_TUNE_NVML_RECORDING": str(RECORDING)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["h200.nvl18x2.node1", "[]"]


@pytest.mark.parametrize(
    "outcome,reason",
    [
        (subprocess.CompletedProcess([], -11, "", "Fatal Python error: Segmentation fault\n"), "exited with code -11"),
        (subprocess.CompletedProcess([], 1, "", "x\nNvmlQueryError: Unknown: boom\n"), "NvmlQueryError: Unknown: boom"),
        (subprocess.CompletedProcess([], 0, "not a fingerprint!\n", ""), "printed no fingerprint"),
        (subprocess.CompletedProcess([], 1, "", "\x1b[31m" + "y" * 5000 + "\n"), "yyy"),
    ],
    ids=["crashed", "failed", "garbage", "long"],
)
def test_a_failed_probe_child_raises_one_bounded_line_and_caches_nothing(monkeypatch, outcome, reason):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: outcome)
    with pytest.raises(fpmod.ProbeError) as caught:
        fpmod.probed_fingerprint()
    text = str(caught.value)
    assert reason in text and "\n" not in text and len(text) < 400
    assert not list(Path(os.environ["XDG_CACHE_HOME"]).rglob("fingerprint-*"))


def test_a_hung_probe_child_is_killed_at_the_timeout(monkeypatch):
    # A child that never answers stands in for the probe's.
    real = subprocess.run

    def hang(argv, **kw):
        return real([sys.executable, "-c", "import time; time.sleep(60)"], **kw)

    monkeypatch.setattr(subprocess, "run", hang)
    start = time.monotonic()
    with pytest.raises(fpmod.ProbeError, match="did not answer within 1 s"):
        fpmod.probed_fingerprint(timeout_s=1.0)
    assert time.monotonic() - start < 20
