"""A run has one writer: the lease (a2a_tune.db.lease), its fence on every write, its heartbeat.

Run on an SQLite file and, when $A2A_TUNE_TEST_POSTGRES_URL names a server whose user may
create databases, on a fresh PostgreSQL database too (the `db_url` fixture).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa

from a2a_tune.db import LeaseHeartbeat, LeaseLostError, RunBusyError, StoreError, Writer, open_store
from a2a_tune.db.models import Run
from a2a_tune.tuner.runtime.measurement import Measurement

SHAPE = dict(num_experts=8, topk=2, hidden=16, dtype="bf16", ep_size=2, routing="uniform")


def _start(store, writer=None) -> int:
    hw = store.get_or_create_hardware("cpu-x86_64.node1", "h", {})
    return store.start_run(
        hw,
        device_type="cpu",
        world_size=2,
        versions={},
        git_sha=None,
        config={},
        config_hash="c",
        writer=writer,
    )


def _measure(store, run, writer, tokens=1, backend="allgather_reducescatter"):
    return store.add_measurement(
        run,
        Measurement.from_columns(
            dict(
                backend=backend,
                tokens_per_rank=tokens,
                timing="eager",
                median_us=10.0,
                p10_us=9.0,
                p90_us=11.0,
                n=3,
                samples=[9.0, 10.0, 11.0],
                **SHAPE,
            )
        ),
        writer=writer,
    )


def _age_heartbeat(store, run, seconds):
    """Make the holder's last heartbeat `seconds` old (as if it went silent then)."""
    with store._engine.begin() as conn:
        old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)
        conn.execute(sa.update(Run).where(Run.id == run).values(heartbeat_at=old))


def _elsewhere() -> Writer:
    """A live writer on another host: only its heartbeat can say it died."""
    return dataclasses.replace(Writer.this_process(), host="other-node", pid=4242, scope="another-boot:1")


def test_a_live_writer_keeps_its_run_and_the_refusal_names_it(db_url):
    first, second = _elsewhere(), Writer.this_process()
    with open_store(db_url) as store:
        run = _start(store, first)
        with pytest.raises(RunBusyError) as info:
            store.claim_run(run, second)
        message = str(info.value)
        assert "\n" not in message
        assert f"run {run} is being written" in message and "host other-node" in message and "pid 4242" in message
        assert "since 20" in message and "last heartbeat 0 s ago" in message
        # without a writer, nothing may be written to a held run either
        with pytest.raises(RunBusyError):
            _measure(store, run, None)
        with pytest.raises(RunBusyError):
            store.finish_run(run, "failed")
        _measure(store, run, first)
        record = store.get_run(run)
        assert (record.status, record.writer_host, record.writer_pid) == ("running", "other-node", 4242)


def test_a_stale_writer_is_taken_over_and_then_changes_nothing(db_url):
    old, new = _elsewhere(), Writer.this_process()
    with open_store(db_url) as store:
        run = _start(store, old)
        _measure(store, run, old, tokens=1)
        _age_heartbeat(store, run, 30)
        with pytest.raises(RunBusyError):
            store.claim_run(run, new, stale_after=60)  # 30 s silent: not yet dead
        _age_heartbeat(store, run, 61)
        store.claim_run(run, new, stale_after=60)
        assert store.get_run(run).writer_host == new.host
        # the old writer wakes up: none of its writes land, its verdict least of all
        with pytest.raises(LeaseLostError, match="no longer held"):
            _measure(store, run, old, tokens=2)
        with pytest.raises(LeaseLostError):
            store.add_failure(run, backend="x", kind="error", reason="late", writer=old)
        with pytest.raises(LeaseLostError):
            store.finish_run(run, "failed", writer=old)
        with pytest.raises(LeaseLostError):
            store.heartbeat(run, old)
        assert store.get_run(run).status == "running"
        assert [m.tokens_per_rank for m in store.measurements(run)] == [1]
        assert store.failures(run) == []
        _measure(store, run, new, tokens=2)
        store.finish_run(run, "completed", writer=new)
        record = store.get_run(run)
        assert record.status == "completed" and record.writer_host is None  # released
        with pytest.raises(StoreError, match="completed: nothing to resume"):
            store.claim_run(run, old)


def test_a_dead_writer_on_this_host_is_taken_over_at_once(db_url):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: its pid names no process
    dead = dataclasses.replace(Writer.this_process(), pid=child.pid)
    with open_store(db_url) as store:
        run = _start(store, dead)
        me = Writer.this_process()
        store.claim_run(run, me)  # heartbeat fresh, but the pid is gone
        assert store.get_run(run).writer_pid == os.getpid()
        # the same pid in another boot or PID namespace proves nothing: the heartbeat decides
        store.finish_run(run, "interrupted", writer=me)
        run2 = _start(store, dataclasses.replace(dead, scope="another-boot:1"))
        with pytest.raises(RunBusyError):
            store.claim_run(run2, me)


def test_restarted_ranks_keep_their_run_and_its_since(db_url):
    me = Writer.this_process()
    with open_store(db_url) as store:
        run = _start(store, me)
        since = store.get_run(run).writer_since
        time.sleep(0.01)
        store.claim_run(run, me)  # the same writer again (its ranks restarted after a stall)
        record = store.get_run(run)
        assert record.writer_since == since and record.heartbeat_at > since


def test_runs_without_a_writer_stay_writable_by_anyone(db_url):
    with open_store(db_url) as store:
        run = _start(store)  # no lease: library use, and runs stored before the lease existed
        _measure(store, run, None)
        store.finish_run(run, "interrupted")
        me = Writer.this_process()
        store.claim_run(run, me)
        with pytest.raises(RunBusyError):
            store.finish_run(run, "failed")
        store.finish_run(run, "completed", writer=me)
        assert store.get_run(run).status == "completed"


def test_heartbeat_keeps_the_run_fresh_and_notices_a_takeover(db_url):
    me, other = Writer.this_process(), _elsewhere()
    with open_store(db_url) as store:
        run = _start(store, me)
        _age_heartbeat(store, run, 50)
        with LeaseHeartbeat(store, run, me, interval=0.05) as beat:
            deadline = time.monotonic() + 10
            while store.get_run(run).heartbeat_at < dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5):
                assert time.monotonic() < deadline, "no heartbeat"
                time.sleep(0.05)
            assert beat.lost is None
            # Taken over (any silence counts as stale here). The claim compares and swaps the
            # heartbeat it read: a beat landing in between makes it fail, so it tries again.
            while True:
                try:
                    store.claim_run(run, other, stale_after=-1)
                    break
                except RunBusyError:
                    assert time.monotonic() < deadline, "never taken over"
            while beat.lost is None:
                assert time.monotonic() < deadline, "the lost lease went unnoticed"
                time.sleep(0.05)
        assert "no longer held" in beat.lost
        assert store.get_run(run).writer_host == "other-node"


def test_two_takeovers_at_once_leave_one_writer(db_url):
    with open_store(db_url) as store:
        run = _start(store, _elsewhere())
        _age_heartbeat(store, run, 3600)
    contenders = [Writer.this_process() for _ in range(4)]
    won, lost, go = [], [], threading.Barrier(len(contenders))

    def take(writer):
        with open_store(db_url) as store:
            go.wait()
            try:
                store.claim_run(run, writer)
                won.append(writer)
            except RunBusyError:
                lost.append(writer)

    threads = [threading.Thread(target=take, args=(w,)) for w in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 1 and len(lost) == 3
    with open_store(db_url) as store:
        _measure(store, run, won[0])
        for loser in lost:
            with pytest.raises(LeaseLostError):
                _measure(store, run, loser, tokens=2)
