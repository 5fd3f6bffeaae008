"""A sweep survives a hung backend and a SIGKILL, and loses and repeats nothing."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

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
        ep_sizes=(2,),
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


SWEEP_ARGS = (
    "sweep --device cpu --world 2 --preset mixtral-8x7b --preset gpt-oss-120b --tokens 1,2,4,8,16,32 "
    "--warmup 0 --iters 3 --no-progress --backend allgather_reducescatter --backend nccl_all2allv"
).split()


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


def _foreground(cmd: list[str], env: dict | None = None) -> subprocess.Popen:
    """`cmd` as a terminal's foreground job runs: its own process group, and the default SIGINT
    disposition (a shell running the suite in the background ignores SIGINT; children inherit it)."""
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_stored(db, n: int, proc: subprocess.Popen, poll: float = 0.2) -> None:
    """Until `db` holds `n` measurements, `proc` ended, or 4 minutes passed."""
    deadline = time.monotonic() + 240
    while _count(db) < n and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(poll)


def test_ctrl_c_stops_cleanly_with_a_summary_of_what_is_stored(tmp_path):
    db = tmp_path / "int.db"
    slow = list(SWEEP_ARGS)
    slow[slow.index("--iters") + 1] = "40"  # 40 timed samples a case: the signal lands mid-run
    slow += ["--backend", "nvlink_one_sided"]  # cannot run on CPU ranks: not among the planned cases
    cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *slow, "--db", str(db)]
    first = _foreground(cmd)
    _wait_stored(db, 3, first, poll=0.05)
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


# ----------------------------------------------------------------- one writer, no orphans

GATED_ARGS = (
    "sweep --device cpu --world 2 --preset mixtral-8x7b --tokens 1,2 --warmup 0 --iters 2 --no-progress "
    "--backend allgather_reducescatter --backend planted_gate"
).split()


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (the spawned ranks, and multiprocessing's helpers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gated_sweep(tmp_path, db):
    """A sweep held at planted_gate (after one allgather measurement) until the gate file goes."""
    gate = tmp_path / "gate"
    gate.touch()
    env = {**os.environ, "A2A_TUNE_BACKEND_MODULES": "planted_backends", "A2A_TUNE_TEST_GATE": str(gate)}
    cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *GATED_ARGS, "--db", str(db)]
    proc = _foreground(cmd, env)
    _wait_stored(db, 1, proc)
    assert proc.poll() is None and _count(db) == 1, "the sweep should wait at the gate"
    ranks = [p for p in _children(proc.pid) if "spawn_main" in open(f"/proc/{p}/cmdline").read()]
    assert len(ranks) == 2, ranks
    return proc, ranks, gate, cmd, env


def _wait_gone(pids, seconds=30):
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_resume_refuses_a_live_sweep_and_takes_over_a_killed_one(tmp_path):
    db = tmp_path / "race.db"
    first, ranks, gate, cmd, env = _gated_sweep(tmp_path, db)
    try:
        # A second sweep asked to resume the run the first one is writing: refused, in one line.
        second = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 1
        message = " ".join(second.stderr.split())
        assert "run 1 is being written by another process" in message, second.stderr
        assert f"pid {first.pid}" in message and "since 20" in message and "Traceback" not in second.stderr
        with open_store(f"sqlite:///{db}") as store:
            (run,) = store.runs()
            assert (run.status, run.writer_pid) == ("running", first.pid)  # untouched by the loser

        # kill -9 of the sweep alone (what the OOM killer does): its ranks go with it.
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert _wait_gone(ranks) == [], "ranks outlived the sweep that started them"
        assert _count(db) == 1

        # The run is resumable at once (its writer is dead on this host) and nothing is measured twice.
        gate.unlink()
        third = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
        assert third.returncode == 0, third.stderr
        assert "1 already stored" in third.stdout and "3 measured" in third.stdout
        with open_store(f"sqlite:///{db}") as store:
            (run,) = store.runs()
            assert run.status == "completed" and run.writer_pid is None
            keys = [m.key for m in store.measurements(run.id)]
        assert len(keys) == len(set(keys)) == 4
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.communicate()


@pytest.mark.parametrize(
    "name, code, group",
    [
        ("SIGTERM", 143, False),  # to the sweep only, not its process group
        ("SIGHUP", 129, True),  # a closed terminal or SSH session: the whole foreground group (issue 31.6)
    ],
)
def test_sigterm_and_sighup_stop_the_ranks_and_leave_the_run_resumable(tmp_path, monkeypatch, name, code, group):
    db = tmp_path / "term.db"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with monkeypatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))  # the sweep's, inherited: nothing may be left there
        first, ranks, gate, cmd, env = _gated_sweep(tmp_path, db)
    try:
        sig = getattr(signal, name)
        os.killpg(first.pid, sig) if group else first.send_signal(sig)
        _, err = first.communicate(timeout=60)
        assert first.returncode == code, err
        assert _wait_gone(ranks) == []
        line = " ".join(err.split())
        assert f"interrupted ({name})" in line and "run 1 holds 1 of 4 planned measurements" in line, err
        assert "Traceback" not in err
        with open_store(f"sqlite:///{db}") as store:
            (run,) = store.runs()
            assert run.status == "interrupted" and run.writer_pid is None
        assert list(tmp.iterdir()) == []
        gate.unlink()
        again = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr
        assert "1 already stored" in again.stdout and "3 measured" in again.stdout
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()


def test_the_reported_error_is_rank_0s_cause_not_its_peers_echo(tmp_path, monkeypatch):
    """The disk under the store fills up after the first measurement (planted_disk_full: the
    store's write raises ENOSPC on rank 0 only): the error is rank 0's, the run is failed and
    released, and the measurement written before it is kept."""
    from a2a_tune.tuner.launch import RankFailed

    monkeypatch.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
    url = f"sqlite:///{tmp_path / 'full.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(1, 2, 4),
        ep_sizes=(2,),
        backends=("planted_disk_full",),
        warmup=0,
        iters=2,
        input_sets=1,
    )
    with pytest.raises(RankFailed) as info:
        sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False)
    assert str(info.value) == "rank 0: OSError: [Errno 28] No space left on device"
    _assert_failed_and_released(url)
    with open_store(url) as store:
        (run,) = store.runs()
        assert [(m.backend, m.tokens_per_rank) for m in store.measurements(run.id)] == [("planted_disk_full", 1)]


def _assert_failed_and_released(url: str) -> None:
    with open_store(url) as store:
        (run,) = store.runs()
        assert run.status == "failed" and run.writer_pid is None


CRASHERS = {  # planted backend -> how its rank 1 ended, as the failure row says
    "planted_exit": "rank 1 exited with code 3",
    "planted_abort": "rank 1 was killed by SIGABRT",
    "planted_sigkill": "rank 1 was killed by SIGKILL",
}


def test_a_rank_that_dies_in_a_case_is_recorded_and_the_run_finishes(tmp_path, monkeypatch):
    """os._exit, abort() and SIGKILL on rank 1 inside dispatch: each is recorded against its
    backend, the ranks restart without it, the backend after them is measured and the run
    completes; --resume then has nothing to do, and a resumed unfinished run leaves them out."""
    monkeypatch.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(2, 4),
        ep_sizes=(2,),
        backends=(*CRASHERS, "allgather_reducescatter"),
        warmup=1,
        iters=2,
        input_sets=1,
    )
    outcome = sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False)
    assert outcome.status == "completed"
    assert outcome.failed.get("crashed") == 3
    for backend, how in CRASHERS.items():
        assert outcome.infeasible[backend].startswith(f"crashed at 2 tokens/rank ({how}")
    with open_store(url) as store:
        (run,) = store.runs()
        assert run.status == "completed" and run.id == outcome.run_id and run.writer_pid is None
        measured = {(m.backend, m.tokens_per_rank) for m in store.measurements(run.id)}
        assert measured == {("allgather_reducescatter", 2), ("allgather_reducescatter", 4)}
        crashed = {f.backend: f for f in store.failures(run.id) if f.kind == "crashed"}
        assert set(crashed) == set(CRASHERS)
        for backend, how in CRASHERS.items():
            assert crashed[backend].tokens_per_rank == 2 and crashed[backend].reason.startswith(how)
        rows = len(store.failures(run.id))

    again = sweep(plan, device_type="cpu", world_size=2, db_url=url, resume=True, progress=False)
    assert (again.run_id, again.status, again.measured, again.skipped) == (run.id, "completed", 0, 2 + 3)
    with open_store(url) as store:
        (same,) = store.runs()
        assert same.finished_at == run.finished_at and len(store.failures(run.id)) == rows
        store.finish_run(run.id, "interrupted")  # as if stopped: its crashers' later points are not done

    resumed = sweep(plan, device_type="cpu", world_size=2, db_url=url, resume=True, progress=False)
    assert (resumed.run_id, resumed.status, resumed.measured) == (run.id, "completed", 0)
    assert all(resumed.infeasible[b].startswith("crashed at 2 tokens/rank") for b in CRASHERS)
    with open_store(url) as store:
        assert len(store.failures(run.id)) == rows  # the crashers were not started again


def test_a_rank_killed_outside_any_case_fails_the_run_and_releases_it(tmp_path, monkeypatch):
    """SIGKILL of rank 0 (the writer) after it opened the run, before any case: nothing to
    blame, so the sweep stops in one line; the run is "failed", not left "running" and held."""
    from a2a_tune.tuner.launch import RankCrashed

    monkeypatch.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
    monkeypatch.setenv("A2A_TUNE_TEST_KILL_RANK0", "1")
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(2,),
        ep_sizes=(2,),
        backends=("planted_kill_rank0",),
        warmup=0,
        iters=1,
    )
    with pytest.raises(RankCrashed) as info:
        sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False)
    assert str(info.value) == "rank 0: process was killed by SIGKILL (out of memory?)"
    _assert_failed_and_released(url)


# ----------------------------------------------------------------- a store that goes away

VANISH_ARGS = [*GATED_ARGS[:-1], "planted_store_vanishes"]  # the gate backend swapped for one that takes the store


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_store_deleted_or_replaced_mid_sweep_stops_it_in_one_line(tmp_path, how):
    from run_cli import a2a

    db = tmp_path / "v.db"
    env = {"A2A_TUNE_BACKEND_MODULES": "planted_backends", "A2A_TUNE_TEST_VANISH": str(db)}
    if how == "replaced":
        other = tmp_path / "other.db"
        with open_store(str(other)) as store:  # someone else's store, put in the sweep's place
            store.get_or_create_hardware("elsewhere", "h", {})
        env["A2A_TUNE_TEST_VANISH_WITH"] = str(other)
    r = a2a(*VANISH_ARGS, "--db", str(db), env_extra=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "completed" not in r.stdout and not re.search(
        r"\d+ measured", r.stdout
    )  # nothing reported that nothing holds
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    how_said = "another file was put in its place" if how == "replaced" else "it was deleted or moved away"
    assert f"{db} is no longer the file this process opened ({how_said})" in lines[0]
    assert f"what this sweep measured is not in {db}" in lines[0]
    if how == "replaced":
        with sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True) as con:  # the file itself, as it was put there
            assert con.execute("select count(*) from runs").fetchone() == (0,)
        con.close()
    else:
        assert not db.exists()


@pytest.mark.skipif(not os.environ.get("A2A_TUNE_TEST_POSTGRES_URL"), reason="no PostgreSQL server")
def test_a_postgres_server_lost_mid_sweep_says_so_and_resume_continues(tmp_path):
    import sqlalchemy as sa
    from databases import fresh_postgres_database, measurement_count
    from tcp_proxy import Proxy

    from a2a_tune.db import resolve_url

    gate = tmp_path / "gate"
    gate.touch()
    env = {**os.environ, "A2A_TUNE_BACKEND_MODULES": "planted_backends", "A2A_TUNE_TEST_GATE": str(gate)}
    with fresh_postgres_database(os.environ["A2A_TUNE_TEST_POSTGRES_URL"]) as url:
        server = sa.engine.make_url(resolve_url(url))
        proxy = Proxy(server.host, server.port)  # the sweep's way to the server, cut below
        via = server.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", *GATED_ARGS, "--db", via]
        sweep = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 240
            while measurement_count(url) < 1 and time.monotonic() < deadline and sweep.poll() is None:
                time.sleep(0.2)
            assert sweep.poll() is None and measurement_count(url) == 1, "the sweep should wait at the gate"
            proxy.cut()  # the server is gone for the sweep: its connections drop, new ones are refused
            gate.unlink()
            _, err = sweep.communicate(timeout=120)
        finally:
            if sweep.poll() is None:
                sweep.kill()
                sweep.communicate()
        assert sweep.returncode == 1
        line = " ".join(err.split())
        assert "Traceback" not in err and "cannot open database" not in line, err
        assert "lost the connection to the database server" in line and "mid-sweep" in line, err
        assert "run 1 keeps what was stored: rerun the same command with --resume to continue" in line
        assert server.password not in err

        # the server answers again: --resume continues the run, nothing measured twice
        again = subprocess.run([*cmd[:-1], url, "--resume"], env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr
        assert "1 already stored" in again.stdout and "3 measured" in again.stdout
        with open_store(url) as store:
            (run,) = store.runs()
            keys = [m.key for m in store.measurements(run.id)]
        assert run.status == "completed" and len(keys) == len(set(keys)) == 4
