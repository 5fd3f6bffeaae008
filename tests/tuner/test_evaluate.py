"""`evaluate`: the regret of a table's picks on measured points, next to fixed policies."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from a2a_tune.tuner.evaluate import EvaluationError, evaluate, held_out_plan, held_out_tokens
from a2a_tune.tuner.runtime.lookup import load_profile
from a2a_tune.tuner.runtime.measurement import Measurement
from a2a_tune.tuner.select import build_profile, write_profile

SHAPE = dict(ep_size=2, hidden=64, topk=2, num_experts=8, dtype="bf16", routing="uniform")
NAMES = {
    b: {"vllm_name": None, "sglang_name": None}
    for b in ("allgather_reducescatter", "nccl_all2allv", "nvlink_one_sided")
}


def _rows(curves: dict[str, dict[int, float]]) -> list[Measurement]:
    return [
        Measurement.from_columns(
            dict(SHAPE, backend=b, tokens_per_rank=t, timing="eager", median_us=v, p10_us=v * 0.99, p90_us=v * 1.01)
        )
        for b, c in curves.items()
        for t, v in c.items()
    ]


def _table(tmp_path, curves, sizes=(2,)) -> str:
    """A table of SHAPE at each EP size of `sizes` with `curves` (backend -> tokens -> µs)."""
    rows = [Measurement.from_columns({**m.columns(), "ep_size": size}) for size in sizes for m in _rows(curves)]
    profile = build_profile(
        rows,
        [],
        hardware={"fingerprint": "test.fixture.node1", "facts_hash": "0", "facts": {}},
        run={"id": 1, "device_type": "cpu", "world_size": max(sizes), "versions": {}},
        backend_names=NAMES,
    )
    return str(write_profile(profile, tmp_path))


def test_held_out_tokens_are_geometric_midpoints_off_the_grid():
    assert held_out_tokens([1, 4, 16, 64]) == (2, 8, 32)
    assert held_out_tokens([1, 2]) == ()  # sqrt(2) rounds onto the grid


def test_held_out_tokens_of_a_dense_grid_are_a_spread_of_at_most_eight():
    from a2a_tune.tuner.sweep import DEFAULT_TOKENS

    grid = DEFAULT_TOKENS["cuda"]
    every = held_out_tokens(grid, most=None)
    some = held_out_tokens(grid)
    assert len(every) > 8 and len(some) == 8
    assert set(some) <= set(every) and not set(some) & set(grid)
    assert some[0] == every[0] and some[-1] == every[-1]  # both ends of the range kept


def test_regret_of_the_table_and_of_fixed_policies_on_held_out_points(tmp_path):
    # The table saw nvlink win at 1 and 16 tokens; at 4 tokens (held out) nccl is in fact 25% faster.
    path = _table(
        tmp_path,
        {
            "allgather_reducescatter": {1: 50.0, 16: 90.0},
            "nccl_all2allv": {1: 40.0, 16: 60.0},
            "nvlink_one_sided": {1: 10.0, 16: 30.0},
        },
    )
    held = {
        4: {"allgather_reducescatter": 60.0, "nccl_all2allv": 16.0, "nvlink_one_sided": 20.0},
        8: {"allgather_reducescatter": 70.0, "nccl_all2allv": 30.0, "nvlink_one_sided": 24.0},
    }
    ms = [
        SimpleNamespace(**SHAPE, backend=b, tokens_per_rank=t, median_us=v)
        for t, c in held.items()
        for b, v in c.items()
    ]
    ev = evaluate(ms, path)
    table = ev.summary()["table"]
    assert table["points"] == 2
    assert table["mean"] == pytest.approx((20 / 16 - 1 + 0) / 2) and table["worst"] == pytest.approx(0.25)
    assert ev.summary()["always allgather_reducescatter"]["worst"] == pytest.approx(60 / 16 - 1)
    (worst,) = ev.worst()
    assert (worst["tokens"], worst["table_backend"], worst["best"]) == (4, "nvlink_one_sided", "nccl_all2allv")


def test_points_where_a_policys_backend_was_not_measured_are_counted_not_hidden(tmp_path):
    # an evaluation of a subset of the backends: the table picks nvlink, which was not measured
    path = _table(tmp_path, {"allgather_reducescatter": {1: 50.0, 16: 90.0}, "nvlink_one_sided": {1: 10.0, 16: 30.0}})
    ms = [
        SimpleNamespace(**SHAPE, backend="allgather_reducescatter", tokens_per_rank=t, median_us=60.0) for t in (4, 8)
    ]
    ev = evaluate(ms, path)
    assert "table" not in ev.summary() and ev.unscored == {"table": 2}
    assert ev.summary()["always allgather_reducescatter"] == {"mean": 0.0, "worst": 0.0, "points": 2}


def test_points_of_shapes_the_table_lacks_are_counted_not_scored_as_its_choice(tmp_path):
    path = _table(tmp_path, {"allgather_reducescatter": {1: 50.0, 16: 90.0}, "nvlink_one_sided": {1: 10.0, 16: 30.0}})
    other = dict(SHAPE, hidden=128)  # not in the table: a lookup there answers a nearest shape or the fallback
    ms = [
        SimpleNamespace(**other, backend=b, tokens_per_rank=4, median_us=v)
        for b, v in (("allgather_reducescatter", 60.0), ("nvlink_one_sided", 20.0))
    ]
    ms += [SimpleNamespace(**SHAPE, backend="nvlink_one_sided", tokens_per_rank=4, median_us=20.0)]
    ev = evaluate(ms, path)
    assert ev.outside == 1 and len(ev.points) == 1 and ev.summary()["table"]["worst"] == 0.0


def test_a_pick_that_failed_at_the_point_is_a_failure_not_an_unmeasured_point(tmp_path):
    path = _table(tmp_path, {"allgather_reducescatter": {1: 50.0, 16: 90.0}, "nvlink_one_sided": {1: 10.0, 16: 30.0}})
    ms = [SimpleNamespace(**SHAPE, backend="allgather_reducescatter", tokens_per_rank=4, median_us=60.0)]
    crashed = SimpleNamespace(**SHAPE, backend="nvlink_one_sided", tokens_per_rank=4, kind="timeout")
    ev = evaluate(ms, path, [crashed])
    assert ev.failed == {"table": 1} and "table" not in ev.unscored and "table" not in ev.summary()


def test_the_held_out_plan_measures_the_tables_shapes_between_its_token_counts(tmp_path):
    from a2a_tune.tuner.sweep import DEFAULT_ITERS

    path = Path(_table(tmp_path, {"allgather_reducescatter": {1: 50.0, 16: 90.0, 64: 200.0}}))
    table = load_profile(path)
    plan = held_out_plan(table, path, device="cpu", world=2)
    assert [(s.name, s.num_experts, s.topk, s.hidden) for s in plan.shapes] == [("E=8 k=2 H=64", 8, 2, 64)]
    assert (plan.tokens, plan.dtypes, plan.routings, plan.backends) == ((4, 32), ("bf16",), ("uniform",), ())
    assert (plan.warmup, plan.iters, plan.capacity) == (*DEFAULT_ITERS["cpu"], None)
    given = held_out_plan(
        table, path, device="cpu", world=2, tokens=(5,), backends=("nccl_all2allv",), warmup=0, iters=2, capacity=8
    )
    assert (given.tokens, given.backends, given.warmup, given.iters, given.capacity) == (
        (5,),
        ("nccl_all2allv",),
        0,
        2,
        8,
    )
    assert plan.ep_sizes == (2,) and held_out_plan(table, path, device="cpu", world=4).ep_sizes == (2,)
    with pytest.raises(
        EvaluationError, match=f"^{path} has no entries for an EP size 3 ranks hold \\(its sizes: 2\\)$"
    ):
        held_out_plan(table, path, device="cpu", world=3)
    with pytest.raises(EvaluationError, match="^--capacity 8 is below the largest token count 32: "):
        held_out_plan(table, path, device="cpu", world=2, capacity=8)
    dense = Path(_table(tmp_path / "dense", {"allgather_reducescatter": {1: 50.0, 2: 60.0}}))
    with pytest.raises(EvaluationError, match="its token counts leave no held-out midpoint; give --tokens$"):
        held_out_plan(load_profile(dense), dense, device="cpu", world=2)


def test_the_held_out_plan_is_measured_at_the_tables_capacity(tmp_path):
    path = Path(_table(tmp_path, {"allgather_reducescatter": {1: 50.0, 16: 90.0, 64: 200.0}}))
    data = json.loads(path.read_text())
    data["run"]["capacity"] = 64
    path.write_text(json.dumps(data))
    assert held_out_plan(load_profile(path), path, device="cpu", world=2).capacity == 64
    data["run"]["capacity"] = 16
    path.write_text(json.dumps(data))
    with pytest.raises(EvaluationError, match="^the table's run.capacity 16 is below the largest token count 32: "):
        held_out_plan(load_profile(path), path, device="cpu", world=2)


def test_the_two_scores_of_the_engines_default_say_why_they_differ():
    """`evaluate --table-points` on the shipped table: "always allgather_reducescatter" is our one
    backend, vLLM's default runs its literal as the faster of that backend and its padded twin."""
    import input_writers  # noqa: F401  (registers planted_halves_x: vLLM's literal too, never measured here)

    from a2a_tune.tuner.evaluate import table_measurements

    shipped = str(Path(__file__).resolve().parents[2] / "profiles" / "h200.nvl18x2.node1.json")
    ev = evaluate(table_measurements(shipped), shipped)  # names only the backends the score saw
    assert ev.notes == [
        "always allgather_reducescatter: that backend of ours alone; the engines' defaults below run vLLM's "
        "'allgather_reducescatter', scored as the faster of allgather_reducescatter, "
        "allgather_reducescatter_padded at each point"
    ]


def test_a_multi_size_table_is_scored_at_each_size_the_ranks_hold_and_says_which_not(tmp_path):
    from run_cli import a2a

    from a2a_tune.tuner.evaluate import sizes_measurable

    path = Path(_table(tmp_path, {"allgather_reducescatter": {1: 50.0, 16: 90.0}}, sizes=(2, 4)))
    table = load_profile(path)
    assert sizes_measurable(table, 4) == ((2, 4), ())
    assert held_out_plan(table, path, device="cpu", world=4).ep_sizes == (2, 4)
    assert sizes_measurable(table, 2) == ((2,), (4,))
    r = a2a(
        *("evaluate", "--profile", str(path), "--device", "cpu", "--world", "2", "--tokens", "4"),
        *("--backend", "allgather_reducescatter", "--warmup", "0", "--iters", "2", "--no-progress"),
        *("--db", str(tmp_path / "e.db")),
    )
    assert r.returncode == 0, r.stderr
    note = "not scored: the table's EP 4 entries (sizes that do not divide the 2 ranks here)"
    assert r.stdout.count(note) == 2, r.stdout  # before the sweep, and with the scores
