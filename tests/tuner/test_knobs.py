"""The knob search on 2 CPU ranks over gloo: the contract, the study, the table and lookup.

`knobbed_sleepy` (tests/support/knob_backends.py) sleeps `delay_ms` per dispatch; its
`shortcut` setting is the fastest of all and wrong. Seed 0 measures the defaults (200 ms),
then 1 ms, then 100 ms: the last is hopeless next to 1 ms and must be pruned.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import knob_backends  # noqa: F401  (tests/support: registers knobbed_sleepy here; the ranks load it by env)
import pytest
from stored import measured

from a2a_tune.db import open_store
from a2a_tune.kernels import KnobError, get_backend
from a2a_tune.kernels._nvlink_common import LaunchKnobs
from a2a_tune.tuner.knobs import KnobPlan, tune_knobs
from a2a_tune.tuner.runtime.lookup import load_profile, lookup
from a2a_tune.tuner.runtime.table import ProfileError, parse_profile
from a2a_tune.tuner.select import build_profile, with_knobs, write_profile, write_profile_to
from a2a_tune.tuner.shapes import ModelShape

SHAPE = ModelShape("tiny", 16, 4, 32)
ENTRY = dict(ep_size=2, hidden=32, topk=4, num_experts=16, dtype="bf16", routing="uniform")  # SHAPE's table entry
FAST = {"delay_ms": 1, "shortcut": False}


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'knobs.db'}"
    plan = KnobPlan(
        "knobbed_sleepy",
        SHAPE,
        tokens=(4,),
        trials=6,
        warmup=1,
        iters=4,
        probe_iters=2,
        input_sets=2,
        seed=0,
        prune_margin=0.10,
    )  # 100 + g ms vs 1 + g ms: > 10% apart for any gloo overhead g < 900 ms a round trip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "knob_backends")
        results = tune_knobs(plan, device_type="cpu", world_size=2, db_url=url, progress=False)
    return url, results


# ------------------------------------------------------------------------------ contract


def test_check_knobs_fills_defaults_and_refuses_unknown_names_and_values():
    cls = get_backend("nvlink_one_sided")
    assert cls.check_knobs({"send_num_warps": 8}) == {**cls.knob_defaults, "send_num_warps": 8}
    with pytest.raises(KnobError, match=r"unknown knob 'block' \(knobs: send_num_warps"):
        cls.check_knobs({"block": 1})
    with pytest.raises(KnobError, match=r"send_num_warps=3 not allowed"):
        cls.check_knobs({"send_num_warps": 3})
    with pytest.raises(KnobError, match="not allowed"):  # a bool is not the int 1
        cls.check_knobs({"send_num_warps": True})
    with pytest.raises(KnobError, match=r"unknown knob .*knobs: none"):
        get_backend("nccl_all2allv").check_knobs({"NCCL_PROTO": "LL"})
    for name in ("nccl_all2allv", "allgather_reducescatter", "flashinfer_nvlink_one_sided"):
        get_backend(name).check_knobs({})  # no space: {} is fine


def test_nvlink_defaults_are_the_launch_parameters_used_before_knobs():
    # Past measurements stay comparable: the kernels launch as they did without knobs.
    launch = LaunchKnobs()
    assert (
        launch.send_num_warps,
        launch.recv_num_warps,
        launch.row_block_bytes,
        launch.recv_block_h,
        launch.recv_block_rows,
    ) == (4, 4, 16384, 2048, 64)
    for name in ("nvlink_one_sided", "nvlink_low_latency"):
        cls = get_backend(name)
        assert all(cls.knob_defaults[k] in v for k, v in cls.knob_space.items())
    assert "recv_block_rows" in get_backend("nvlink_low_latency").knob_space
    assert "recv_block_rows" not in get_backend("nvlink_one_sided").knob_space  # no dispatch_recv kernel there


def test_set_knobs_reaches_the_kernels_launch_state_and_knobs_reports_it():
    backend = object.__new__(get_backend("nvlink_one_sided"))  # no workspace needed to apply knobs
    backend.state = SimpleNamespace(launch=LaunchKnobs())
    backend.set_knobs({"row_block_bytes": 2048, "recv_num_warps": 8})
    assert backend.state.launch == LaunchKnobs(row_block_bytes=2048, recv_num_warps=8)
    assert backend.knobs()["row_block_bytes"] == 2048
    backend.set_knobs({})
    assert backend.state.launch == LaunchKnobs() and backend.knobs() == get_backend("nvlink_one_sided").knob_defaults
    with pytest.raises(KnobError):
        backend.set_knobs({"row_block_bytes": 1000})
    assert backend.state.launch == LaunchKnobs()  # a refused setting changes nothing


# -------------------------------------------------------------------------------- study


def test_the_search_finds_the_fast_setting_and_never_the_wrong_one(searched):
    _, (r,) = searched
    assert r.best_knobs == FAST
    assert r.default_knobs == {"delay_ms": 200, "shortcut": False}
    # 200 + g ms vs 1 + g ms: at least 1.5x for g < 400 ms (gloo on a loaded 2-core box: tens of ms)
    assert r.best_us < r.default_us and r.gain > 0.5
    assert r.failed == 3  # every shortcut setting failed the invariant
    assert r.trials == 6 and r.repeats == 0 and not r.skipped


def test_hopeless_settings_are_pruned_after_the_short_measurement(searched):
    import optuna

    url, (r,) = searched
    study = optuna.load_study(study_name=r.study_name, storage=url)
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert r.pruned == len(pruned) == 1
    assert pruned[0].params == {"delay_ms": 100, "shortcut": False}  # after 1 ms completed; never the fast setting
    assert all(len(t.intermediate_values) == 1 for t in pruned)
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert failed and all(t.params["shortcut"] and t.user_attrs["failure"].startswith("incorrect") for t in failed)
    assert study.best_trial.params == FAST


def test_studies_live_in_the_store_database_with_their_summary(searched):
    import optuna

    url, (r,) = searched
    assert r.study_name == f"a2a-tune knobs: {r.study_name.split()[2]} knobbed_sleepy E16-k4-H32-bf16 ep2 T4"
    with open_store(url) as store:  # our schema opens in the same file
        assert store.runs() == []
    (summary,) = optuna.get_all_study_summaries(storage=url)
    attrs = summary.user_attrs
    assert summary.study_name == r.study_name
    assert attrs["best_knobs"] == FAST and attrs["default_us"] == pytest.approx(r.default_us)
    assert attrs["tokens_per_rank"] == 4 and attrs["ep_size"] == 2 and attrs["timing"] == "eager"


def test_a_backend_without_knobs_is_not_searched():
    plan = KnobPlan("nccl_all2allv", SHAPE, tokens=(4,))
    assert tune_knobs(plan, device_type="cpu", world_size=2, db_url="sqlite://", progress=False) == []


# ------------------------------------------------------------------------ table + lookup


def _table(tmp_path):
    ms = [
        measured(ENTRY, backend, t, base + t, base + t - 1, base + t + 1)
        for backend, base in (("allgather_reducescatter", 100.0), ("knobbed_sleepy", 50.0))
        for t in (4, 16, 64)
    ]
    names = {b: {"vllm_name": None, "sglang_name": None} for b in ("allgather_reducescatter", "knobbed_sleepy")}
    profile = build_profile(
        ms,
        [],
        hardware={"fingerprint": "cpu-x86_64.node1", "facts_hash": "x", "facts": {}},
        run={"id": 1, "device_type": "cpu", "world_size": 2, "versions": {}},
        backend_names=names,
    )
    return write_profile(profile, tmp_path)


def test_best_knobs_are_written_into_the_table_and_lookup_returns_them(searched, tmp_path):
    _, (r,) = searched
    path = _table(tmp_path)
    shape = ENTRY
    updated, notes = with_knobs(load_profile(path), shape, "knobbed_sleepy", {4: r.best_knobs, 8: FAST})
    assert notes == ["8 tokens/rank is not one of the entry's token counts (4, 16, 64)"]
    write_profile_to(updated, path)
    assert json.loads(path.read_text())["entries"][0]["backends"]["knobbed_sleepy"]["knobs"] == [FAST, None, None]
    ask = dict(ep_size=2, hidden=32, topk=4, num_experts=16, profile=path, quiet=True)
    choice = lookup(tokens=5, **ask)
    assert choice.backend == "knobbed_sleepy" and dict(choice.knobs) == FAST  # nearest measured: 4
    assert dict(lookup(tokens=40, **ask).knobs) == {}  # nearest measured: 64, defaults there
    assert dict(lookup(phase="decode", max_tokens=16, **ask).knobs) == FAST  # log-midpoint 4
    assert lookup(tokens=5, **ask).to_dict()["knobs"] == FAST
    _, notes = with_knobs(updated, {**shape, "hidden": 64}, "knobbed_sleepy", {4: FAST})
    assert notes == [
        "the table has no entry for ep_size=2, hidden=64, topk=4, num_experts=16, dtype=bf16, routing=uniform"
    ]


@pytest.mark.parametrize(
    "knobs, field, problem",
    [
        ([{"a": 1}], "entries[0].backends.knobbed_sleepy.knobs", "expected an array of 3 values"),
        ([{"a": [1]}, None, None], "entries[0].backends.knobbed_sleepy.knobs[0]", "knob 'a': expected a number"),
        ([None, "fast", None], "entries[0].backends.knobbed_sleepy.knobs[1]", "expected an object of knob settings"),
    ],
)
def test_malformed_knobs_are_refused_in_one_line_and_lookup_falls_back(tmp_path, knobs, field, problem):
    path = _table(tmp_path)
    data = json.loads(path.read_text())
    data["entries"][0]["backends"]["knobbed_sleepy"]["knobs"] = knobs
    with pytest.raises(ProfileError) as exc:
        parse_profile(data)
    assert str(exc.value).startswith(f"{field}: {problem}") and "\n" not in str(exc.value)
    path.write_text(json.dumps(data))
    choice = lookup(tokens=4, ep_size=2, hidden=32, topk=4, num_experts=16, profile=path, quiet=True)
    assert choice.match == "fallback" and dict(choice.knobs) == {}


def test_select_keeps_the_knobs_tune_knobs_stored(searched, tmp_path):
    import sqlalchemy

    from a2a_tune.db import MeasurementKey
    from a2a_tune.tuner.select import with_stored_knobs
    from a2a_tune.tuner.studies import stored_knobs

    url, (r,) = searched
    fp = r.study_name.split()[2]
    key = MeasurementKey("knobbed_sleepy", *ENTRY.values(), 4)
    with open_store(url, readonly=True) as store:  # the search's best setting is a row of ours
        assert stored_knobs(store, fp) == [(key, FAST)]
        assert stored_knobs(store, "other.machine.node1") == []
        (record,) = store.tuned_knobs(fp)
        assert record.study == r.study_name and record.best_us == pytest.approx(r.best_us)
        assert record.default == r.default_knobs and record.timing == "eager" and record.capacity is None
        profile = load_profile(_table(tmp_path))._replace(fingerprint=fp)
        kept_profile, kept = with_stored_knobs(profile, store)
    assert kept == 1
    assert [k and dict(k) for k in kept_profile.entries[0].knobs["knobbed_sleepy"]] == [FAST, None, None]
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    with open_store(empty) as store:
        assert with_stored_knobs(profile, store) == (profile, 0)
    assert not sqlalchemy.inspect(sqlalchemy.create_engine(empty)).has_table("studies")  # nothing of Optuna's


def test_stored_knobs_of_fixed_capacity_backends_match_the_tables_capacity(tmp_path):
    from a2a_tune.db import KnobsRecord, MeasurementKey
    from a2a_tune.tuner.studies import stored_knobs

    url = f"sqlite:///{tmp_path / 'k.db'}"
    key = MeasurementKey("nvlink_one_sided", 2, 32, 4, 16, "bf16", "uniform", 4)
    with open_store(url) as store:
        for capacity, knobs in (
            (None, {"send_num_warps": 8}),
            (64, {"send_num_warps": 2}),
            (64, {"send_num_warps": 4}),
        ):
            store.put_knobs(KnobsRecord("fp.node1", key, knobs, capacity=capacity))
        assert len(store.tuned_knobs("fp.node1")) == 2  # one row per point and capacity: the later replaced
        assert [k for _, k in stored_knobs(store, "fp.node1")] == [{"send_num_warps": 8}]  # best-case sized table
        assert [k for _, k in stored_knobs(store, "fp.node1", capacity=64)] == [{"send_num_warps": 4}]
        assert stored_knobs(store, "fp.node1", capacity=128) == []
