"""The plan's edge (issues 35.2, 35.18, 37.7, 37.12): repeated shapes and options are measured
once, integers are ASCII digits with no empty item, and --resume of a changed plan says which
stored run did not match and why."""

from __future__ import annotations

import sqlite3

import pytest
from run_cli import a2a

from a2a_tune.tuner.plans import PlanError, SweepOptions, SweepPlan, build_plan, parse_ep_sizes, parse_tokens
from a2a_tune.tuner.shapes import ModelShape, preset

TINY = ModelShape("tiny", 16, 2, 16)
AR = "allgather_reducescatter"


def test_two_presets_of_one_shape_and_repeated_options_are_measured_once_said_in_one_line():
    notes: list[str] = []
    options = SweepOptions(
        device="cpu",
        world=2,
        preset=["minimax-m2", "qwen3.5-122b-a10b", "minimax-m2"],
        tokens="1",
        dtype=["bf16", "fp16", "bf16"],
        routing=["uniform", "uniform"],
        backend=[AR, AR],
    )
    plan, _, _ = build_plan(options, note=notes.append)
    assert plan.shapes == (preset("minimax-m2"),)
    assert (plan.dtypes, plan.routings, plan.backends) == (("bf16", "fp16"), ("uniform",), (AR,))
    assert notes == [
        "note: measured once: qwen3.5-122b-a10b (the shape of minimax-m2), minimax-m2 (the shape of minimax-m2), "
        "--dtype bf16 (repeated), --routing uniform (repeated), --backend allgather_reducescatter (repeated)"
    ]
    keys = [(c.shape, b) for c in plan.cases() for b in c.backends]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("text", ["2_0", "\u0662", "2,,4", "2,", "2 4", ",", ""])
def test_integers_are_ascii_digits_with_no_empty_item(text):
    # 2_0 was read as 20 and Arabic-Indic 2 as 2; 1,,8 was accepted silently
    with pytest.raises(PlanError, match=r"^--ep-sizes must be comma-separated integers \(digits 0-9\), got "):
        parse_ep_sizes(text, 64, [TINY])
    with pytest.raises(PlanError, match=r"^--tokens must be comma-separated integers"):
        parse_tokens(text.replace("2", "1"))
    assert parse_tokens(" 8, 1 ") == (1, 8)


def test_the_command_line_refuses_them_in_one_line_exit_2():
    for option, value in (("--ep-sizes", "2_0"),):  # --tokens 1,,8 takes the same path (parse_tokens above)
        r = a2a("sweep", "--device", "cpu", "--world", "4", "--preset", "mixtral-8x7b", option, value, "--dry-run")
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"error: {option} must be comma-separated integers (digits 0-9), got '{value}'"
        ]


@pytest.mark.slow
@pytest.mark.timeout(900)  # four CPU sweeps of 2 ranks: about 40 s alone, minutes on a loaded machine
def test_same_shape_presets_sweep_and_resume_counts_and_a_changed_plan_is_named(tmp_path):
    db = tmp_path / "a.db"
    common = ("--device", "cpu", "--world", "2", "--iters", "2", "--warmup", "0", "--db", str(db), "--no-progress")
    # two presets of one shape and a repeated backend crashed with DuplicateMeasurementError after measuring
    r = a2a(
        "sweep",
        *common,
        "--preset",
        "deepseek-v3",
        "--preset",
        "deepseek-v3.2",
        "--backend",
        AR,
        "--backend",
        AR,
        "--tokens",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert "note: measured once: deepseek-v3.2 (the shape of deepseek-v3)" in r.stderr
    assert "run 1 (completed)" in r.stdout and "1 measured, 0 already stored" in r.stdout
    with sqlite3.connect(db) as c:
        c.execute("update runs set status = 'interrupted'")  # as a Ctrl-C leaves it
    plan = ("--preset", "deepseek-v3", "--backend", AR)
    # the changed plan: refused in one line, naming the run and what differs; nothing started
    r = a2a("sweep", *common, *plan, "--tokens", "1,8", "--resume")
    assert r.returncode == 1
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--resume: this machine's latest run, run 1 (interrupted), has another plan: tokens [1, 8] here, "
            "[1] there; rerun with its options to resume it, or without --resume to start a new run"
        )
    )
    # the same plan (the repeats folded) resumes it: one row stored, counted once
    r = a2a("sweep", *common, *plan, "--tokens", "1", "--resume")
    assert r.returncode == 0, r.stderr
    assert "run 1 (completed)" in r.stdout and "0 measured, 1 already stored" in r.stdout
    # nothing unfinished: a new run, said so
    r = a2a("sweep", *common, *plan, "--tokens", "1,8", "--resume")
    assert r.returncode == 0, r.stderr
    assert (
        "--resume: no unfinished run of this plan on this machine (the latest, run 1, completed); started run 2"
        in r.stderr
    )
    assert "run 2 (completed)" in r.stdout and "2 measured, 0 already stored" in r.stdout


def test_plans_hash_as_before_the_world_was_spelled_out():
    """Compatibility rule (SweepPlan.config_hash): the plan states its EP sizes, the world's
    too; a plan of the world alone hashes without them, as runs stored before did, so they
    resume. The hashes below are what the code before this rule gave for these plans."""
    common = dict(shapes=(ModelShape("m", 8, 2, 64, 32),), tokens=(1, 8), backends=(AR,), warmup=3, iters=15)
    world_alone = SweepPlan(**common, ep_sizes=(2,))
    assert world_alone.to_dict()["ep_sizes"] == [2]  # no sentinel: stored as measured
    assert world_alone.config_hash("cpu", 2) == "f772404b719225b9"
    assert SweepPlan(**common, ep_sizes=(4, 2)).config_hash("cpu", 4) == "b5378e8dda9e7734"
    assert world_alone.config_hash("cpu", 4) != "f772404b719225b9"  # EP 2 of 4 ranks is not the world
    plan, _, world = build_plan(
        SweepOptions(device="cpu", world=2, preset=["mixtral-8x7b"], tokens="1,8", backend=[AR])
    )
    assert plan.ep_sizes == (world,)  # build_plan states the world too
