"""The merged table is a function of its points (issue 35.3-9, 35.18; 36.3): each point keeps
its newest trustworthy measurement, runs are told apart across stores, a run dated in the
future never wins, the provenance lists exactly the runs whose points remain, a table read,
merged and written again is byte-identical, and the file's lock and name are safe to share."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import paths
import pytest

from a2a_tune.tuner.publish import unwritable, write_table
from a2a_tune.tuner.runtime.lookup import clear_cache, lookup
from a2a_tune.tuner.runtime.measurement import Measurement
from a2a_tune.tuner.runtime.profiles import table_lock
from a2a_tune.tuner.runtime.table import Profile, parse_profile, to_json
from a2a_tune.tuner.select import build_profile
from a2a_tune.tuner.tables import merge

FP = "h200.nvl18x8.node1"
SHAPE = dict(ep_size=4, hidden=64, topk=2, num_experts=8, dtype="bf16", routing="uniform")
B = ("allgather_reducescatter", "nccl_all2allv")


def table(run_id, started: str, curves: dict, *, status="completed") -> Profile:
    """One run's table: backend -> {tokens: median µs} at SHAPE."""
    measured = [
        Measurement.from_columns(
            dict(SHAPE, backend=b, tokens_per_rank=t, median_us=us, p10_us=us * 0.99, p90_us=us * 1.01)
        )
        for b, points in curves.items()
        for t, us in points.items()
    ]
    return build_profile(
        measured,
        [],
        hardware={"fingerprint": FP, "facts_hash": "0" * 16, "facts": {}},
        run={"id": run_id, "device_type": "cuda", "world_size": 8, "versions": {}, "started_at": started},
        backend_names={b: {"engines": {"vllm": b}} for b in B},
        status=status,
        generated_at="2026-12-07T12:00:00Z",
    )


def runs(profile: Profile) -> list:
    (e,) = profile.entries
    return [(p["run"], p["date"][:4]) for p in e.provenance]


def curve(profile: Profile, backend: str = B[0]) -> dict:
    (e,) = profile.entries
    return {t: v for t, v in zip(e.tokens, e.median_us[backend]) if v is not None}


def reread(profile: Profile) -> Profile:
    return parse_profile(json.loads(to_json(profile)))


def test_reselecting_a_run_keeps_the_other_runs_points():
    """35.3: --tokens 1 then --tokens 8 into one store; select run 1, run 2, then a plain
    select (run 2 again, the newest), and run 1 again."""
    one = table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0}})
    two = table(2, "2026-12-01T11:00:00Z", {B[0]: {8: 20.0}})
    merged = reread(merge(reread(one), two))
    for selected in (two, one):
        again = reread(merge(merged, selected))
        assert curve(again) == {1: 10.0, 8: 20.0}
        assert runs(again) == [(2, "2026"), (1, "2026")]
        assert again.entries == merged.entries  # re-selecting a run changes nothing of the others


def test_run_1_of_another_store_is_another_run():
    """35.4: a run is its id and its start, not its id alone."""
    here = table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0, 8: 30.0}})
    there = table(1, "2026-12-02T10:00:00Z", {B[0]: {8: 25.0, 64: 90.0}})
    merged = reread(merge(reread(here), there))
    assert curve(merged) == {1: 10.0, 8: 25.0, 64: 90.0}
    (e,) = merged.entries
    assert [p["date"] for p in e.provenance] == ["2026-12-02T10:00:00Z", "2026-12-01T10:00:00Z"]
    assert e.origin_of(B[0]) == (1, 0, 0)


def test_a_run_dated_in_the_future_never_wins_and_is_warned_about(caplog):
    """35.5: run 1 dated 2099 measured 4870 µs; run 2 (today) 2133 µs at the same point."""
    future = table(1, "2099-01-01T00:00:00Z", {B[0]: {1: 4870.0, 8: 5000.0}})
    today = table(2, "2026-12-01T11:00:00Z", {B[0]: {1: 2133.0}})
    for merged in (merge(reread(future), today), merge(reread(today), future)):
        assert curve(merged) == {1: 2133.0, 8: 5000.0}  # its points only where no other run measured
    assert "run 1 is dated 2099-01-01T00:00:00Z, after now" in caplog.text
    alone = merge(reread(future), table(2, "2026-12-01T11:00:00Z", {B[0]: {1: 2133.0, 8: 2200.0}}))
    assert runs(alone) == [(2, "2026")]  # none of run 1's points remain: not in the provenance


def test_the_provenance_lists_exactly_the_runs_whose_points_remain_and_partial_follows_it():
    """35.6: a completed run re-measuring every point of an interrupted one clears PARTIAL."""
    cut = table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0, 8: 20.0}}, status="interrupted")
    some = reread(merge(reread(cut), table(2, "2026-12-01T11:00:00Z", {B[0]: {1: 11.0}})))
    assert runs(some) == [(2, "2026"), (1, "2026")] and some.partial_runs() == (1,)
    every = reread(merge(some, table(3, "2026-12-01T12:00:00Z", {B[0]: {8: 21.0}})))
    assert runs(every) == [(3, "2026"), (2, "2026")] and every.partial_runs() == ()
    assert curve(every) == {1: 11.0, 8: 21.0}


def test_a_failure_stays_until_a_newer_run_measures_it_there_and_keeps_its_run():
    from a2a_tune.tuner.select import FailureRow

    incorrect = FailureRow(**SHAPE, backend=B[1], kind="incorrect", reason="wrong sums", tokens_per_rank=8)
    old = build_profile(
        [
            Measurement.from_columns(dict(SHAPE, backend=b, tokens_per_rank=t, median_us=10.0 + t))
            for b in B
            for t in (1, 8)
        ],
        [incorrect],
        hardware={"fingerprint": FP, "facts_hash": "0" * 16, "facts": {}},
        run={"id": 1, "device_type": "cuda", "world_size": 8, "versions": {}, "started_at": "2026-12-01T10:00:00Z"},
        backend_names={},
    )
    elsewhere = reread(merge(reread(old), table(2, "2026-12-01T11:00:00Z", {B[0]: {1: 5.0, 8: 5.0}})))
    (e,) = elsewhere.entries
    assert e.failed[B[1]].kind == "incorrect" and e.provenance[e.failed_origin[B[1]]]["run"] == 1
    there = merge(elsewhere, table(3, "2026-12-01T12:00:00Z", {B[1]: {8: 4.0}}))
    assert B[1] not in there.entries[0].failed


def test_a_table_read_merged_and_written_again_is_byte_identical(tmp_path):
    """36.3: the typed table from select to file and back; a merge that adds nothing adds no byte."""
    one = table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0}, B[1]: {1: 12.0, 8: 30.0}})
    write_table(one, str(tmp_path))
    path = write_table(table(2, "2026-12-01T11:00:00Z", {B[0]: {8: 20.0}}), str(tmp_path))
    text = path.read_text()
    read = parse_profile(json.loads(text))
    assert to_json(read) == text
    assert to_json(merge(read, read)) == text
    assert '"from": [1, 0]' in text  # which run each point of a merged entry comes from
    assert write_table(read, str(tmp_path)).read_text() == text


def test_a_sweep_stored_before_the_change_reselects_to_the_same_table(tmp_path):
    """36.3: the committed schema-2 store's run, selected today, gives the table select wrote
    for it before the typed table (tests/fixtures/db/schema2.selected.json, written by the
    commit before it), byte for byte apart from the date and the engines' literals."""
    from typer.testing import CliRunner

    from a2a_tune.db.engine import upgrade
    from a2a_tune.tuner.cli import app

    db = tmp_path / "schema2.db"
    shutil.copy(paths.FIXTURES / "db" / "schema2.db", db)
    upgrade(str(db))  # `a2a-tune db upgrade`
    r = CliRunner().invoke(app, ["select", "--db", str(db), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    (written,) = (tmp_path / "out").glob("*.json")
    expected = (paths.FIXTURES / "db" / "schema2.selected.json").read_text()

    def undated(text: str) -> list:
        """The lines apart from the date and the engines' literals of today's backends (which
        change as engines add them, not as select does)."""
        lines, inside = [], False
        for line in text.splitlines():
            inside = (inside or line == '  "backends": {') and line != "  },"
            if not inside and '"generated_at"' not in line and line != "  },":
                lines.append(line)
        return lines

    assert undated(written.read_text()) == undated(expected)
    assert len(undated(expected)) > 40


def test_a_second_unreadable_table_keeps_the_first_and_a_newer_schema_says_upgrade(tmp_path, caplog):
    """35.7: each unreadable table gets a name of its own."""
    target = tmp_path / f"{FP}.json"
    target.write_text('{"schema": 5, "entries": "from a newer a2a-tune"}')
    write_table(table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0}}), str(tmp_path))
    assert "upgrade a2a-tune" in caplog.text and "regenerate" not in caplog.text
    target.write_text("{ truncated")
    write_table(table(2, "2026-12-01T11:00:00Z", {B[0]: {1: 10.0}}), str(tmp_path))
    kept = sorted(p.name for p in tmp_path.glob("*.unreadable*"))
    assert kept == [f"{FP}.json.unreadable", f"{FP}.json.unreadable.1"]
    assert (tmp_path / kept[0]).read_text().startswith('{"schema": 5')
    assert (tmp_path / kept[1]).read_text() == "{ truncated"


def test_a_symlinked_table_is_written_through_to_its_target(tmp_path):
    """35.18: the link stays a link; its target holds the new table."""
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / "machine.json"
    write_table(table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0}}), str(shared))
    (shared / f"{FP}.json").rename(real)
    link = tmp_path / f"{FP}.json"
    link.symlink_to(real)
    write_table(table(2, "2026-12-01T11:00:00Z", {B[0]: {8: 20.0}}), str(tmp_path))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert curve(parse_profile(json.loads(real.read_text()))) == {1: 10.0, 8: 20.0}
    clear_cache()
    assert lookup(profile=link, tokens=8, **SHAPE).match == "exact"


def test_the_lock_is_taken_read_only_and_created_readable_by_all(tmp_path):
    """35.8: flock needs no write access; a umask of 077 must not lock the next operator out."""
    old = os.umask(0o077)
    try:
        with table_lock(tmp_path, FP) as lock:
            assert fcntl.fcntl(lock.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
            assert os.stat(lock.path).st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second operator")
def test_another_operator_who_can_write_the_directory_can_take_the_lock_and_write():
    """35.8: the first operator's lock file (0644, not theirs) must not stop a second one."""
    directory = Path(tempfile.mkdtemp(prefix="a2a-tune-shared-"))
    try:
        directory.chmod(0o777)  # a shared profile directory
        write_table(table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0}}), str(directory))
        assert unwritable(directory) == ""
        pid = os.fork()
        if pid == 0:  # the second operator
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                write_table(table(2, "2026-12-01T11:00:00Z", {B[0]: {8: 20.0}}), str(directory))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert curve(parse_profile(json.loads((directory / f"{FP}.json").read_text()))) == {1: 10.0, 8: 20.0}
    finally:
        shutil.rmtree(directory)


def test_runs_writability_check_opens_the_lock_files_as_the_writer_does(tmp_path):
    """35.8: a lock file the writer could not open fails `run`'s check before the sweep."""
    (tmp_path / f".{FP}.json.lock").symlink_to(tmp_path / "gone" / "lock")
    assert "cannot open the lock file" in unwritable(tmp_path)


def test_tune_knobs_writes_the_table_under_its_lock(tmp_path):
    """35.9: the knobs are read, added and written while holding the table's lock."""
    from a2a_tune.tuner.select import write_knobs_into

    path = write_table(table(1, "2026-12-01T10:00:00Z", {B[0]: {1: 10.0, 8: 20.0}}), str(tmp_path))
    before = path.read_text()
    done = threading.Event()

    def add() -> None:
        write_knobs_into(path, SHAPE, B[0], {8: {"chunk": 2}})
        done.set()

    with table_lock(tmp_path, FP):  # a select or run writing at the same time
        writer = threading.Thread(target=add)
        writer.start()
        time.sleep(0.5)
        assert not done.is_set() and path.read_text() == before
    writer.join(30)
    assert done.is_set()
    (e,) = parse_profile(json.loads(path.read_text())).entries
    assert [k and dict(k) for k in e.knobs[B[0]]] == [None, {"chunk": 2}]


def test_select_warns_of_a_run_dated_in_the_future(tmp_path, caplog):
    """35.5: the run's own clock was wrong: said when it is selected, not only when merged."""
    import sqlite3

    from stored import measurement, new_run

    from a2a_tune.db import open_store
    from a2a_tune.tuner.select import profile_for_run

    db = tmp_path / "runs.db"
    with open_store(str(db)) as s:
        _, run = new_run(s)
        s.add_measurement(run, measurement(backend=B[0], median_us=20.0, p10_us=19.0, p90_us=21.0, knobs={}))
        s.finish_run(run, "completed")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET started_at = '2099-01-01 00:00:00.000000'")
    profile, _, _ = profile_for_run(str(db), run)
    assert profile.entries[0].provenance[0]["date"] == "2099-01-01T00:00:00Z"
    assert f"run {run} is dated 2099-01-01T00:00:00Z, after now" in caplog.text
