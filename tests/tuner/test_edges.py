"""Each value is validated once, at its edge (issue 36, outcome 2): the command line and the
plan, a store row read, a table file read, a lookup request, and the kernels' own entry. A value
out of the point's bounds planted at each is refused there, in one line; the bounds and the
payload vocabulary are runtime.point's alone."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest
from run_cli import a2a
from stored import SHAPE, assert_one_clean_line, measurement, new_run

from a2a_tune.tuner.runtime import point
from a2a_tune.tuner.runtime.point import MAX_EXPERTS, MAX_HIDDEN, PAYLOADS, Shape

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "profiles" / "h200.nvl18x2.node1.json"


@pytest.mark.parametrize(
    "option, value, words",
    [("--dtype", "fp99", "unknown --dtype 'fp99'"), ("--tokens", "2000000", "1..1048576")],
)
def test_the_command_line_refuses_it(option, value, words):
    r = a2a("sweep", "--device", "cpu", "--preset", "mixtral-8x7b", option, value, "--dry-run")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert words in line


def test_the_plan_refuses_it():
    from a2a_tune.tuner.plans import PlanError, check_plan
    from a2a_tune.tuner.shapes import ModelShape
    from a2a_tune.tuner.sweep import SweepPlan

    shapes, backends = (ModelShape("m", 8, 2, 4096),), ("nccl_all2allv",)
    plan = SweepPlan(shapes=shapes, tokens=(1,), ep_sizes=(2,), backends=backends, dtypes=("fp99",))
    with pytest.raises(PlanError) as info:
        check_plan(plan, "cpu", 2, budget=(None, ""))
    assert_one_clean_line(str(info.value))
    assert "unknown payload dtype 'fp99'" in str(info.value)


@pytest.mark.parametrize("column, value", [("hidden", 0), ("hidden", MAX_HIDDEN + 1), ("num_experts", 1)])
def test_a_store_row_read_refuses_it(tmp_path, caplog, column, value):
    from a2a_tune.db import open_store

    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_store(url) as store:
        _, run = new_run(store)
        store.add_measurement(run, measurement())
        store.add_measurement(run, measurement(**{**SHAPE, "tokens_per_rank": 256}))
    with sqlite3.connect(tmp_path / "s.db") as c:
        c.execute(f"update measurements set {column} = ? where tokens_per_rank = 256", (value,))
    with caplog.at_level(logging.WARNING), open_store(url, readonly=True) as store:
        kept = store.measurements(run)
    assert [m.point.tokens_per_rank for m in kept] == [128]  # the planted row is left out, the other read
    (warning,) = [r.getMessage() for r in caplog.records if "measurements row" in r.getMessage()]
    assert_one_clean_line(warning)
    assert "point" in warning


@pytest.mark.parametrize("field, value", [("hidden", 0), ("num_experts", MAX_EXPERTS + 1), ("dtype", "")])
def test_a_table_file_read_refuses_it(tmp_path, field, value):
    from a2a_tune.tuner.runtime.lookup import ProfileError, load_profile

    data = json.loads(SHIPPED.read_text())
    data["entries"][0][field] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert_one_clean_line(str(info.value))


@pytest.mark.parametrize("field, value", [("hidden", 0), ("hidden", MAX_HIDDEN + 1), ("topk", 9), ("ep_size", 2.0)])
def test_a_lookup_request_refuses_it(field, value):
    from a2a_tune.tuner.runtime.request import RequestError, request

    args = dict(ep_size=2, hidden=4096, topk=2, num_experts=8, tokens=4) | {field: value}
    with pytest.raises(RequestError) as info:
        request(**args)
    assert_one_clean_line(str(info.value))


def test_the_kernels_entry_refuses_it():
    from a2a_tune.kernels import MoEShape
    from a2a_tune.kernels.errors import ShapeError

    with pytest.raises(ShapeError) as info:
        MoEShape(8, 2, 4096, 16, "fp99").validate(2)
    assert_one_clean_line(str(info.value))
    assert "unknown payload dtype 'fp99'" in str(info.value)


@pytest.mark.parametrize("dtype", [*PAYLOADS, "int4", ""])
@pytest.mark.parametrize("ep_size", [0, 1, 72, point.MAX_EP_SIZE + 1])
@pytest.mark.parametrize("hidden", [0, 100, 4096, MAX_HIDDEN, MAX_HIDDEN + 1])
@pytest.mark.parametrize("topk, experts", [(0, 8), (2, 8), (9, 8), (8, MAX_EXPERTS + 1), (point.MAX_TOPK + 1, 128)])
def test_the_fast_path_and_the_rules_agree(dtype, ep_size, hidden, topk, experts):
    """The engines' start-up path (Shape.plain) says yes exactly where Shape.problem finds nothing."""
    shape = Shape(ep_size, hidden, topk, experts, dtype, "uniform")
    assert Shape.plain(*shape) == (shape.problem() is None)


def test_one_payload_vocabulary():
    import a2a_tune.kernels as kernels
    from a2a_tune.kernels.base import ITEM_BYTES

    assert kernels.PAYLOADS is PAYLOADS and not hasattr(kernels, "PAYLOAD_DTYPES")
    for p in PAYLOADS.values():  # every dtype a payload names is one the kernels know the size of
        assert p.activation in ITEM_BYTES and (p.wire is None or p.wire in ITEM_BYTES)
        assert p.quantized == (p.wire is not None)
