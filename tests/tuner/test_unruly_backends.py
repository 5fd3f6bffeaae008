"""Every call into an out-of-tree backend's classmethods is bounded and caught (issue 31.2):
availability() that raises, blocks or returns nonsense, feasibility() that raises
(tests/support/unruly_backends.py). One line naming the backend; the others go on."""

from __future__ import annotations

import time

import pytest
from run_cli import a2a

from a2a_tune.db import open_store
from a2a_tune.kernels import BackendEnv, availability_of, feasibility_of, get_backend
from a2a_tune.kernels.registry import CALL_TIMEOUT_ENV, CallFailed
from a2a_tune.tuner.plans import largest_case
from a2a_tune.tuner.shapes import ModelShape
from a2a_tune.tuner.sweep import SweepPlan, sweep

UNRULY = {"A2A_TUNE_BACKEND_MODULES": "unruly_backends", CALL_TIMEOUT_ENV: "1"}


@pytest.fixture
def unruly(monkeypatch):
    for name, value in UNRULY.items():
        monkeypatch.setenv(name, value)
    import unruly_backends  # noqa: F401  (registers them in this process)


def test_availability_that_raises_blocks_or_returns_nonsense_is_one_line(unruly):
    env = BackendEnv.local(2, "cpu")
    raised = availability_of(get_backend("planted_availability_raises"), env)
    assert isinstance(raised, CallFailed) and not raised.ok
    assert raised.reason == "availability() raised RuntimeError: planted: probing the fabric failed"
    start = time.monotonic()
    blocked = availability_of(get_backend("planted_availability_blocks"), env)
    assert time.monotonic() - start < 10
    assert blocked == (False, f"availability() did not return within 1 s ({CALL_TIMEOUT_ENV})")
    start = time.monotonic()
    assert availability_of(get_backend("planted_availability_blocks"), env) == blocked  # not asked again
    assert time.monotonic() - start < 0.5
    nonsense = availability_of(get_backend("planted_availability_nonsense"), env)
    assert not nonsense.ok and "not (ok, reason)" in nonsense.reason
    assert availability_of(get_backend("nccl_all2allv"), env) == (True, "")


def test_feasibility_that_raises_does_not_kill_the_plan(unruly):
    cls = get_backend("planted_feasibility_raises")
    from a2a_tune.kernels import MoEShape

    verdict = feasibility_of(cls, MoEShape(8, 2, 16, 4), 2)
    assert verdict == (False, "feasibility() raised ZeroDivisionError: planted: division by zero")
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(4,),
        ep_sizes=(2,),
        backends=("planted_feasibility_raises", "nccl_all2allv"),
    )
    largest, at = largest_case(plan, "cpu", 2)
    assert largest > 0 and at[2] == "nccl_all2allv"


def test_backends_lists_the_unruly_ones_with_their_reason():
    import json

    start = time.monotonic()
    r = a2a("backends", "--device", "cpu", "--json", env_extra=UNRULY)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    reasons = {b["backend"]: b["reason"] for b in json.loads(r.stdout)["backends"]}
    assert (
        reasons["planted_availability_raises"]
        == "availability() raised RuntimeError: planted: probing the fabric failed"
    )
    assert reasons["planted_availability_blocks"].startswith("availability() did not return within 1 s")
    assert reasons["nccl_all2allv"] is None
    assert time.monotonic() - start < 60


def _swept_past(tmp_path, *unruly: str) -> dict[str, tuple]:
    """A sweep of the `unruly` backends and allgather_reducescatter at 4 tokens/rank on 2 CPU
    ranks: it completes in bounded time with allgather_reducescatter measured; the failures
    recorded, backend -> (kind, tokens/rank, reason)."""
    url = f"sqlite:///{tmp_path / 'unruly.db'}"
    plan = SweepPlan(
        shapes=(ModelShape("tiny", 8, 2, 16),),
        tokens=(4,),
        ep_sizes=(2,),
        backends=(*unruly, "allgather_reducescatter"),
        warmup=0,
        iters=2,
        input_sets=1,
    )
    start = time.monotonic()
    outcome = sweep(plan, device_type="cpu", world_size=2, db_url=url, progress=False, case_timeout=60)
    assert time.monotonic() - start < 120
    assert outcome.status == "completed"
    with open_store(url) as store:
        assert {m.backend for m in store.measurements(outcome.run_id)} == {"allgather_reducescatter"}
        return {f.backend: (f.kind, f.tokens_per_rank, f.reason) for f in store.failures(outcome.run_id)}


def test_a_sweep_goes_on_past_unruly_backends(unruly, tmp_path):
    failures = _swept_past(
        tmp_path, "planted_availability_raises", "planted_availability_blocks", "planted_feasibility_raises"
    )
    assert failures["planted_availability_raises"][0] == "unavailable"
    assert "availability() raised RuntimeError" in failures["planted_availability_raises"][2]
    assert failures["planted_availability_blocks"][0] == "unavailable"
    assert failures["planted_feasibility_raises"] == (
        "error",
        4,
        "feasibility() raised ZeroDivisionError: planted: division by zero",
    )


def test_knobs_that_raise_block_or_return_nonsense_fail_their_case_and_the_sweep_goes_on(unruly, tmp_path):
    """knobs() is asked of a built backend once its case is timed: raising on rank 0, blocking
    on rank 1 (past the 1 s bound) or returning a list is an error of that case, one line, on
    every rank (the other rank does not wait for ever), and the next backend is measured."""
    failures = _swept_past(tmp_path, "planted_knobs_raises", "planted_knobs_blocks", "planted_knobs_nonsense")
    assert failures == {
        "planted_knobs_raises": ("error", 4, "knobs() raised KeyError: 'planted: no such setting'"),
        "planted_knobs_blocks": ("error", 4, f"rank 1: knobs() did not return within 1 s ({CALL_TIMEOUT_ENV})"),
        "planted_knobs_nonsense": ("error", 4, "knobs() returned ['planted'], not a dict"),
    }
