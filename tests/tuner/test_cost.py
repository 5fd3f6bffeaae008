"""The plan's estimate comes from what this machine measured (issue 37: "9 cases; estimated 42 s"
took 210 s, from a constant per case): the cost model fitted to a run's per-case times, kept,
and used by the next plan's estimate, which says where its numbers come from."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from run_cli import a2a

from a2a_tune.tuner import cost


def test_the_fit_recovers_a_cases_fixed_and_per_element_cost_per_dtype():
    start = dt.datetime(2026, 12, 7, 12, 0, 0)
    times, at, rounds = [], start + dt.timedelta(seconds=5.0), 18  # 5 s of start-up before the first case
    for dtype, per_element in (("bf16", 1e-9), ("fp8_e4m3", 7e-9)):  # quantizing costs more per element
        for tokens in (1, 4, 16, 64, 256, 1024) * 3:
            at += dt.timedelta(seconds=2 * (0.2 + per_element * tokens * 4096 * 2 * rounds))  # 2 CPU ranks
            times.append((tokens, 4096, 2, 2, dtype, at))
    span = (at - start).total_seconds()
    fitted = cost.fit(times, rounds, "cpu", 2, wall=span + 4.0)
    assert fitted["bf16"].per_element == pytest.approx(1e-9, rel=0.01)
    assert fitted["fp8_e4m3"].per_element == pytest.approx(7e-9, rel=0.05)
    assert fitted["bf16"].overhead == pytest.approx(0.2, rel=0.01)
    first = (times[0][5] - start).total_seconds()
    assert fitted["bf16"].startup == pytest.approx((4.0 + first) / 2)  # all before the second case, per rank
    points = [(d, t * 4096 * 2 * rounds, 1) for d in ("bf16", "fp8_e4m3") for t in (1, 4, 16, 64, 256, 1024) * 3]
    total, source = cost.seconds(fitted, points, "cpu", 2)
    assert total == pytest.approx(span + 4.0, rel=0.05) and "36 cases timed here" in source
    _, source = cost.seconds({"bf16": fitted["bf16"]}, points, "cpu", 2)
    assert source.endswith("fp8_e4m3 not timed here yet")  # estimated as bf16, and said so
    later = {"fp8_e4m3": cost.Cost(0, 1e-8, 9.0, "from 9 cases timed here 2026-12-07 22:00 UTC"), **fitted}
    _, source = cost.seconds(later, [p for p in points if p[0] == "bf16"], "cpu", 2)
    assert source == fitted["bf16"].source  # where the numbers it used come from, not the latest run


def test_without_a_run_here_the_estimate_is_a_guess_that_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cost.load("cpu") == {"bf16": cost.GUESS["cpu"]} and "guess" in cost.GUESS["cpu"].source
    cost.remember("cpu", {"bf16": cost.Cost(0.5, 1e-9, 3.0, "from 9 cases timed here 2026-12-07 10:00 UTC")})
    cost.remember("cpu", {"nvfp4": cost.Cost(0.7, 2e-9, 3.0, "from 4 cases timed here 2026-12-07 11:00 UTC")})
    kept = cost.load("cpu")
    assert kept["bf16"].overhead == 0.5 and list(kept) == ["nvfp4", "bf16"]  # the latest first
    assert cost.load("cuda") == {"bf16": cost.GUESS["cuda"]}
    (tmp_path / "a2a-tune" / "cost.json").write_text("{broken")
    assert cost.load("cpu") == {"bf16": cost.GUESS["cpu"]}


def test_a_run_teaches_the_next_plans_estimate(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "80"}
    args = ["--device", "cpu", "--preset", "mixtral-8x7b", "--tokens", "1,8", "--iters", "2", "--warmup", "0"]
    args += ["--backend", "allgather_reducescatter", "--backend", "nccl_all2allv", "--db", str(tmp_path / "s.db")]
    before = a2a("sweep", *args, "--dry-run", env_extra=env)
    assert before.returncode == 0 and "a guess: no run measured here yet" in before.stdout, before.stdout
    done = a2a("sweep", *args, "--no-progress", env_extra=env)
    assert done.returncode == 0, done.stderr
    kept = json.loads((tmp_path / "cache" / "a2a-tune" / "cost.json").read_text())["cpu"]
    kept = kept["bf16"]
    assert kept["per_element"] >= 0 and kept["overhead"] >= 0 and "4 cases timed here" in kept["source"]
    after = a2a("sweep", *args, "--dry-run", env_extra=env)
    assert "4 cases timed here" in after.stdout, after.stdout
    assert not [line for line in after.stdout.splitlines() if len(line) > 80]
    assert os.path.exists(tmp_path / "s.db")
