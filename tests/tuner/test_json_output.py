"""`--json` on every command that prints a result: JSON alone on standard output, in the shapes
README.md's "JSON output" section documents; `--dry-run` prints the plan and starts nothing (issue 30)."""

from __future__ import annotations

import json

from paths import REPO
from run_cli import a2a
from typer.testing import CliRunner

from a2a_tune.tuner.cli import app

H200 = REPO / "profiles" / "h200.nvl18x2.node1.json"
SMALL = ("--device", "cpu", "--preset", "mixtral-8x7b", "--tokens", "1,16", "--no-progress")


def invoke_json(*args) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_presets_backends_and_evaluate_print_json():
    presets = {p["name"]: p for p in invoke_json("presets")["presets"]}
    assert presets["mixtral-8x7b"] == {
        "name": "mixtral-8x7b",
        "num_experts": 8,
        "topk": 2,
        "hidden": 4096,
        "moe_layers": 32,
    }
    listed = invoke_json("backends", "--device", "cpu")
    assert listed["device"] == "cpu" and listed["world_size"] == 2
    ag = next(b for b in listed["backends"] if b["backend"] == "allgather_reducescatter")
    assert (ag["engines"], ag["available"], ag["reason"]) == (
        {"vllm": "allgather_reducescatter", "sglang": None, "trtllm": "ALLGATHER"},
        True,
        None,
    )
    ours = next(b for b in listed["backends"] if b["backend"] == "nvlink_one_sided")
    assert ours["closest"] == {"vllm": "flashinfer_nvlink_one_sided"} and not any(ours["engines"].values())
    ev = invoke_json("evaluate", "--profile", str(H200), "--table-points")
    assert ev["points"] == ev["policies"]["table"]["points"] > 0
    assert {e["engine"] for e in ev["engines"]} == {"vllm", "sglang", "trtllm"}
    assert all("table_defaulted" in e for e in ev["engines"] if e["points"])


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    db = tmp_path / "s.db"
    for command in ("sweep", "run"):
        plan = invoke_json(command, *SMALL, "--db", str(db), "--dry-run")
        assert plan["dry_run"] and plan["device"] == "cpu" and plan["world_size"] == 2
        assert plan["plan"]["tokens"] == [1, 16] and "allgather_reducescatter" in plan["backends_here"]
        assert plan["cases"] == 2 * len(plan["backends_here"])
    assert not db.exists()  # nothing opened, nothing stored
    human = CliRunner().invoke(app, ["sweep", *SMALL, "--db", str(db), "--dry-run"], env={"COLUMNS": "80"})
    assert human.exit_code == 0 and "plan: 2 cpu rank(s)" in human.stdout and not db.exists()
    assert plan["ep_sizes"] == [{"ep_size": 2, "groups": 1, "cases": plan["cases"], "skipped": []}]


def test_run_json_is_the_outcome_and_its_table(tmp_path):
    out = tmp_path / "profiles"
    args = ("run", "--device", "cpu", "--preset", "mixtral-8x7b", "--tokens", "1", "--iters", "1", "--warmup", "0")
    r = a2a(
        *args,
        "--backend",
        "allgather_reducescatter",
        "--db",
        str(tmp_path / "s.db"),
        "--out",
        str(out),
        "--no-progress",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)  # standard output: the JSON alone
    assert (data["run"], data["status"], data["measured"], data["entries"]) == (1, "completed", 1, 1)
    [path] = data["tables"].values()
    assert path.startswith(str(out)) and json.loads(open(path).read())["entries"]
    assert "wrote" in r.stderr and "look it up" in r.stderr


def test_the_package_says_its_version():
    from importlib.metadata import version

    import a2a_tune

    assert a2a_tune.__version__ == version("a2a-tune")
    r = CliRunner().invoke(app, ["--version"])
    assert r.stdout.split() == ["a2a-tune", a2a_tune.__version__]
