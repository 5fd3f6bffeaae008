"""A sweep survives a hung backend and a SIGKILL, and loses and repeats nothing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

from a2a_tune.db import open_store
from a2a_tune.tuner.shapes import ModelShape
from a2a_tune.tuner.sweep import SweepPlan, sweep


def test_a_hung_backend_times_out_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
    monkeypatch.setenv("A2A_TUNE_COLLECTIVE_TIMEOUT_S", "600")  # the watchdog must act, not gloo's timeout
    url = f"sqlite:///{tmp_path / 'hang.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(2, 4),
        backends=("planted_hang", "allgather_reducescatter"),
        warmup=1,
        iters=2,
        input_sets=1,
    )
    start = time.monotonic()
    outcome = sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False, case_timeout=6)
    assert time.monotonic() - start < 240  # the 6 s watchdog acted, not the 600 s collective timeout
    assert outcome.status == "completed"
    assert outcome.failed.get("timeout") == 1
    assert "timed out at 2 tokens/rank" in outcome.infeasible["planted_hang"]
    with open_store(url) as store:
        (run,) = store.runs()
        assert run.status == "completed" and run.id == outcome.run_id
        measured = {(m.backend, m.tokens_per_rank) for m in store.measurements(run.id)}
        assert measured == {("allgather_reducescatter", 2), ("allgather_reducescatter", 4)}
        (timeout,) = [f for f in store.failures(run.id) if f.kind == "timeout"]
        assert timeout.backend == "planted_hang" and timeout.tokens_per_rank == 2
        assert "no progress for 6 s" in timeout.reason


def _count(db) -> int:
    try:
        with sqlite3.connect(db) as c:
            return c.execute("select count(*) from measurements").fetchone()[0]
    except sqlite3.Error:
        return 0


SWEEP_ARGS = [
    "sweep",
    "--device",
    "cpu",
    "--world",
    "2",
    "--preset",
    "mixtral-8x7b",
    "--preset",
    "gpt-oss-120b",
    "--tokens",
    "1,2,4,8,16,32",
    "--warmup",
    "0",
    "--iters",
    "3",
    "--no-progress",
    "--backend",
    "allgather_reducescatter",
    "--backend",
    "nccl_all2allv",
]


def test_sigkill_halfway_then_resume_loses_and_repeats_nothing(tmp_path):
    db = tmp_path / "kill.db"
    cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *SWEEP_ARGS, "--db", str(db)]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while _count(db) < 5 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the sweep and its ranks, mid-run
    first.wait()
    killed_at = _count(db)
    assert 5 <= killed_at < 24, "the kill should land halfway"

    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{killed_at} already stored" in again.stdout and f"{24 - killed_at} measured" in again.stdout
    with open_store(f"sqlite:///{db}") as store:
        (run,) = store.runs()  # resumed, not a second run
        assert run.status == "completed"
        keys = [m.key for m in store.measurements(run.id)]
    assert len(keys) == len(set(keys)) == 24  # 2 shapes x 6 token counts x 2 backends, each once


def test_ctrl_c_stops_cleanly_with_a_summary_of_what_is_stored(tmp_path):
    db = tmp_path / "int.db"
    slow = list(SWEEP_ARGS)
    slow[slow.index("--iters") + 1] = "40"  # 40 timed samples a case: the signal lands mid-run
    cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *slow, "--db", str(db)]
    # A shell running the suite in the background ignores SIGINT, and children inherit that:
    # give the sweep the default disposition a terminal's foreground job has.
    first = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while _count(db) < 3 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert first.poll() is None, "the sweep ended before it could be interrupted"
    os.killpg(first.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130
    stored = _count(db)
    line = " ".join(err.split())
    assert f"run 1 holds {stored} of 24 planned measurements" in line, err
    assert "--resume" in line and "Traceback" not in err
    with open_store(f"sqlite:///{db}") as store:
        (run,) = store.runs()
        assert run.status == "interrupted"
