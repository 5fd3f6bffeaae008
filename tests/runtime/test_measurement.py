"""The one measurement type and the figures declared once (a2a_tune.tuner.runtime.measurement):
the store's columns, the table's keys and the views' names all follow the declaration."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from a2a_tune.tuner.runtime.measurement import (
    FIGURE,
    FIGURES,
    KEY_FIELDS,
    MEASUREMENT_COLUMNS,
    Measurement,
    MeasurementKey,
)
from a2a_tune.tuner.runtime.point import Point

POINT = Point(2, 7168, 8, 256, "bf16", "uniform", 64)
M = Measurement(
    "nccl_all2allv",
    POINT,
    timing="graph",
    median_us=40.0,
    p10_us=39.0,
    p90_us=42.0,
    n=3,
    samples=[39.0, 40.0, 42.0],
    host_median_us=12.5,
    knobs={"num_sms": 24},
    figures={"dispatch_us": 18.0, "workspace_bytes": 3 * 2**20, "combine_samples": [20.0, 21.0], "combine_us": None},
)


def test_a_measurement_is_its_key_at_its_point_and_round_trips_through_the_store_columns():
    assert M.key == MeasurementKey.of("nccl_all2allv", POINT) == ("nccl_all2allv", *POINT)
    assert (M.tokens_per_rank, M.dtype, M.ep_size) == (64, "bf16", 2)  # reads as its point
    assert M.figures == {"dispatch_us": 18.0, "workspace_bytes": 3 * 2**20, "combine_samples": [20.0, 21.0]}
    assert M.figure("combine_us") is None  # not measured
    columns = M.columns()
    assert tuple(columns) == MEASUREMENT_COLUMNS and tuple(columns)[: len(KEY_FIELDS)] == KEY_FIELDS
    assert columns["dispatch_median_us"] == 18.0 and columns["combine_median_us"] is None
    assert Measurement.from_columns(columns) == M
    with pytest.raises(KeyError):
        M.figure("dispatch_median_us")  # a column is not a figure's name


def test_an_undeclared_figure_is_refused():
    with pytest.raises(ValueError, match="unknown figure.*dispatch_bytes.*FIGURES"):
        replace(M, figures={"dispatch_bytes": 1.0})


def test_todays_figures_keep_their_names_on_disk_in_tables_and_in_show_json():
    """The store's columns (revision 0003), the table keys of schema 3 and `show --json`'s names."""
    from a2a_tune.db.models import FIGURE_FIELDS
    from a2a_tune.db.models import Measurement as Row
    from a2a_tune.tuner.runtime.table import FIGURE_COUNTS, FIGURE_CURVES
    from a2a_tune.tuner.views.model import FIGURE_NAMES

    assert FIGURE_FIELDS == (
        "dispatch_median_us",
        "combine_median_us",
        "dispatch_samples",
        "combine_samples",
        "dispatch_logical_bytes",
        "dispatch_link_bytes",
        "combine_logical_bytes",
        "combine_link_bytes",
        "workspace_bytes",
        "group_us",
    )
    assert {c.name for c in Row.__table__.columns} == {"id", "run_id", "created_at", *MEASUREMENT_COLUMNS}
    assert FIGURE_CURVES == ("dispatch_us", "combine_us")
    assert FIGURE_COUNTS == (
        "dispatch_logical_bytes",
        "dispatch_link_bytes",
        "combine_logical_bytes",
        "combine_link_bytes",
        "workspace_mib",
    )
    assert set(FIGURE_NAMES) == {
        "tokens",
        "round_trip_us",
        "dispatch_us",
        "combine_us",
        "logical_bytes",
        "link_bytes",
        "logical_gbps",
        "link_pct",
        "combine_logical_bytes",
        "combine_logical_gbps",
        "combine_link_pct",
        "workspace_mib",
    }
    assert len({f.name for f in FIGURES}) == len({f.column for f in FIGURES}) == len(FIGURES) == len(FIGURE)


# A new figure, declared and nothing else: the script adds one time figure (a value per point)
# and one list figure (a value per group) to the declaration's source before anything imports
# it, then asks every place that names figures what it derived.
NEW_FIGURE = textwrap.dedent(
    r"""
    import importlib.util, json, sys
    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    # the declaration edited in the source, as a contributor would: two lines in FIGURES
    spec = importlib.util.find_spec("a2a_tune.tuner.runtime.measurement")
    source, anchor = open(spec.origin).read(), "FIGURES: tuple[Figure, ...] = (\n"
    assert source.count(anchor) == 1
    source = source.replace(anchor, anchor + '''
        Figure("gate_us", "us", "gate_median_us", "gate_us", "gate_us", "gate µs"),
        Figure("rank_us", "us", "rank_us", "rank_us", None, "rank µs", many=True),
    ''')
    declared = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    exec(compile(source, spec.origin, "exec"), declared.__dict__)

    from a2a_tune.db import open_store, resolve_url
    from a2a_tune.db.models import FIGURE_FIELDS, VERSION_TABLE, Base
    from a2a_tune.tuner.runtime.point import SHAPE_FIELDS, Point
    from a2a_tune.tuner.runtime.table import FIGURE_CURVES, parse_profile
    from a2a_tune.tuner.select import select_entries
    from a2a_tune.tuner.views.model import FIGURE_LABELS, FIGURE_NAMES, Curve, point_figures

    m = declared.Measurement(
        "nccl_all2allv", Point(2, 64, 2, 8, "bf16", "uniform", 4), timing="eager", median_us=40.0,
        p10_us=39.0, p90_us=41.0, n=3, samples=[39.0, 40.0, 41.0],
        figures={"gate_us": 3.25, "rank_us": [20.0, 19.5]},
    )
    [typed], _ = select_entries([m], [])
    curve = {"timing": "eager", "median_us": [40.0], "p10_us": [39.0], "p90_us": [41.0],
             **{k: list(v) for k, v in typed.figures["nccl_all2allv"].items()}}
    entry = dict(zip(SHAPE_FIELDS, typed.shape), tokens=list(typed.tokens), backends={"nccl_all2allv": curve})
    table = {"schema": 3, "hardware": {"fingerprint": "x.y"}, "tie_preference": ["nccl_all2allv"],
             "backends": {"nccl_all2allv": {"vllm_name": None, "sglang_name": None}}, "entries": [entry]}
    parsed = parse_profile(dict(table, entries=[dict(entry, backends={"nccl_all2allv": {
        k: v for k, v in curve.items() if k != "rank_us"}})]))
    figures = dict(parsed.entries[0].figures["nccl_all2allv"])
    [row] = point_figures(Curve("nccl_all2allv", "eager", [40.0], [39.0], [41.0], figures), [4], None)

    url = "sqlite:///" + sys.argv[1]
    open_store(url).close()  # migrated to today's head
    engine = sa.create_engine(resolve_url(url))
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        missing = [(op[0], op[2], op[3].name, type(op[3].type).__name__) for op in compare_metadata(ctx, Base.metadata)]
    print(json.dumps({
        "store": FIGURE_FIELDS[:2], "missing": missing, "table_curves": FIGURE_CURVES,
        "entry": {k: curve.get(k) for k in ("gate_us", "rank_us")}, "parsed": figures.get("gate_us"),
        "views": [n for n in FIGURE_NAMES if n.startswith(("gate", "rank"))],
        "labels": FIGURE_LABELS.get("gate_us"), "shown": row.get("gate_us"),
    }))
    """
)


def test_a_new_figure_is_one_declaration_plus_the_migration_that_adds_its_column(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", NEW_FIGURE, str(tmp_path / "store.db")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    import json

    got = json.loads(proc.stdout)
    assert got["store"] == ["gate_median_us", "rank_us"]  # the store's columns
    # what the migrated schema lacks: exactly the new columns (the Alembic revision to write)
    assert sorted(got["missing"]) == [
        ["add_column", "measurements", "gate_median_us", "Double"],
        ["add_column", "measurements", "rank_us", "JSON"],
    ]
    assert got["table_curves"] == ["gate_us", "dispatch_us", "combine_us"]  # the table's keys
    assert got["entry"] == {"gate_us": [3.25], "rank_us": [[20.0, 19.5]]}  # what select writes
    assert got["parsed"] == [3.25]  # what the table reader hands the views
    assert got["views"] == ["gate_us"] and got["labels"] == "gate µs" and got["shown"] == 3.25
