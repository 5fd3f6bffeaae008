"""The engines' own all2all rules scored beside the table (tuner/policies.py, evaluate, show)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import paths
import pytest

from a2a_tune.tuner.policies import (
    Point,
    default_policies,
    registry_names,
    score_policies,
    score_table,
    table_points,
)
from a2a_tune.tuner.runtime.lookup import load_profile

ROOT = paths.REPO
SHIPPED = ROOT / "profiles" / "h200.nvl18x2.node1.json"
SHAPE = (2, 7168, 8, 256, "bf16", "uniform")

NAMES = registry_names()  # backend -> BackendNames: the engines' literals the kernels declare


def by_name(scores):
    return {s.policy.name: s for s in scores}


def picks(fingerprint, point):
    return {p.name: p.backends(point, NAMES) for p in default_policies(fingerprint)}


def test_each_engines_rule():
    pt = Point(
        SHAPE,
        64,
        {
            "allgather_reducescatter": 400.0,
            "allgather_reducescatter_padded": 100.0,
            "flashinfer_nvlink_two_sided": 50.0,
            "deepep_low_latency": 30.0,
            "nvlink_one_sided": 20.0,
        },
    )
    got = picks("h200.nvl18x2.node1", pt)
    # vLLM's default literal stands for both all-gather backends (the faster one counts).
    assert got["vLLM default"] == {"allgather_reducescatter", "allgather_reducescatter_padded"}
    assert got["vLLM PR 54268"] == got["vLLM default"]  # all-gather off GB200/GB300
    # One-sided was not measured here (does not run): TensorRT-LLM's next method is two-sided,
    # although DeepEP's low-latency kernels are faster.
    assert got["TensorRT-LLM priority list"] == {"flashinfer_nvlink_two_sided"}
    assert got["SGLang default"] == got["vLLM default"]
    gb = picks("gb200.mnnvl18x16.nodes4", Point(SHAPE, 64, {**pt.times, "flashinfer_nvlink_one_sided": 25.0}))
    assert gb["vLLM PR 54268"] == {"flashinfer_nvlink_one_sided"}
    assert picks("gb200+h200.nvl18x2.node1", pt)["vLLM PR 54268"] == got["vLLM default"]  # not GB200 alone
    # Experts that do not divide over the ranks: only NVLINK_ONE_SIDED or ALLGATHER.
    uneven = Point((3, 7168, 8, 256, "bf16", "uniform"), 64, pt.times)
    assert picks("h200.nvl18x2.node1", uneven)["TensorRT-LLM priority list"] == got["vLLM default"]


def test_scores_regret_speedup_and_the_engines_default_where_the_table_cannot_answer():
    points = [
        Point(
            SHAPE,
            1,
            {"allgather_reducescatter_padded": 40.0, "flashinfer_nvlink_one_sided": 20.0, "nvlink_one_sided": 10.0},
        ),
        Point(SHAPE, 8, {"allgather_reducescatter_padded": 60.0, "flashinfer_nvlink_one_sided": 30.0}),
        Point(SHAPE, 64, {"flashinfer_nvlink_one_sided": 30.0}),  # all-gather not measured: unscored for it
    ]

    def table_pick(point, engine):
        if engine == "sglang":
            return None  # the table cannot answer: SGLang keeps its default
        return "flashinfer_nvlink_one_sided"

    s = by_name(score_policies(points, NAMES, default_policies("h200.nvl18x2.node1"), table_pick))
    vllm = s["vLLM default"].summary()
    assert (vllm["points"], vllm["unscored"]) == (2, 1)
    assert vllm["mean"] == pytest.approx((40 / 10 - 1 + 60 / 30 - 1) / 2) and vllm["worst"] == pytest.approx(3.0)
    assert vllm["table_mean"] == pytest.approx((20 / 10 - 1 + 0) / 2)
    assert vllm["speedup"] == pytest.approx(2.0)  # 40/20 and 60/30
    sglang = s["SGLang default"].summary()
    assert sglang["speedup"] == pytest.approx(1.0) and sglang["table_mean"] == sglang["mean"]
    trt = s["TensorRT-LLM priority list"].summary()
    assert (trt["points"], trt["speedup"], trt["worst"]) == (3, 1.0, pytest.approx(1.0))


def test_the_shipped_table_beside_the_engines_defaults():
    s = by_name(score_table(str(SHIPPED)))
    vllm, trt = s["vLLM default"].summary(), s["TensorRT-LLM priority list"].summary()
    # All-gather was measured at bf16 only (112 points); the table answers vLLM with FlashInfer's
    # one-sided kernels where all-gather is slower, so it is never slower than vLLM's default.
    assert (vllm["points"], vllm["unscored"]) == (112, 167)
    assert vllm["speedup"] > 1.5 and vllm["table_mean"] < vllm["mean"]
    assert all(r >= 1 for r in s["vLLM default"].ratios)
    assert s["vLLM PR 54268"].summary() == vllm  # an H200 machine: all-gather
    # TensorRT-LLM's list starts with NVLINK_ONE_SIDED, which ran everywhere here: what the table says too.
    assert (trt["points"], trt["unscored"]) == (279, 0) and trt["speedup"] == pytest.approx(1.0)
    assert math.isclose(trt["mean"], trt["table_mean"])


def cli(*args):
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_evaluate_on_the_tables_own_points_needs_no_gpu():
    r = cli("evaluate", "--profile", str(SHIPPED), "--table-points")
    assert r.returncode == 0, r.stderr
    speedup = score_table(str(SHIPPED))[0].summary()["speedup"]
    assert "each engine's default vs the table" in r.stdout
    assert f"{speedup:.2f}x" in r.stdout and "TensorRT-LLM priority list" in r.stdout
    assert "table " in r.stdout and "279" in r.stdout
    r = cli("evaluate", "--profile", str(SHIPPED), "--table-points", "--run", "1")
    assert r.returncode == 2 and "not both" in r.stderr


def test_show_json_carries_the_engine_rows():
    r = cli("show", "--profile", str(SHIPPED), "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["policy"]: row for row in json.loads(r.stdout)["engines"]}
    assert set(rows) == {"vLLM default", "vLLM PR 54268", "TensorRT-LLM priority list", "SGLang default"}
    assert rows["vLLM default"]["points"] == 112 and rows["vLLM default"]["speedup"] > 1.5


def test_evaluate_scores_the_engines_on_the_points_it_is_given():
    # A stored run's records and the table's own points go through the same scoring.
    from a2a_tune.tuner.evaluate import evaluate, table_measurements

    records = table_measurements(str(SHIPPED))
    assert len(records) == sum(len(p.times) for p in table_points(load_profile(SHIPPED)))
    ev = evaluate(records, str(SHIPPED))
    assert [s.summary() for s in ev.engines] == [pytest.approx(s.summary()) for s in score_table(str(SHIPPED))]
    # Half the points (every other token count of each shape): fewer points, same rules.
    half = [r for r in records if r.tokens_per_rank % 2 == 0]
    n = len({(r.ep_size, r.hidden, r.topk, r.num_experts, r.dtype, r.routing, r.tokens_per_rank) for r in half})
    assert by_name(evaluate(half, str(SHIPPED)).engines)["TensorRT-LLM priority list"].points == n
