"""This machine's fingerprint (runtime/fingerprint.py): the canonical form, which fingerprints
may share a table, and the probe at start-up -- the tuner's probe run as a child (never imported),
cached per boot, driver and GPUs, bounded in time, never trusted when damaged."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest
from hangs import bounded
from lookups import A, warnings_of

from a2a_tune.tuner.runtime import fingerprint as fpmod
from a2a_tune.tuner.runtime.fingerprint import domain_key, node_count, normalize_fingerprint
from a2a_tune.tuner.runtime.lookup import lookup


def test_a_fingerprint_is_folded_to_lowercase_and_never_rewritten():
    assert normalize_fingerprint("  H200.NVL18x2.Node1 ") == "h200.nvl18x2.node1"
    for bad in ("", ".hidden", "a b", "a/b", "../x", "x" * 201, "é.nvl18x2.node1"):
        with pytest.raises(ValueError, match="invalid hardware fingerprint"):
            normalize_fingerprint(bad)
    with pytest.raises(ValueError, match="must be a string, got int"):
        normalize_fingerprint(7)


def test_a_long_or_hostile_fingerprint_is_quoted_in_one_bounded_line():
    with pytest.raises(ValueError) as info:
        normalize_fingerprint("h200\n\x1b[2J" + "x" * 10_000)
    text = str(info.value)
    assert len(text) < 200 and "\n" not in text and "\x1b" not in text and "use 1-200 characters" in text


def test_nodes_and_domains():
    assert (node_count("h200.nvl18x2.node1"), node_count("gb200.mnnvl18x16.nodes4")) == (1, 4)
    assert node_count("h200.nvl18x2.nodes") is None
    assert domain_key("h200.nvl18x2-degraded.nodes2") == ("h200", "nvl18x2-degraded")
    assert domain_key("h200.nvl18x2.node1") != domain_key("h200.nvl18x2-degraded.node1")


def _fake_probe(monkeypatch, answer="h200.nvl18x2.node1"):
    """The probe's child stands in: each call is recorded (its timeout), none starts a process."""
    calls = []

    def probe_child(timeout_s):
        calls.append({"timeout_s": timeout_s})
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(fpmod, "_probe_child", probe_child)
    return calls


@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/random/boot_id"), reason="needs a Linux boot id")
def test_the_probed_fingerprint_is_cached_per_boot_driver_and_gpus(monkeypatch, tmp_path):
    calls = _fake_probe(monkeypatch)
    assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1"
    assert len(calls) == 1 and calls[0]["timeout_s"] <= 10
    (cached,) = Path(os.environ["XDG_CACHE_HOME"], "a2a-tune").glob("fingerprint-*")
    # An engine's next start (a fresh process: nothing in memory) reads the file, probes nothing.
    start = time.perf_counter()
    assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1"
    assert time.perf_counter() - start < 0.05
    assert len(calls) == 1
    # Another driver or GPU set (the key), or an entry older than a day: probed again.
    driver = tmp_path / "nvidia"
    (driver / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (driver / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    with monkeypatch.context() as mp:
        mp.setattr(fpmod, "_NVIDIA_PROC", str(driver))
        assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1" and len(calls) == 2
        (driver / "gpus" / "0000:2a:00.0").mkdir()
        assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1" and len(calls) == 3
        assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1" and len(calls) == 3
    calls.clear()
    fmt, key, fp, probed_at = cached.read_text().splitlines()
    cached.write_text(f"{fmt}\n{key}\n{fp}\n{float(probed_at) - fpmod.CACHE_MAX_AGE_S - 1}\n")
    assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1" and len(calls) == 1
    # A damaged or hostile cache file is ignored, never trusted or hung on.
    cached.write_text("a2a-tune fingerprint cache 1\nx")
    assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1" and len(calls) == 2
    cached.unlink()
    os.mkfifo(cached)
    assert bounded(fpmod.probed_fingerprint) == "h200.nvl18x2.node1" and len(calls) == 3


def test_a_hung_nvml_delays_the_first_lookup_by_seconds_not_a_minute(monkeypatch, tmp_path, caplog):
    # The probe's child imports this pynvml instead of the real one, and hangs in nvmlInit.
    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text("import time\ndef nvmlInit():\n    time.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(fpmod, "PROBE_TIMEOUT_S", 2.0)
    start = time.monotonic()
    c = bounded(lambda: lookup(tokens=64, **A), seconds=40)
    elapsed = time.monotonic() - start
    assert c.match == "fallback" and elapsed < 30, elapsed
    (warning,) = warnings_of(caplog)
    assert "hardware probe failed" in warning.getMessage() and "within 2 s" in warning.getMessage()
    assert not list(Path(os.environ["XDG_CACHE_HOME"]).rglob("fingerprint-*"))  # a failure is not cached


# ---------------------------------------------------- the probe's child (the runtime imports no tuner code)

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
    assert reason in text and text.isprintable() and len(text) < 400
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
