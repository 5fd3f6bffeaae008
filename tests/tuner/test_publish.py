"""Where a table is written: the node's profile directory, and a cluster's pointer."""

from __future__ import annotations

import json
import os

from a2a_tune.tuner.publish import table_dir, write_table
from a2a_tune.tuner.runtime.measurement import Measurement
from a2a_tune.tuner.select import build_profile

SHAPE = dict(ep_size=2, hidden=64, topk=2, num_experts=8, dtype="bf16", routing="uniform")
ROWS = [
    Measurement.from_columns(dict(SHAPE, backend="allgather_reducescatter", tokens_per_rank=t, median_us=10.0 * t))
    for t in (1, 4)
]


def table(fingerprint: str) -> dict:
    hardware = {"fingerprint": fingerprint, "facts_hash": "0", "facts": {}}
    run = {"id": 1, "device_type": "cpu", "world_size": 2, "versions": {}}
    return build_profile(ROWS, [], hardware=hardware, run=run, backend_names={})


def test_a_table_goes_to_the_out_dir_else_the_first_profile_dir_else_the_users(tmp_path, monkeypatch):
    assert table_dir(str(tmp_path / "out")) == tmp_path / "out"
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(tmp_path / "first"), str(tmp_path / "second")]))
    assert table_dir(None) == tmp_path / "first"
    monkeypatch.delenv("A2A_TUNE_PROFILE_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert table_dir(None) == tmp_path / "xdg" / "a2a-tune" / "profiles"
    path = write_table(table("h200.nvl18x2.node1"), str(tmp_path / "out"))
    assert path == tmp_path / "out" / "h200.nvl18x2.node1.json"
    assert json.loads(path.read_text())["entries"][0]["tokens"] == [1, 4]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["h200.nvl18x2.node1.json"]  # no pointer


def test_a_clusters_table_on_a_node_gets_a_pointer_from_the_nodes_fingerprint(tmp_path):
    out = str(tmp_path)
    write_table(table("gb200.mnnvl18x8.nodes2"), out, "gb200.nvl18x4.node1")
    assert json.loads((tmp_path / "gb200.nvl18x4.node1.cluster").read_text()) == {
        "clusters": ["gb200.mnnvl18x8.nodes2"]
    }
    write_table(table("gb200.nvl18x4.node1"), out, "gb200.nvl18x4.node1")  # the node's own table: no pointer to it
    assert json.loads((tmp_path / "gb200.nvl18x4.node1.cluster").read_text()) == {
        "clusters": ["gb200.mnnvl18x8.nodes2"]
    }
