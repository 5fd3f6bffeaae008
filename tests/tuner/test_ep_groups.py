"""EP sizes as a sweep axis (issue 27) on CPU ranks over gloo: groups of consecutive ranks, every
group at once, gated per group, the slowest group's figure stored with each group's median,
a slow group flagged, the table answering each size, a killed multi-size run resumed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_cli import a2a

from a2a_tune.db import StoreError, open_store
from a2a_tune.kernels import get_backend
from a2a_tune.tuner.groups import default_ep_sizes, group_ranks, slow_groups
from a2a_tune.tuner.plans import (
    PlanError,
    SweepPlan,
    check_plan,
    model_shapes,
    parse_ep_sizes,
    plan_sizes,
    world_left_out,
)
from a2a_tune.tuner.runtime.lookup import lookup
from a2a_tune.tuner.select import profile_from_store, write_profile
from a2a_tune.tuner.shapes import ModelShape, preset
from a2a_tune.tuner.sweep import sweep
from a2a_tune.tuner.views.load import load_view
from a2a_tune.tuner.views.show import show_data

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelShape("tiny", 16, 2, 16)
SLOW_RANK = 5  # EP 2: group 2 (ranks 4-5); EP 4: group 1 (ranks 4-7); EP 8: the one group
GOOD = ("allgather_reducescatter", "planted_slow_rank")


def test_default_sizes_are_the_powers_of_two_that_divide_the_world_and_the_world():
    assert default_ep_sizes(2) == (2,)
    assert default_ep_sizes(8) == (2, 4, 8)
    assert default_ep_sizes(6) == (2, 6)  # 4 does not divide 6 ranks
    assert default_ep_sizes(3) == (3,)
    assert default_ep_sizes(72) == (2, 4, 8, 72)  # not 16, 32, 64: no whole groups on 72 ranks
    assert default_ep_sizes(72, [256, 128, 8]) == (2, 4, 8)  # 72 divides none of the experts
    assert default_ep_sizes(3, [32]) == ()  # the plan then refuses the model at the world
    assert list(group_ranks(4, 1)) == [4, 5, 6, 7]


def test_the_default_plan_on_72_ranks_lists_only_sizes_that_divide_the_world_and_experts():
    shapes = model_shapes((), ())  # the default presets
    sizes = parse_ep_sizes(None, 72, shapes)
    assert sizes == (2, 4, 8)
    plan = SweepPlan(shapes=tuple(shapes), tokens=(1,), backends=GOOD[:1], ep_sizes=sizes)
    rows = plan_sizes(plan, "cpu", 72)
    assert [(r.ep_size, r.groups) for r in rows] == [(2, 36), (4, 18), (8, 9)]
    assert all(72 % r.ep_size == 0 for r in rows)
    assert world_left_out(plan, 72) == (
        "EP 72 (the world): not measured, no model's experts (256, 128, 8) divide over it"
    )
    assert parse_ep_sizes(None, 24, shapes) == (2, 4, 8)
    assert parse_ep_sizes(None, 6, [preset("gpt-oss-20b")]) == (2,)


def test_docs_state_the_default_sizes_the_program_plans():
    text = (ROOT / "docs" / "ep-sizes.md").read_text()
    rows = re.findall(r"^\| (\d+)[^|]* \| ([\d, ]+)", text, re.M)
    assert [r[0] for r in rows] == ["8", "24", "72"]
    shapes = model_shapes((), ())
    for ranks, sizes in rows:
        assert parse_ep_sizes(None, int(ranks), shapes) == tuple(int(s) for s in sizes.split(",")), ranks
    plan = SweepPlan(shapes=tuple(shapes), tokens=(1,), ep_sizes=parse_ep_sizes(None, 72, shapes))
    assert f"`{world_left_out(plan, 72)}`" in " ".join(text.split())
    assert parse_ep_sizes(None, 64, shapes) == (2, 4, 8, 16, 32, 64)
    assert "are 2, 4, 8, 16, 32 and 64" in " ".join(text.split())


def test_a_world_no_size_fits_is_refused_in_one_line_before_any_rank_starts():
    # on today's defaults this planned EP 2 on 3 ranks, started them, and failed in rank 1
    r = a2a(
        "sweep",
        "--device",
        "cpu",
        "--world",
        "3",
        "--preset",
        "gpt-oss-20b",
        "--tokens",
        "1",
        "--backend",
        "nccl_all2allv",
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: gpt-oss-20b (ep_size=3 hidden=2880 topk=4 num_experts=32 dtype=bf16 routing=uniform): "
        "32 experts do not divide over 3 ranks"
    ]


def test_a_group_more_than_ten_percent_slower_than_the_median_group_is_flagged():
    assert slow_groups([10.0, 10.5, 11.8, 10.2]) == [2]  # median 10.35
    assert slow_groups([10.0, 10.9, 10.2]) == []
    assert slow_groups([10.0]) == []


def test_sizes_that_do_not_divide_are_refused_and_a_default_one_is_skipped_for_the_model():
    with pytest.raises(PlanError, match="--ep-sizes 3: an EP size must be at least 2 and divide the 8 ranks"):
        parse_ep_sizes("2,3", 8, [TINY])
    with pytest.raises(PlanError, match="--ep-sizes 8: e12's 12 experts do not divide over it"):
        parse_ep_sizes("4,8", 8, [ModelShape("e12", 12, 2, 16)])
    with pytest.raises(PlanError, match="comma-separated"):
        parse_ep_sizes("two", 8, [TINY])
    # the default sizes: 8 does not divide 12 experts, so that model is skipped at EP 8, said so
    plan = SweepPlan(shapes=(ModelShape("e12", 12, 2, 16),), tokens=(4,), backends=GOOD[:1], ep_sizes=(2, 4, 8))
    check_plan(plan, "cpu", 8, budget=(None, "not checked"))
    rows = {r.ep_size: r for r in plan_sizes(plan, "cpu", 8)}
    assert (rows[2].groups, rows[4].groups, rows[8].groups) == (4, 2, 1)
    assert (rows[4].cases, rows[8].cases) == (1, 0)
    assert rows[8].skipped == ["e12 bf16 uniform at EP 8: 12 experts do not divide over 8 ranks"]
    assert plan.total() == 2  # only the cases that can run
    # a shape no size can measure is refused whole
    with pytest.raises(PlanError, match="do not divide"):
        check_plan(
            SweepPlan(shapes=(ModelShape("e6", 6, 2, 16),), tokens=(4,), ep_sizes=(4, 8)), "cpu", 8, budget=(None, "")
        )


def test_a_size_that_does_not_divide_the_world_is_refused_before_any_rank_starts(tmp_path):
    db = tmp_path / "t.db"
    r = a2a(
        "sweep",
        "--device",
        "cpu",
        "--world",
        "4",
        "--preset",
        "mixtral-8x7b",
        "--tokens",
        "1",
        "--ep-sizes",
        "2,3",
        "--db",
        str(db),
        "--no-progress",
    )
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --ep-sizes 3: an EP size must be at least 2 and divide the 4 ranks"
    )
    assert "plan:" not in r.stdout and not db.exists()


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    """One sweep on 8 gloo ranks at EP 2, 4 and 8, rank 5 slow, the last two ranks wrong."""
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'ep.db'}"
    plan = SweepPlan(
        shapes=(TINY,),
        tokens=(4,),
        backends=(*GOOD, "planted_wrong_last_ranks"),
        warmup=1,
        iters=3,
        input_sets=1,
        ep_sizes=(2, 4, 8),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
        mp.setenv("A2A_TUNE_TEST_SLOW_RANK", str(SLOW_RANK))
        outcome = sweep(plan, device_type="cpu", world_size=8, db_url=url, progress=False)
    with open_store(url) as store:
        measurements, failures = store.measurements(outcome.run_id), store.failures(outcome.run_id)
    return url, outcome, measurements, failures


def test_every_size_is_measured_on_its_groups_with_each_groups_median(eight):
    _, outcome, measurements, _ = eight
    assert (outcome.status, outcome.measured) == ("completed", 2 * 3)
    assert {(m.backend, m.point.ep_size) for m in measurements} == {(b, s) for b in GOOD for s in (2, 4, 8)}
    for m in measurements:
        per_group = m.figure("group_us")
        assert len(per_group) == 8 // m.point.ep_size and all(us > 0 for us in per_group)
        # the stored samples are the max over every group's ranks per sample: never below a group's median
        assert m.median_us >= max(per_group) - 1e-3


def test_every_group_is_gated_before_timing(eight):
    _, _, measurements, failures = eight
    assert not [m for m in measurements if m.backend == "planted_wrong_last_ranks"]
    wrong = {f.ep_size: f for f in failures if f.backend == "planted_wrong_last_ranks"}
    assert set(wrong) == {2, 4, 8} and {f.kind for f in wrong.values()} == {"incorrect"}
    # only the last group holds the wrong ranks: its own gate caught it
    assert wrong[2].reason.startswith("group 3 (ranks 6-7): ")
    assert wrong[4].reason.startswith("group 1 (ranks 4-7): ")
    assert not wrong[8].reason.startswith("group")


def test_a_slow_rank_makes_its_group_the_slowest_and_flagged(eight):
    url, _, measurements, _ = eight
    slow = {m.point.ep_size: m.figure("group_us") for m in measurements if m.backend == "planted_slow_rank"}
    for size, per_group in slow.items():
        assert max(range(len(per_group)), key=per_group.__getitem__) == SLOW_RANK // size
    data = show_data(load_view(db=url))
    flagged = {(f["ep_size"], f["group"]): f for f in data["suspect_groups"]}
    assert flagged[(2, 2)]["ranks"] == [4, 5] and flagged[(4, 1)]["ranks"] == [4, 5, 6, 7]
    assert flagged[(2, 2)]["hosts"] and flagged[(2, 2)]["worst_at"]["backend"] == "planted_slow_rank"
    assert not [f for f in data["suspect_groups"] if f["ep_size"] == 8]  # one group: nothing to compare
    # show --json: per EP size, backend and token count, each group's median in group order
    by_size = {s["ep_size"]: s for s in data["shapes"]}
    assert set(by_size) == {2, 4, 8}
    for size, s in by_size.items():
        assert s["tokens"] == [4] and [len(g) for g in s["group_us"]["planted_slow_rank"]] == [8 // size]
        assert s["group_us"]["planted_slow_rank"] == [slow[size]]


def test_the_table_answers_each_measured_size(eight, tmp_path):
    import planted_backends  # noqa: F401  (tests/support: the ranks load it by env; select names its backends)

    url, outcome, _, _ = eight
    names = {n: {"engines": get_backend(n).engine_names} for n in GOOD}
    with open_store(url) as store:
        profile = profile_from_store(store, outcome.run_id, backend_names=names)
    path = write_profile(profile, tmp_path)
    for size in (2, 4, 8):
        choice = lookup(ep_size=size, hidden=16, topk=2, num_experts=16, tokens=4, profile=path)
        assert choice.match == "exact" and choice.backend in GOOD


def test_a_killed_multi_size_run_resumes_and_measures_nothing_twice(tmp_path):
    """EP 2 is stored, EP 4 hangs at a gate: the sweep is killed (SIGKILL, every rank), then
    `--resume` measures only what EP 4 had not stored."""
    db = tmp_path / "t.db"
    gate = tmp_path / "gate"
    gate.touch()
    env = {
        **os.environ,
        "COLUMNS": "200",
        "A2A_TUNE_BACKEND_MODULES": "planted_backends",
        "A2A_TUNE_TEST_GATE": str(gate),
        "A2A_TUNE_TEST_GATE_SIZE": "4",
    }
    args = [
        "sweep",
        "--device",
        "cpu",
        "--world",
        "4",
        "--ep-sizes",
        "2,4",
        "--preset",
        "mixtral-8x7b",
        "--tokens",
        "1,4",
        "--backend",
        "allgather_reducescatter",
        "--backend",
        "planted_gate_at_size",
        "--iters",
        "2",
        "--warmup",
        "0",
        "--db",
        str(db),
        "--no-progress",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "a2a_tune.tuner.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 150
    stored = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            try:
                with open_store(f"sqlite:///{db}", readonly=True) as store:
                    runs = store.runs()
                    stored = store.measurements(runs[0].id) if runs else []
            except StoreError:  # not created, or not migrated yet
                continue
            if len([m for m in stored if m.point.ep_size == 2]) == 4:  # EP 2 stored: EP 4 is next, at its gate
                time.sleep(2)
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and every rank it spawned
        proc.wait()
    with open_store(f"sqlite:///{db}", readonly=True) as store:
        before = {m.key for m in store.measurements(store.runs()[0].id)}
    assert len([k for k in before if k.ep_size == 2]) == 4, "EP 2 was not stored before the kill"
    assert len(before) < 8
    gate.unlink()
    r = a2a(*args, "--resume", env_extra={"A2A_TUNE_BACKEND_MODULES": "planted_backends"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{8 - len(before)} measured, {len(before)} already stored" in r.stdout
    with open_store(f"sqlite:///{db}", readonly=True) as store:
        (run,) = store.runs()
        after = [m.key for m in store.measurements(run.id)]
    assert len(after) == len(set(after)) == 8 and before <= set(after)
    assert {(k.ep_size, k.tokens_per_rank) for k in after} == {(s, t) for s in (2, 4) for t in (1, 4)}


def test_a_cpu_rehearsal_never_blames_a_gpu_link_or_nic_for_a_slow_group(tmp_path):
    """Issue 37: `run --device cpu --world 4 --ep-sizes 2` (stored: 2 groups of 2 ranks on 2 loaded
    cores) made show warn "suspect a GPU, link or NIC" for a group that was slower only because
    the ranks share the host's cores. It says so, as a note, and no hardware is suspected."""
    import shutil

    from paths import FIXTURES
    from typer.testing import CliRunner

    from a2a_tune.tuner.cli import app

    db = shutil.copy(FIXTURES / "db" / "cpu_world4_ep2.db", tmp_path / "s.db")
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", str(db)]).exit_code == 0  # stored at 0004_ep
    data = show_data(load_view(db=str(db)))
    assert data["suspect_groups"] and {f["cause"] for f in data["suspect_groups"]} == {"shared cores"}
    for width in ("80", "200"):
        r = CliRunner().invoke(app, ["show", "--db", str(db)], env={"COLUMNS": width})
        assert r.exit_code == 0, r.output
        text = " ".join(r.stdout.split())
        assert "suspect" not in text and "GPU, link or NIC" in text and "share the host's cores" in text


def test_show_counts_a_runs_duration_from_its_command_start_up_included(tmp_path):
    """Issue 37: show said "(3 s)" for a run whose command took 27 s: the run was dated when its
    ranks opened it, after their start-up. Now the command's start is stored with the run, and
    show's duration runs from it to the end: a start-up of several seconds is in it."""
    from slow_startup import STARTUP_S

    db = tmp_path / "s.db"
    before = time.time()
    args = ("--device", "cpu", "--world", "2", "--preset", "mixtral-8x7b", "--tokens", "1")
    args += ("--backend", "allgather_reducescatter", "--iters", "2", "--warmup", "0", "--no-progress")
    r = a2a("sweep", *args, "--db", str(db), env_extra={"A2A_TUNE_BACKEND_MODULES": "slow_startup"})
    after = time.time()
    assert r.returncode == 0, r.stdout + r.stderr
    with open_store(f"sqlite:///{db}", readonly=True) as store:
        (run,) = store.runs()
    assert run.resumed_at is None
    assert before <= run.launched_at.timestamp() <= run.started_at.timestamp() <= run.finished_at.timestamp() <= after
    # the sweep's process slept as it checked the plan, before any rank started
    assert (run.started_at - run.launched_at).total_seconds() >= STARTUP_S
    r = a2a("show", "--db", str(db))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    total = f"{(run.finished_at - run.launched_at).total_seconds():.0f} s"
    assert re.search(rf"measured {run.launched_at:%Y-%m-%d %H:%M} UTC \({total}\)", text), text[:600]
    assert "of measuring" not in text


def test_show_says_what_a_runs_duration_counts_where_the_start_was_not_recorded(tmp_path):
    """A store written before the command's start was recorded (this fixture: revision 0004)
    has only the moment the ranks opened the run: show keeps saying its span is the measuring."""
    import shutil

    from paths import FIXTURES
    from typer.testing import CliRunner

    from a2a_tune.tuner.cli import app

    db = shutil.copy(FIXTURES / "db" / "cpu_world4_ep2.db", tmp_path / "s.db")
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", str(db)]).exit_code == 0
    r = CliRunner().invoke(app, ["show", "--db", str(db)], env={"COLUMNS": "200"})
    text = " ".join(r.stdout.split())
    assert re.search(
        r"measured \S+ \S+ UTC \(\d+ s of measuring; the ranks' start-up before it is not recorded\)", text
    ), text[:400]
    run = show_data(load_view(db=str(db)))["run"]
    assert run["launched_at"] is None and run["resumed_at"] is None and run["started_at"]
