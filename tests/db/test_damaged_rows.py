"""A store damaged by hand edits, other tools or half-restored backups (issue 31.4): the read-only
views get one line naming the run, the row and the field; a damaged measurement is left out with
a warning, a damaged run is refused (exit 2). The store refuses non-positive times on write."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from types import SimpleNamespace

import pytest
from bad_tables import FIXTURE
from run_cli import a2a
from stored import measurement

from a2a_tune.db import StoreError, open_store
from a2a_tune.tuner.evaluate import evaluate

SHAPE = dict(num_experts=64, topk=6, hidden=4096, dtype="bf16", ep_size=2, routing="uniform")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("damage") / "base.db"
    with open_store(str(path)) as s:
        hw = s.get_or_create_hardware("test.fixture.node1", "abc", {"gpus": []})
        rid = s.start_run(hw, device_type="cpu", world_size=2, versions={}, git_sha=None, config={}, config_hash="h")
        for b, v in (("allgather_reducescatter", 10.0), ("nccl_all2allv", 20.0)):
            for t in (1, 64):
                us = v * t
                s.add_measurement(rid, _measured(b, t, us))
        s.finish_run(rid, "completed")
    return path


def _measured(backend: str, tokens: int, us: float, **over):
    fields = dict(median_us=us, p10_us=0.9 * us, p90_us=1.1 * us, samples=[us] * 3, n=3)
    return measurement(backend=backend, tokens_per_rank=tokens, **{**fields, **over})


def _damaged(base, tmp_path, sql: str) -> str:
    path = tmp_path / "damaged.db"
    shutil.copy(base, path)
    with sqlite3.connect(path) as c:
        c.execute(sql)
    return str(path)


@pytest.mark.parametrize(
    "sql, field",
    [
        ("update measurements set median_us = 'abc' where id = 2", "median_us"),
        ("update measurements set samples = '{{{' where id = 2", "samples"),
        ("update measurements set median_us = 0, p10_us = 0 where id = 2", "median_us"),
    ],
)
def test_a_damaged_measurement_is_left_out_with_a_warning_naming_it(base, tmp_path, caplog, sql, field):
    with caplog.at_level(logging.WARNING), open_store(_damaged(base, tmp_path, sql)) as s:
        kept = s.measurements(1)
    # row 2 is allgather_reducescatter at 64 tokens/rank
    assert [(m.backend, m.tokens_per_rank) for m in kept] == [
        ("allgather_reducescatter", 1),
        ("nccl_all2allv", 1),
        ("nccl_all2allv", 64),
    ]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert f"run 1: measurements row 2: {field}:" in warning and "left out" in warning


@pytest.mark.parametrize(
    "sql, field",
    [("update runs set config = 'null'", "config"), ("update runs set started_at = 'notadate'", "started_at")],
)
def test_a_damaged_run_is_one_line_naming_the_run_and_the_field(base, tmp_path, sql, field):
    with open_store(_damaged(base, tmp_path, sql)) as s:
        for read in (lambda: s.get_run(1), s.runs, s.latest_run):
            with pytest.raises(StoreError, match=f"^run 1: runs row 1: {field}: "):
                read()
        assert len(s.measurements(1)) == 4  # what does not need the run row is still read


def test_hardware_facts_of_the_wrong_shape_are_shown_as_none(base, tmp_path, caplog):
    with (
        caplog.at_level(logging.WARNING),
        open_store(_damaged(base, tmp_path, "update hardware set facts = '[1]'")) as s,
    ):
        assert s.hardware_for_run(1).facts == {}
    assert "hardware row 1: facts" in caplog.text


def test_views_survive_damaged_rows(base, tmp_path):
    db = _damaged(base, tmp_path, "update measurements set median_us = 'abc' where id = 2")
    r = a2a("show", "--db", db)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "measurements row 2: median_us" in r.stderr
    db = _damaged(base, tmp_path, "update runs set started_at = 'notadate'")
    for command in (["show", "--db", db], ["select", "--db", db, "--run", "1", "--out", str(tmp_path)]):
        r = a2a(*command)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "run 1: runs row 1: started_at" in line


def test_the_store_refuses_non_positive_times(base, tmp_path):
    path = tmp_path / "w.db"
    shutil.copy(base, path)
    with open_store(str(path)) as s:
        rid = s.start_run(1, device_type="cpu", world_size=2, versions={}, git_sha=None, config={}, config_hash="x")
        for bad in (0.0, -1.0):
            with pytest.raises(ValueError, match="median_us must be more than 0"):
                s.add_measurement(rid, _measured("nccl_all2allv", 8, 1.0, median_us=bad, p10_us=bad))


def test_evaluate_never_divides_by_a_stored_zero():
    zero = [
        SimpleNamespace(**SHAPE, tokens_per_rank=64, backend=b, median_us=v)
        for b, v in (("allgather_reducescatter", 0.0), ("nccl_all2allv", 70.0))
    ]
    ev = evaluate(zero, str(FIXTURE), [])
    assert ev.points and all(p["best"] == "nccl_all2allv" for p in ev.points)
