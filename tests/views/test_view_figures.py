"""The figures beside the round trip where a person looks: `show` (80 columns), `show --json`,
`report`, `plot`. The fixture table tests/fixtures/profiles/test.fixture.node1.json holds them for
shape A (tests/tuner/test_select.py: dispatch 45% and combine 50% of the round trip, every token
to both ranks in bf16 rows of 7168 x 2 B, half of them over the link, memory per backend);
schema2/ holds the same table from before them."""

from __future__ import annotations

import json
from importlib.util import find_spec

import pytest
from bad_tables import FIXTURE
from run_cli import a2a

from a2a_tune.tuner.views.load import load_profile_view, load_run_view
from a2a_tune.tuner.views.model import FIGURE_NAMES
from a2a_tune.tuner.views.show import show_data

SCHEMA2 = FIXTURE.parent / "schema2" / FIXTURE.name
A = (2, 7168, 8, 256, "bf16", "uniform")
H200_ISLAND = {"gpus": [0, 1], "link_counts": [18, 18], "speed_mbps": 26562, "via_switch": False, "nodes": [0]}
JSON_NAMES = {"dispatch_us", "combine_us", "logical_bytes", "logical_gbps", "link_pct", "workspace_mib"}


def _with_facts(tmp_path, facts: dict):
    data = json.loads(FIXTURE.read_text())
    data["hardware"]["facts"] = facts
    path = tmp_path / FIXTURE.name
    path.write_text(json.dumps(data))
    return path


def _shape(data: dict, key=A) -> dict:
    (s,) = [s for s in data["shapes"] if tuple(s[k] for k in ("ep_size", "hidden", "topk", "num_experts")) == key[:4]]
    return s


def test_show_json_carries_the_figures_per_backend_and_token_count(tmp_path):
    path = _with_facts(tmp_path, {"gpus": [{"name": "NVIDIA H200"}] * 2, "islands": [H200_ISLAND]})
    r = a2a("show", "--profile", str(path), "--json")
    assert r.returncode == 0, r.stderr
    s = _shape(json.loads(r.stdout))
    assert s["link"]["gbps"] == pytest.approx(18 * 26.562)
    rows = s["figures"]["nccl_all2allv"]
    assert [row["tokens"] for row in rows] == [1, 4, 16, 64, 256, 1024]
    at_1024 = rows[-1]
    assert JSON_NAMES <= set(at_1024) and set(at_1024) == set(FIGURE_NAMES)
    assert (at_1024["round_trip_us"], at_1024["dispatch_us"], at_1024["combine_us"]) == (420.0, 189.0, 210.0)
    assert at_1024["logical_bytes"] == 2 * 1024 * 7168 * 2  # dispatch, per rank: both ranks, bf16 rows
    assert at_1024["logical_gbps"] == pytest.approx(29360128 / 189e-6 / 1e9)  # 155 GB/s
    assert at_1024["link_pct"] == pytest.approx(14680064 / 189e-6 / 1e9 / (18 * 26.562) * 100)  # 16%
    assert at_1024["combine_logical_gbps"] == pytest.approx(29360128 / 210e-6 / 1e9)
    assert at_1024["workspace_mib"] == 64.0
    # nvlink_one_sided has no measurement at 1024 (a timeout): null there, its memory too
    assert s["figures"]["nvlink_one_sided"][-1]["dispatch_us"] is None
    assert s["figures"]["nvlink_one_sided"][-1]["workspace_mib"] is None


def test_old_tables_carry_the_names_with_null_and_show_the_round_trip_alone():
    data = show_data(load_profile_view(SCHEMA2))
    for shape in data["shapes"]:
        for rows in shape["figures"].values():
            for row in rows:
                assert row["round_trip_us"] is not None or row["tokens"] == 1024
                assert all(row[name] is None for name in JSON_NAMES)
    r = a2a("show", "--profile", str(SCHEMA2), env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "disp µs" not in r.stdout and "GB/s" not in r.stdout


def test_show_puts_dispatch_combine_gbps_link_and_mib_in_80_columns(tmp_path):
    path = _with_facts(tmp_path, {"gpus": [{"name": "NVIDIA H200"}] * 2, "islands": [H200_ISLAND]})
    r = a2a("show", "--profile", str(path), env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    (head,) = [line for line in lines if "disp µs" in line]
    figures = lines[lines.index(head) : next(i for i, line in enumerate(lines) if "tie at" in line)]
    assert len(figures) >= 5 and max(len(line) for line in figures) <= 80, max(figures, key=len)
    assert head.split() == ["at", "T", "winner", "disp", "µs", "comb", "µs", "GB/s", "link", "MiB"]
    # shape A: nvlink_one_sided wins 1-64 (its figures at 64), nccl_all2allv 256-1024 (at 1024)
    (row,) = [line for line in figures if line.split()[:2] == ["1024", "nccl_all2allv"]]
    assert row.split()[2:] == ["189", "210", "155", "16%", "64"]
    (row,) = [line for line in figures if line.split()[:2] == ["64", "nvlink_one_sided"]]
    assert row.split()[2:] == ["22.5", "25.0", "81.6", "8.5%", "3,072"]
    text = " ".join(r.stdout.split())
    assert "GB/s: dispatch logical bytes" in text and "478 GB/s per direction (18 NVLinks x 26.562 GB/s" in text


def _eager_run(path, gpu: bool = False):
    """An eager run of nccl_all2allv on CPU ranks, its halves timed apart; `gpu`: on 2 H200s,
    where an eager backend's halves are not timed apart (timing.unsplit_reason)."""
    from a2a_tune.db import open_store
    from a2a_tune.tuner.runtime.measurement import Measurement

    with open_store(str(path)) as s:
        h200 = [{"index": i, "name": "NVIDIA H200"} for i in (0, 1)]
        facts = {"gpus": h200 if gpu else [], "islands": [[0, 1]] if gpu else [], "node_count": 1}
        hw = s.get_or_create_hardware("h200.nvl18x2.node1" if gpu else "cpu-x86_64.node1", "c" * 16, facts)
        run = s.start_run(
            hw,
            device_type="cuda" if gpu else "cpu",
            world_size=2,
            versions={},
            git_sha=None,
            config={"iters": 4},
            config_hash="c",
        )
        for t, us in ((4, 400.0), (16, 500.0)):
            s.add_measurement(
                run,
                Measurement.from_columns(
                    dict(
                        backend="nccl_all2allv",
                        num_experts=16,
                        topk=4,
                        hidden=32,
                        dtype="bf16",
                        ep_size=2,
                        tokens_per_rank=t,
                        routing="uniform",
                        timing="eager",
                        median_us=us,
                        p10_us=us,
                        p90_us=us,
                        n=4,
                        samples=[us] * 4,
                        dispatch_median_us=None if gpu else us / 2,
                        combine_median_us=None if gpu else us / 2,
                        dispatch_logical_bytes=t * 64 * 1.5,
                        dispatch_link_bytes=t * 64 * 0.75,
                        combine_logical_bytes=t * 64 * 1.5,
                        combine_link_bytes=t * 64 * 0.75,
                    )
                ),
            )
        s.finish_run(run, "completed")


def test_a_cpu_run_says_no_link_and_memory_not_measured(tmp_path):
    db = tmp_path / "cpu.db"
    _eager_run(db)
    view = load_run_view(str(db))
    (rows,) = _shape(show_data(view), (2, 32, 4, 16))["figures"].values()
    assert rows[0]["logical_gbps"] == pytest.approx(4 * 64 * 1.5 / 200e-6 / 1e9)
    assert rows[0]["link_pct"] is None and rows[0]["workspace_mib"] is None
    r = a2a("show", "--db", str(db), env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "link: no link (CPU ranks)" in text and "MiB: not measured on CPU ranks" in text
    assert "each half timed alone, so their sum can exceed the round trip" in text  # eager halves say so


def test_an_eager_gpu_run_says_its_halves_were_not_timed_apart(tmp_path):
    """A backend that reads the device from the host is timed eagerly on a GPU and not split:
    show leaves its halves empty and says why, in 80 columns."""
    db = tmp_path / "gpu.db"
    _eager_run(db, gpu=True)
    (rows,) = _shape(show_data(load_run_view(str(db))), (2, 32, 4, 16))["figures"].values()
    assert rows[0]["dispatch_us"] is None and rows[0]["combine_us"] is None
    r = a2a("show", "--db", str(db), env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "eager on a GPU: disp/comb not timed apart (the dispatch reads the device from the host)" in text
    assert "each half timed alone" not in text


@pytest.mark.skipif(find_spec("matplotlib") is None, reason="matplotlib not installed (a2a-tune[plot])")
def test_report_tabulates_the_figures_and_plot_draws_the_two_halves(tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    r = a2a("report", "--profile", str(FIXTURE), "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "dispatch µs" in text and "dispatch GB/s" in text and "combine % link" in text
    assert '<td class="num">1024</td><td class="mono">nccl_all2allv</td><td class="num">420</td>' in text
    old = tmp_path / "old.html"
    assert a2a("report", "--profile", str(SCHEMA2), "--out", str(old)).returncode == 0
    assert "dispatch µs" not in old.read_text()

    from a2a_tune.tuner.views import plot

    drawn = []
    real = plot._plot_halves

    def spy(ax, curve, tokens, color):
        values = real(ax, curve, tokens, color)
        drawn.append((curve.backend, len(values)))
        return values

    monkeypatch.setattr(plot, "_plot_halves", spy)
    view = load_profile_view(FIXTURE)
    for s in view.shapes:
        assert plot.render_png(view, s).startswith(b"\x89PNG")
    # shape B (drawn first) has no halves; shape A: dispatch and combine at each measured count
    # of the backends that did not fail (flashinfer_nvlink_one_sided did: no halves drawn)
    assert sorted(drawn) == [
        ("allgather_reducescatter", 0),
        ("allgather_reducescatter", 12),
        ("nccl_all2allv", 0),
        ("nccl_all2allv", 12),
        ("nvlink_one_sided", 10),
    ]


def test_diff_says_which_half_got_slower(tmp_path):
    from a2a_tune.tuner.views.diff import diff_views

    data = json.loads(FIXTURE.read_text())
    (a,) = [e for e in data["entries"] if e["hidden"] == 7168]
    curve = a["backends"]["nccl_all2allv"]
    for key in ("median_us", "p10_us", "p90_us"):
        curve[key][-1] *= 2  # 420 -> 840 µs at 1024 tokens
    curve["dispatch_us"][-1] *= 3  # all of it in dispatch: 189 -> 567; combine stays 210
    slower = tmp_path / "b.json"
    slower.write_text(json.dumps(data))
    res = diff_views(load_profile_view(FIXTURE), load_profile_view(slower))
    (p,) = res.regressions
    assert (p.backend, p.tokens, p.ratio) == ("nccl_all2allv", 1024, 2.0)
    assert (p.dispatch_ratio, p.combine_ratio) == (pytest.approx(3.0), 1.0)
    assert res.to_dict()["regressions"][0]["dispatch_ratio"] == pytest.approx(3.0)
    r = a2a("diff", str(FIXTURE), str(slower))
    assert r.returncode == 1 and "2.00x (dispatch 3.00x, combine 1.00x)" in " ".join(r.stdout.split()), r.stdout
    # tables from before the halves: the ratio of the round trips alone
    old = json.loads(SCHEMA2.read_text())
    (a,) = [e for e in old["entries"] if e["hidden"] == 7168]
    for key in ("median_us", "p10_us", "p90_us"):
        a["backends"]["nccl_all2allv"][key][-1] *= 2
    (tmp_path / "old.json").write_text(json.dumps(old))
    (p,) = diff_views(load_profile_view(SCHEMA2), load_profile_view(tmp_path / "old.json")).regressions
    assert (p.ratio, p.dispatch_ratio, p.combine_ratio, p.halves()) == (2.0, None, None, "")
