"""This machine's fingerprint (runtime/fingerprint.py): the canonical form, which fingerprints
may share a table, and the probe at start-up -- cached per boot, driver and GPUs, bounded in
time, never trusted when damaged."""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

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
    calls = []
    fake = types.ModuleType("a2a_tune.tuner.probe")

    def probe(**kwargs):
        calls.append(kwargs)
        if isinstance(answer, Exception):
            raise answer
        return types.SimpleNamespace(fingerprint=answer)

    fake.probe = probe
    monkeypatch.setitem(sys.modules, "a2a_tune.tuner.probe", fake)
    return calls


@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/random/boot_id"), reason="needs a Linux boot id")
def test_the_probed_fingerprint_is_cached_per_boot_driver_and_gpus(monkeypatch, tmp_path):
    calls = _fake_probe(monkeypatch)
    assert fpmod.probed_fingerprint() == "h200.nvl18x2.node1"
    assert len(calls) == 1 and calls[0]["strict"] and calls[0]["timeout_s"] <= 10
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
