"""The gate judges a backend against copies of its inputs taken before dispatch (issue 31.1).

Backends that write into x, topk_ids or topk_weights, before or after sending, and return what
the damaged inputs call for (tests/support/input_writers.py) must FAIL with "wrote into its
inputs" in the invariant check, under virtual ranks, and in the sweep, where they are never
timed, stored or selected.
"""

from __future__ import annotations

import pytest
from input_writers import WRITERS
from invariant_cases import Case, run_cases, run_cases_virtual

from a2a_tune.db import open_store
from a2a_tune.kernels.reference import WROTE_INPUTS
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.shapes import ModelShape
from a2a_tune.tuner.sweep import SweepPlan, sweep


@pytest.fixture(scope="module")
def verdicts():
    cases = [Case(name, name, (6, 5), experts=8, topk=2, hidden=16) for name in WRITERS]
    cases.append(Case("honest", "nccl_all2allv", (6, 5), experts=8, topk=2, hidden=16))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "input_writers")
        return run_ranks(run_cases, 2, "cpu", cases)[0]


@pytest.mark.parametrize("name", WRITERS)
def test_a_backend_that_writes_into_its_inputs_fails_the_gate(verdicts, name):
    ok, _, reason, crashed = verdicts[name]
    assert not ok and not crashed
    assert WROTE_INPUTS in reason or reason == "failed on another rank", reason


def test_the_reason_names_the_input_written(verdicts):
    assert verdicts["planted_zero_weights"][2] == f"rank 0: {WROTE_INPUTS} (topk_weights)"
    assert verdicts["planted_writes_topk_ids_before"][2] == f"rank 0: {WROTE_INPUTS} (topk_ids)"
    assert verdicts["planted_halves_x"][2] == f"rank 0: {WROTE_INPUTS} (x)"
    assert verdicts["planted_halves_x"][1] == pytest.approx(0.5, rel=1e-3)  # judged against the copy
    assert verdicts["honest"][0]


def _virtual(ctx, cases):
    return run_cases_virtual("cpu", cases)


def test_virtual_ranks_judge_against_copies_too(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("A2A_TUNE_BACKEND_MODULES", "input_writers")
    name = "planted_virtual_halves_x"
    cases = [Case(name, name, (3, 2), experts=4, topk=2, hidden=8, dtype="bf16")]
    ok, _, reason, crashed = run_ranks(_virtual, 1, "cpu", cases)[0][name]
    assert not ok and not crashed
    assert reason == f"rank 0: {WROTE_INPUTS} (x)"


def test_the_sweep_never_times_stores_or_selects_a_backend_that_writes_into_its_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("A2A_TUNE_BACKEND_MODULES", "input_writers")
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    writers = ("planted_zero_weights", "planted_writes_when_timed")
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(4,),
        ep_sizes=(2,),
        backends=(*writers, "allgather_reducescatter"),
        warmup=1,
        iters=2,
        input_sets=1,
    )
    outcome = sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False, case_timeout=60)
    assert outcome.status == "completed"
    with open_store(url) as store:
        measured = {m.backend for m in store.measurements(outcome.run_id)}
        failures = {f.backend: (f.kind, f.reason) for f in store.failures(outcome.run_id)}
    assert measured == {"allgather_reducescatter"}
    assert failures["planted_zero_weights"] == ("incorrect", f"rank 0: {WROTE_INPUTS} (topk_weights)")
    kind, reason = failures["planted_writes_when_timed"]  # passed the gate, wrote while timed
    assert kind == "incorrect" and reason == f"{WROTE_INPUTS} (x) while timed"
