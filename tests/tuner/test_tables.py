"""A machine's table across runs (tuner/tables.py, publish.write_table): a new run's table keeps
what the one on disk has and it did not measure, newest measurement per point; two writers at
once keep each other's entries; an unfinished run is selected only when asked, and then the
table says it is partial; an EP size not measured is answered from the nearest larger one."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from a2a_tune.tuner.publish import write_table
from a2a_tune.tuner.runtime.lookup import clear_cache, lookup
from a2a_tune.tuner.runtime.measurement import Measurement
from a2a_tune.tuner.runtime.table import SHAPE_KEYS, Profile, parse_profile, to_dict
from a2a_tune.tuner.select import FailureRow, build_profile, fabric_of
from a2a_tune.tuner.tables import merge

FP = "h200.nvl18x8.node1"
SHAPE = dict(ep_size=4, hidden=64, topk=2, num_experts=8, dtype="bf16", routing="uniform")
B = ("allgather_reducescatter", "nccl_all2allv")


def rows(shape: dict, curves: dict) -> list:
    """Measurements: backend -> {tokens: median µs}."""
    return [
        Measurement.from_columns(
            dict(shape, backend=b, tokens_per_rank=t, median_us=us, p10_us=us * 0.99, p90_us=us * 1.01)
        )
        for b, points in curves.items()
        for t, us in points.items()
    ]


def table(run_id: int, started: str, measured: list, failures=(), *, status="completed", world=8) -> Profile:
    return build_profile(
        measured,
        failures,
        hardware={"fingerprint": FP, "facts_hash": "0" * 16, "facts": {}},
        run={"id": run_id, "device_type": "cuda", "world_size": world, "versions": {}, "started_at": started},
        backend_names={},
        status=status,
    )


def entry(profile: dict, **shape) -> dict:
    want = {**SHAPE, **shape}
    (e,) = [e for e in profile["entries"] if all(e[k] == want[k] for k in SHAPE_KEYS)]
    return e


def test_a_later_run_keeps_the_shapes_and_ep_sizes_it_did_not_measure(tmp_path):
    """A run on 4 GPUs, then one of another model on 8: one table answers both, exactly."""
    first = table(1, "2026-12-01T10:00:00Z", rows(SHAPE, {B[0]: {1: 10.0, 8: 20.0}, B[1]: {1: 30.0, 8: 5.0}}))
    other = dict(SHAPE, ep_size=8, hidden=128)
    second = table(2, "2026-12-01T11:00:00Z", rows(other, {B[0]: {1: 11.0}, B[1]: {1: 50.0}}))
    write_table(first, str(tmp_path))
    path = write_table(second, str(tmp_path))
    written = json.loads(path.read_text())
    assert [(e["ep_size"], e["hidden"]) for e in written["entries"]] == [(4, 64), (8, 128)]
    assert [[p["run"] for p in e["provenance"]] for e in written["entries"]] == [[1], [2]]
    assert written["run"]["id"] == 2  # the top level is the newest selection's
    clear_cache()
    assert lookup(profile=path, tokens=8, **SHAPE).backend == B[1]
    assert lookup(profile=path, tokens=1, **other).match == "exact"
    # Selecting the first run again changes nothing of the second's.
    again = json.loads(write_table(first, str(tmp_path)).read_text())
    assert again["entries"] == written["entries"]


def test_a_shape_measured_twice_keeps_the_newest_measurement_per_point():
    old = table(1, "2026-12-01T10:00:00Z", rows(SHAPE, {B[0]: {1: 10.0, 4: 40.0}, B[1]: {1: 99.0}}))
    new = table(2, "2026-12-01T11:00:00Z", rows(SHAPE, {B[0]: {4: 20.0, 16: 80.0}}))
    for merged in (to_dict(merge(old, new)), to_dict(merge(new, old))):  # whichever is on disk: the newer run wins
        e = merged["entries"][0]
        assert e["tokens"] == [1, 4, 16]
        assert e["backends"][B[0]]["median_us"] == [10.0, 20.0, 80.0]
        assert e["backends"][B[1]]["median_us"] == [99.0, None, None]  # only the older run had it
        assert [p["run"] for p in e["provenance"]] == [2, 1]
        assert [w["tokens"] for w in e["winners"]] == [1, 4, 16]
        parse_profile(merged)  # what the merge writes loads as lookup loads it


def test_an_older_failure_stays_unless_the_newer_run_measured_it_there():
    incorrect = FailureRow(**SHAPE, backend=B[1], kind="incorrect", reason="wrong sums", tokens_per_rank=4)
    old = table(1, "2026-12-01T10:00:00Z", rows(SHAPE, {B[0]: {1: 10.0, 4: 40.0}, B[1]: {1: 5.0, 4: 5.0}}), [incorrect])
    elsewhere = table(2, "2026-12-01T11:00:00Z", rows(SHAPE, {B[0]: {1: 9.0}, B[1]: {1: 4.0}}))
    assert merge(old, elsewhere).entries[0].failed[B[1]].kind == "incorrect"
    there = table(3, "2026-12-01T12:00:00Z", rows(SHAPE, {B[0]: {4: 9.0}, B[1]: {4: 4.0}}))
    assert B[1] not in merge(old, there).entries[0].failed


def _write_shapes(directory: str, first_hidden: int, count: int) -> None:
    for i in range(count):
        shape = dict(SHAPE, hidden=first_hidden + i)
        write_table(table(first_hidden + i, "2026-12-01T10:00:00Z", rows(shape, {B[0]: {1: 10.0}})), directory)


def test_two_writers_at_once_keep_each_others_entries(tmp_path):
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_write_shapes, args=(str(tmp_path), start, 6)) for start in (100, 200)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    written = json.loads((tmp_path / f"{FP}.json").read_text())
    assert sorted(e["hidden"] for e in written["entries"]) == [*range(100, 106), *range(200, 206)]


def test_a_partial_table_says_so_in_lookup_and_show(tmp_path):
    from a2a_tune.tuner.views.load import load_profile_view

    partial = table(7, "2026-12-01T10:00:00Z", rows(SHAPE, {B[0]: {1: 10.0}}), status="interrupted")
    path = write_table(partial, str(tmp_path))
    assert parse_profile(json.loads(path.read_text())).partial_runs() == (7,)
    clear_cache()
    assert "[partial table: run 7 interrupted]" in lookup(profile=path, tokens=1, **SHAPE).reason
    assert any(
        n.startswith("PARTIAL table: selected with --partial from run 7 interrupted")
        for n in load_profile_view(path).notes
    )
    # A completed run measuring the same points replaces them: no longer partial (35.6).
    done = table(8, "2026-12-01T11:00:00Z", rows(SHAPE, {B[0]: {1: 12.0}}))
    path = write_table(done, str(tmp_path))
    e = json.loads(path.read_text())["entries"][0]
    assert [(p["run"], p["status"]) for p in e["provenance"]] == [(8, "completed")]
    assert parse_profile(json.loads(path.read_text())).partial_runs() == ()
    clear_cache()
    assert "partial" not in lookup(profile=path, tokens=1, **SHAPE).reason


def test_an_ep_size_not_measured_is_answered_from_the_nearest_larger_one_and_says_so(tmp_path):
    measured = rows(dict(SHAPE, ep_size=4), {B[0]: {8: 10.0}, B[1]: {8: 50.0}})
    measured += rows(dict(SHAPE, ep_size=8), {B[0]: {8: 90.0}, B[1]: {8: 40.0}})
    path = write_table(table(1, "2026-12-01T10:00:00Z", measured), str(tmp_path))
    clear_cache()
    assert lookup(profile=path, tokens=8, **dict(SHAPE, ep_size=4)).backend == B[0]  # measured: exact
    six = lookup(profile=path, tokens=8, **dict(SHAPE, ep_size=6))
    assert (six.backend, six.match, six.entry_shape.ep_size) == (B[1], "nearest-shape", 8)
    assert "ep_size=6 not measured, answered from the nearest larger measured ep_size=8" in six.reason
    assert lookup(profile=path, tokens=8, **dict(SHAPE, ep_size=2)).entry_shape.ep_size == 4
    wide = lookup(profile=path, tokens=8, quiet=True, **dict(SHAPE, ep_size=16))  # none larger: the default
    assert wide.match == "fallback" and "nor a larger EP size" in wide.reason


def _facts(nodes: int, per_node: int, islands: list) -> dict:
    gpus = [{"index": n * per_node + i, "node": n} for n in range(nodes) for i in range(per_node)]
    return {"gpus": gpus, "islands": [{"gpus": g} for g in islands]}


@pytest.mark.parametrize(
    "facts, ep_size, world, fabric",
    [
        (_facts(1, 8, [list(range(8))]), 8, 8, "island"),  # one HGX node
        (_facts(2, 4, [list(range(8))]), 8, 8, "domain"),  # an NVL72 slice over two trays
        (_facts(2, 4, [list(range(8))]), 4, 8, "island"),  # each group inside one tray
        (_facts(2, 8, [list(range(8)), list(range(8, 16))]), 16, 16, "network"),  # two HGX nodes
        (_facts(2, 8, [list(range(8)), list(range(8, 16))]), 8, 16, "island"),
        (_facts(1, 4, []), 2, 4, "network"),  # PCIe only
        ({"gpus": []}, 2, 2, None),  # CPU ranks
        (_facts(1, 2, [[0, 1]]), 4, 4, None),  # virtual ranks: more ranks than GPUs
    ],
)
def test_the_fabric_an_entrys_groups_span_comes_from_the_probe(facts, ep_size, world, fabric):
    assert fabric_of(facts, ep_size, world) == fabric


def test_the_fabric_a_run_recorded_wins_over_the_probes_numbering():
    """Ranks dealt over two HGX nodes: the run recorded "network" for EP 8, where numbering by
    rank says "island"; a record naming no known fabric, or not this size, leaves the facts."""
    facts = _facts(2, 8, [list(range(8)), list(range(8, 16))])
    assert fabric_of(facts, 8, 16) == "island"
    assert fabric_of(facts, 8, 16, {"8": "network"}) == "network"
    assert fabric_of(facts, 8, 16, {"8": "wormhole"}) == fabric_of(facts, 8, 16, {"4": "network"}) == "island"
    measured = rows(dict(SHAPE, ep_size=8), {B[0]: {1: 10.0}, B[1]: {1: 30.0}})
    profile = build_profile(
        measured,
        [],
        hardware={"fingerprint": FP, "facts_hash": "0" * 16, "facts": facts},
        run={"id": 1, "device_type": "cuda", "world_size": 16, "versions": {}},
        backend_names={},
        fabrics={"8": "network"},
    )
    assert [e.fabric for e in profile.entries] == ["network"]


def test_the_vllm_plugin_and_the_format_lines_follow_the_nearest_larger_ep_size(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from run_cli import a2a

    from a2a_tune.tuner.runtime import vllm_plugin
    from a2a_tune.tuner.runtime.vllm_plugin import decide

    monkeypatch.setattr(vllm_plugin, "_platform_of", lambda: "cuda:9.0")  # vLLM's environment on an H200:
    monkeypatch.setattr(vllm_plugin, "_missing_packages", lambda: [])  # flashinfer and the rest importable

    model = dict(hidden=7168, topk=8, num_experts=256, dtype="bf16", routing="uniform")
    measured = rows(dict(model, ep_size=4), {B[0]: {64: 10.0, 512: 20.0}, B[1]: {64: 50.0, 512: 60.0}})
    measured += rows(dict(model, ep_size=8), {B[0]: {64: 90.0, 512: 95.0}, B[1]: {64: 40.0, 512: 45.0}})
    names = {B[0]: {"engines": {"vllm": B[0]}}, B[1]: {"engines": {"vllm": "flashinfer_nvlink_two_sided"}}}
    profile = build_profile(
        measured,
        [],
        hardware={"fingerprint": FP, "facts_hash": "0" * 16, "facts": {}},
        run={"id": 1, "device_type": "cuda", "world_size": 8, "versions": {}, "started_at": "2026-12-01T10:00:00Z"},
        backend_names=names,
    )
    write_table(profile, str(tmp_path))
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("A2A_TUNE_FINGERPRINT", FP)
    clear_cache()
    config = SimpleNamespace(  # vLLM's config of a DeepSeek-V3-like model on DP 6 x EP
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(hidden_size=7168, num_experts_per_tok=8, n_routed_experts=256),
            dtype="torch.bfloat16",
            quantization=None,
        ),
        parallel_config=SimpleNamespace(
            all2all_backend=B[0], enable_expert_parallel=True, data_parallel_size=6, tensor_parallel_size=1
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=64, max_num_batched_tokens=512),
        kv_transfer_config=None,
    )
    decision = decide(config)
    assert decision.literal == "flashinfer_nvlink_two_sided"
    assert "ep_size=6 not measured, answered from the nearest larger measured ep_size=8" in decision.message
    args = ["--ep-size", "6", "--hidden", "7168", "--topk", "8", "--experts", "256", "--tokens", "64"]
    r = a2a(
        "lookup",
        *args,
        "--format",
        "vllm",
        env_extra={"A2A_TUNE_PROFILE_DIR": str(tmp_path), "A2A_TUNE_FINGERPRINT": FP},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--all2all-backend flashinfer_nvlink_two_sided"


def test_select_refuses_an_unfinished_run_in_one_line_and_merges_the_runs_it_is_given(tmp_path):
    from stored import measurement, new_run
    from typer.testing import CliRunner

    from a2a_tune.db import open_store
    from a2a_tune.tuner.cli import app

    def a2a(*args):  # in this process: a subprocess per call would cost seconds each
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with open_store(db) as s:
        for run_no, (ep, status) in enumerate(((4, "completed"), (8, "interrupted")), 1):
            _, run = new_run(s, config_hash=f"cfg{run_no}")
            point = dict(backend=B[0], ep_size=ep, median_us=20.0, p10_us=19.0, p90_us=21.0, knobs={})
            s.add_measurement(run, measurement(**point))
            s.finish_run(run, status)
    out = tmp_path / "out"
    r = a2a("select", "--db", db, "--run", "1", "--run", "2", "--out", str(out))
    assert r.exit_code == 2 and not list(out.glob("*.json"))
    (line,) = r.output.strip().splitlines()
    assert "error: run 2 is interrupted, not completed" in line and "--partial" in line
    r = a2a("select", "--db", db, "--run", "1", "--run", "2", "--partial", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "(2 shape(s)) from run 1, 2" in r.output and "PARTIAL" in r.output
    (path,) = out.glob("*.json")
    written = json.loads(path.read_text())
    assert [(e["ep_size"], [p["status"] for p in e["provenance"]]) for e in written["entries"]] == [
        (4, ["completed"]),
        (8, ["interrupted"]),
    ]
    # Selecting the first run again keeps the second's entry.
    r = a2a("select", "--db", db, "--run", "1", "--out", str(out))
    assert r.exit_code == 0 and "kept 1 shape(s) of the table there that it did not measure" in r.output
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_a_table_from_before_schema_4_merged_keeps_its_entries_and_gains_their_fabric(tmp_path):
    from a2a_tune.tuner.runtime.table import upgrade

    shipped = json.loads((Path(__file__).parents[2] / "profiles" / "h200.nvl18x2.node1.json").read_text())
    for e in shipped["entries"]:
        e.pop("fabric")
    old = parse_profile(upgrade(shipped))
    shape = dict(SHAPE, ep_size=2)
    new = table(9, "2026-12-02T10:00:00Z", rows(shape, {B[0]: {1: 10.0}}), world=2)
    new = new._replace(fingerprint=old.fingerprint, meta={**new.meta, "hardware": old.meta["hardware"]})
    merged = merge(old, new)
    assert len(merged.entries) == len(old.entries) + 1
    assert {e.fabric for e in merged.entries if e.shape.hidden != 64} == {"island"}
    assert parse_profile(to_dict(merged)) == merged._replace(path=None)


def test_show_says_which_runs_each_entry_of_a_merged_table_comes_from(tmp_path):
    """A table across runs: show names each entry's runs, --json carries them per shape; a
    table from one run says it once, at the top, not per entry."""
    from tests.support.run_cli import a2a

    first = table(1, "2026-12-01T10:00:00Z", rows(SHAPE, {B[0]: {1: 10.0}, B[1]: {1: 30.0}}))
    other = dict(SHAPE, ep_size=8, hidden=128)
    path = write_table(first, str(tmp_path))
    single = a2a("show", "--profile", str(path))
    assert single.returncode == 0 and "measured by:" not in single.stdout, single.stdout
    second = table(2, "2026-12-01T11:00:00Z", rows(other, {B[0]: {1: 11.0}, B[1]: {1: 50.0}}), status="interrupted")
    path = write_table(second, str(tmp_path))
    r = a2a("show", "--profile", str(path))
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines() if "measured by:" in line]
    assert lines == [
        "measured by: run 1 (2026-12-01T10:00:00Z, completed)",
        "measured by: run 2 (2026-12-01T11:00:00Z, interrupted)",
    ]
    shapes = json.loads(a2a("show", "--profile", str(path), "--json").stdout)["shapes"]
    assert [[(p["run"], p["status"]) for p in s["provenance"]] for s in shapes] == [
        [(1, "completed")],
        [(2, "interrupted")],
    ]
