"""Hostile and unlucky inputs (issue 17): the start-up path never hangs and reads only what it
may, resource limits say so in one line, errors are one line without secrets, and read-only
databases can be read. (The sweep's one writer and its ranks: tests/test_sweep_robustness.py
and tests/test_run_lease.py.)"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import paths
import pytest
from run_cli import a2a

from a2a_tune.tuner.runtime import fingerprint as fpmod
from a2a_tune.tuner.runtime.files import MAX_TABLE_BYTES, FileRefused, read_capped
from a2a_tune.tuner.runtime.lookup import FALLBACK_BACKEND, clear_cache, lookup

FIXTURES = paths.FIXTURES / "profiles"
FP = "test.fixture.node1"
SHAPE = dict(ep_size=2, hidden=7168, topk=8, num_experts=64)
SECRET_URL = "postgresql+psycopg2://u:secret@[::1:5432/x"


@pytest.fixture(autouse=True)
def _fresh_lookup():
    clear_cache()
    yield
    clear_cache()


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def bounded(fn, seconds: float = 10.0):
    """fn() in a thread: its result or its exception, or a test failure when it is still running
    after `seconds` (a hang must fail the test, not stall the suite)."""
    out: list = []

    def run():
        try:
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            out.append((False, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s (a hang)"
    ok, value = out[0]
    if not ok:
        raise value
    return value


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "a2a_tune" and r.levelno >= logging.WARNING]


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


# --------------------------------------------------------------------- start-up files


def test_read_capped_reads_regular_files_and_refuses_the_rest(tmp_path, fifo):
    f = tmp_path / "ok.txt"
    f.write_bytes(b"12345")
    assert read_capped(f, 5) == b"12345"
    f.write_bytes(b"123456")
    with pytest.raises(FileRefused, match=r"6 bytes, over the 5 bytes cap"):
        read_capped(f, 5)
    with pytest.raises(FileRefused, match=r"a FIFO"):
        bounded(lambda: read_capped(fifo, 100))
    with pytest.raises(FileRefused, match=r"a character device"):
        read_capped("/dev/zero", 100)
    with pytest.raises(FileRefused, match=r"a directory"):
        read_capped(tmp_path, 100)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized"])
def test_an_explicit_profile_that_is_no_table_falls_back_at_once(kind, fifo, tmp_path, caplog):
    path = {"fifo": fifo, "/dev/zero": Path("/dev/zero"), "oversized": tmp_path / "huge.json"}[kind]
    if kind == "oversized":
        with open(path, "wb") as f:
            f.truncate(MAX_TABLE_BYTES + 1)  # sparse: no disk, no time
    start = time.monotonic()
    c = bounded(lambda: lookup(profile=path, tokens=64, **SHAPE))
    assert time.monotonic() - start < 5
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (warning,) = warnings_of(caplog)
    expected = "16 MiB cap" if kind == "oversized" else "not a regular file"
    assert expected in warning.getMessage() and str(path) in warning.getMessage()


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_workload_that_is_no_file_falls_back_at_once(kind, fifo, caplog):
    path = fifo if kind == "fifo" else "/dev/zero"
    c = bounded(lambda: lookup(profile=FIXTURES / f"{FP}.json", workload=path, **SHAPE))
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (warning,) = warnings_of(caplog)
    assert "not a regular file" in warning.getMessage()


def test_a_fifo_on_the_search_path_is_reported_not_read(tmp_path, monkeypatch, caplog):
    os.mkfifo(tmp_path / f"{FP}.json")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = bounded(lambda: lookup(fingerprint=FP, tokens=64, **SHAPE))
    assert c.match == "fallback"
    (warning,) = warnings_of(caplog)
    assert f"{tmp_path / FP}.json" in warning.getMessage() and "FIFO" in warning.getMessage()


def test_the_cli_lookup_and_the_plugin_variable_survive_a_fifo(fifo, tmp_path):
    # --workload FIFO and --profile /dev/zero: the engine default, one warning, exit 0, promptly
    for args in (
        ["--workload", str(fifo), "--profile", str(FIXTURES / f"{FP}.json")],
        ["--tokens", "64", "--profile", "/dev/zero"],
    ):
        r = a2a("lookup", "--ep-size", "2", "--hidden", "7168", "--topk", "8", "--experts", "64", *args)
        assert r.returncode == 0 and r.stdout.strip() == FALLBACK_BACKEND, r.stderr
        assert "not a regular file" in r.stderr and "Traceback" not in r.stderr


def test_a_lookup_argument_out_of_range_is_named_not_an_internal_error(caplog):
    for kwargs in ({"tokens": -5}, {"tokens": True}, {"phase": "decode", "max_tokens": -1}):
        c = lookup(profile=FIXTURES / f"{FP}.json", **SHAPE, **kwargs)
        assert c.match == "fallback"
        assert "invalid lookup argument" in c.reason and "internal error" not in c.reason, c.reason


# --------------------------------------------------------------- this machine's fingerprint


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
    c = bounded(lambda: lookup(tokens=64, **SHAPE), seconds=40)
    elapsed = time.monotonic() - start
    assert c.match == "fallback" and elapsed < 30, elapsed
    (warning,) = warnings_of(caplog)
    assert "hardware probe failed" in warning.getMessage() and "within 2 s" in warning.getMessage()
    assert not list(Path(os.environ["XDG_CACHE_HOME"]).rglob("fingerprint-*"))  # a failure is not cached


def test_the_probe_command_does_not_import_torch():
    code = (
        "import sys; from a2a_tune.tuner import cli; sys.argv = ['a2a-tune', 'probe', '--json']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'triton', 'a2a_tune.kernels') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "HEAVY []"
    assert '"fingerprint"' in r.stdout


# ---------------------------------------------------------------------- resource limits


def test_world_beyond_the_machine_is_refused_before_any_rank_starts(tmp_path):
    start = time.monotonic()
    r = a2a("sweep", "--device", "cpu", "--world", "1000", "--db", str(tmp_path / "w.db"), "--no-progress")
    assert r.returncode == 2
    line = one_error_line(r)
    assert "--world 1000 on cpu: this machine holds at most" in line and "core(s)" in line
    assert time.monotonic() - start < 60 and not (tmp_path / "w.db").exists()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"])
def test_commands_that_store_refuse_an_in_memory_database(url):
    r = a2a("sweep", "--device", "cpu", "--tokens", "1", "--db", url, "--no-progress")
    assert r.returncode == 2
    assert "is an in-memory database" in one_error_line(r)
    r = a2a("tune-knobs", "--backend", "nvlink_one_sided", "--preset", "mixtral-8x7b", "--tokens", "1", "--db", url)
    assert r.returncode == 2 and "is an in-memory database" in one_error_line(r)


def test_a_token_count_out_of_range_is_one_line():
    r = a2a("sweep", "--device", "cpu", "--tokens", "99999999999999999999", "--db", "x.db", "--no-progress")
    assert r.returncode == 2
    assert "--tokens: tokens per rank must be in 1..1048576, got 99999999999999999999" in one_error_line(r)


# ---------------------------------------------------------------------- one line each


def test_a_model_config_that_is_not_utf8_is_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"hidden_size": 4096, "name": "\xff\xfe"}')
    r = a2a("sweep", "--device", "cpu", "--model-config", str(bad), "--db", str(tmp_path / "c.db"))
    assert r.returncode == 2
    assert f"{bad}: not UTF-8 text" in one_error_line(r)
    r = a2a("sweep", "--device", "cpu", "--model-config", "/dev/zero", "--db", str(tmp_path / "c.db"))
    assert r.returncode == 2 and "not a regular file" in one_error_line(r)


def test_a_backend_module_raising_anything_is_one_line(tmp_path):
    (tmp_path / "broken_backends.py").write_text("raise ValueError('boom at import')\n")
    env = {
        "A2A_TUNE_BACKEND_MODULES": "broken_backends",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}",
    }
    r = a2a("backends", "--device", "cpu", env_extra=env)
    assert r.returncode == 2
    assert "cannot import 'broken_backends' (ValueError: boom at import)" in one_error_line(r)


@pytest.mark.parametrize(
    "args",
    [
        ["show", "--db", SECRET_URL],
        ["select", "--db", SECRET_URL],
        ["diff", "--db", SECRET_URL, "--run", "1", "--run", "2"],
        ["report", "--db", SECRET_URL],
        ["db", "upgrade", "--db", SECRET_URL],
        ["sweep", "--device", "cpu", "--tokens", "1", "--no-progress", "--db", SECRET_URL],
    ],
    ids=lambda a: a[0] if a[0] != "db" else "db-upgrade",
)
def test_a_password_is_never_printed(args):
    r = a2a(*args)
    assert r.returncode != 0
    assert "secret" not in r.stdout + r.stderr, r.stderr
    assert "u:***@" in one_error_line(r)


def test_masking_covers_urls_that_do_not_parse():
    from a2a_tune.db import display_url, mask_secrets

    assert display_url(SECRET_URL) == "postgresql+psycopg2://u:***@[::1:5432/x"
    assert mask_secrets(f"cannot parse '{SECRET_URL}' or postgresql://a:p@ss@h/d") == (
        "cannot parse 'postgresql+psycopg2://u:***@[::1:5432/x' or postgresql://a:***@h/d"
    )


# ---------------------------------------------------------------- read-only databases


def _db_with_a_completed_run(path: Path) -> None:
    from a2a_tune.db import open_store

    shape = dict(num_experts=64, topk=8, hidden=7168, dtype="bf16", ep_size=2, routing="uniform")
    with open_store(str(path)) as s:
        hw = s.get_or_create_hardware("h200.nvl18x2.node1", "h", {})
        run = s.start_run(hw, device_type="cuda", world_size=2, versions={}, git_sha=None, config={}, config_hash="c")
        for backend, us in (("allgather_reducescatter", 50.0), ("nccl_all2allv", 40.0)):
            for tokens in (1, 64):
                s.add_measurement(
                    run,
                    backend=backend,
                    tokens_per_rank=tokens,
                    timing="eager",
                    median_us=us * tokens**0.5,
                    p10_us=us * tokens**0.5 * 0.95,
                    p90_us=us * tokens**0.5 * 1.05,
                    n=3,
                    samples=[us] * 3,
                    **shape,
                )
        s.finish_run(run, "completed")


def _read_only(directory: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """Run argv with `directory` read-only: by permissions (not root), else a read-only bind
    mount in a private mount namespace (root ignores permissions)."""
    env = {**os.environ, "COLUMNS": "200"}
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        finally:
            directory.chmod(0o755)
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare(1): cannot make a read-only directory")
    script = (
        'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && touch "$0/probe" 2>/dev/null && exit 99; exec "$@"'
    )
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, str(directory), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if r.returncode == 99 or "unshare:" in r.stderr or "mount:" in r.stderr:
        pytest.skip(f"cannot make a read-only mount here: {r.stderr.strip()[:200]}")
    return r


@pytest.mark.parametrize("command", ["show", "select", "report", "diff"])
def test_a_database_in_a_read_only_directory_is_read(command, tmp_path):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    db = shelf / "runs.db"
    _db_with_a_completed_run(db)
    out = tmp_path / "out"
    out.mkdir()
    cli = [sys.executable, "-m", "a2a_tune.tuner.cli"]
    argv = {
        "show": [*cli, "show", "--db", str(db)],
        "select": [*cli, "select", "--db", str(db), "--out", str(out)],
        "report": [*cli, "report", "--db", str(db), "--out", str(out / "r.html")],
        "diff": [*cli, "diff", str(db), str(db)],
    }[command]
    before = sorted(p.name for p in shelf.iterdir())
    r = _read_only(shelf, argv)
    assert r.returncode == 0, r.stderr
    assert "readonly" not in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in shelf.iterdir()) == before  # nothing created next to it


def test_a_read_only_store_refuses_writes_and_creates_nothing(tmp_path):
    from a2a_tune.db import StoreError, open_store

    with pytest.raises(StoreError, match="no database at .*missing.db"):
        open_store(str(tmp_path / "missing.db"), readonly=True)
    assert not (tmp_path / "missing.db").exists()
    db = tmp_path / "r.db"
    _db_with_a_completed_run(db)
    with open_store(str(db), readonly=True) as s:
        (run,) = s.runs()
        with pytest.raises(StoreError, match="readonly"):
            s.finish_run(run.id, "failed")


# ------------------------------------------------------------------------ first error


def _rank0_late_cause(ctx):
    if ctx.rank == 0:
        time.sleep(1.5)  # its report arrives after the peer's echo
        raise OSError(28, "No space left on device")
    raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242")


def _only_echoes(ctx):
    raise RuntimeError(f"rank {ctx.rank}: Connection reset by peer")


def test_run_ranks_reports_the_cause_before_its_echoes():
    from a2a_tune.tuner.launch import RankFailed, run_ranks

    with pytest.raises(RankFailed) as info:
        run_ranks(_rank0_late_cause, 2, "cpu")
    assert str(info.value) == "rank 0: OSError: [Errno 28] No space left on device"
    with pytest.raises(RankFailed, match="Connection reset by peer"):  # nothing better said: the echo
        run_ranks(_only_echoes, 2, "cpu")
