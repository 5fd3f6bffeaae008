"""Every number the lookup or the vLLM plugin reads is bounded (issue 35 items 13-17): outside
its bounds, one line and exit 2 on the command line; in the plugin, the field is not used and
the engine starts (a cosmetic field never costs the table's choice)."""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path

import pytest
from run_cli import a2a

from a2a_tune.tuner.runtime import vllm_plugin
from a2a_tune.tuner.runtime.models import moe_layer_count
from a2a_tune.tuner.runtime.point import PointError, check_tpot_ms

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "profiles" / "h200.nvl18x2.node1.json"
LOOKUP = ["lookup", "--ep-size", "2", "--preset", "mixtral-8x7b", "--tokens", "4", "--profile", str(SHIPPED)]


def _one_line_refusal(r, option: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and option in line and "Traceback" not in r.stderr


@pytest.mark.parametrize("fmt", ["name", "json"])
@pytest.mark.parametrize("layers", ["1" + "0" * 400, str(10**23), "1025"])
def test_lookup_refuses_moe_layers_out_of_bounds(fmt, layers):
    r = a2a(*LOOKUP, "--moe-layers", layers, "--format", fmt)
    _one_line_refusal(r, "--moe-layers")
    if fmt == "json":
        assert json.loads(r.stdout)["exit_code"] == 2


@pytest.mark.parametrize("tpot", ["inf", "1e400", "1e-320", "0", "1e7", "nan", "-1"])
def test_lookup_refuses_a_tpot_out_of_bounds_and_the_plugin_ignores_the_same(tpot, monkeypatch):
    r = a2a(*LOOKUP, "--tpot-ms", tpot, "--format", "json")
    _one_line_refusal(r, "--tpot-ms")
    assert "Infinity" not in r.stdout and "NaN" not in r.stdout
    monkeypatch.setenv("A2A_TUNE_TPOT_MS", tpot)
    value, ignored = vllm_plugin._tpot_ms()
    assert value is None and "ignored" in ignored  # the engine's start-up: one warning, no share of TPOT


def test_a_tpot_in_bounds_is_a_finite_share_in_json():
    r = a2a(*LOOKUP, "--moe-layers", "32", "--tpot-ms", "0.001", "--format", "json")
    assert r.returncode == 0, r.stderr
    share = json.loads(r.stdout)["vs_default"]["share_of_tpot"]  # json.loads would take Infinity: check it
    assert share is None or math.isfinite(share)
    assert check_tpot_ms(0.001) == 0.001
    for bad in (True, math.nan, "5"):
        with pytest.raises(PointError):
            check_tpot_ms(bad)


@pytest.mark.parametrize("option", ["--hidden", "--topk", "--experts"])
def test_a_zero_beside_a_preset_is_refused_as_without_it(option):
    r = a2a(*LOOKUP, option, "0")
    _one_line_refusal(r, option)


@pytest.mark.parametrize(
    "cfg, layers",
    [
        ({"num_hidden_layers": 10**309}, None),
        ({"num_hidden_layers": 1025}, None),
        ({"num_hidden_layers": 48, "mlp_only_layers": [[1]]}, None),
        ({"num_hidden_layers": 48, "mlp_only_layers": "1"}, None),
        ({"num_hidden_layers": 48, "mlp_only_layers": [0, 0, 1]}, 46),
        ({"num_hidden_layers": 48, "decoder_sparse_step": 2, "mlp_only_layers": [1]}, 23),
    ],
)
def test_the_moe_layer_count_of_a_config_is_bounded(cfg, layers):
    assert moe_layer_count(cfg) == layers


def test_a_config_with_nested_dense_layers_plans(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "qwen3_moe",
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "hidden_size": 64,
                "num_hidden_layers": 4,
                "mlp_only_layers": [[1]],
            }
        )
    )
    r = a2a("sweep", "--device", "cpu", "--world", "2", "--model-config", str(cfg), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dry_run"] is True


DAMAGED = {"gpus": 5, "islands": "x", "hostnames": 3}


def test_show_and_report_read_a_table_with_damaged_facts(tmp_path):
    table = json.loads(SHIPPED.read_text())
    table["hardware"]["facts"] = DAMAGED
    path = tmp_path / SHIPPED.name
    path.write_text(json.dumps(table))
    shown = a2a("show", "--profile", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "probe facts: gpus, islands, hostnames damaged" in shown.stdout + shown.stderr
    report = a2a("report", "--profile", str(path), "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr


def test_show_of_a_run_whose_hardware_row_is_damaged(tmp_path):
    db = tmp_path / "s.db"
    args = "sweep --device cpu --world 2 --preset mixtral-8x7b --tokens 1 --warmup 0 --iters 2 --no-progress"
    r = a2a(*args.split(), "--backend", "allgather_reducescatter", "--db", str(db))
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(db) as c:
        c.execute("update hardware set facts = ?", (json.dumps(DAMAGED),))
    for command in (["show"], ["report", "--out", os.fspath(tmp_path / "r.html")]):
        r = a2a(*command, "--db", str(db), "--run", "1")
        assert r.returncode == 0, r.stderr
