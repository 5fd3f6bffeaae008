"""scripts/device_summary.py's figures: what a device call reports against issue 38's bounds."""

import importlib.util
import json
import subprocess
import sys

import paths

SCRIPT = paths.REPO / "scripts" / "device_summary.py"


def _module():
    spec = importlib.util.spec_from_file_location("device_summary", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quant(payload, hidden, tokens, share, bad=0):
    return {"payload": payload, "hidden": hidden, "tokens": tokens, "share_of_copy": share, "mismatched_bytes": bad}


def test_each_quantizer_reports_its_worst_share_of_the_copy_per_bound():
    rows = [_quant("nvfp4", 4096, 128, 0.61), _quant("nvfp4", 4096, 2048, 0.9), _quant("nvfp4", 4096, 16384, 0.88, 2)]
    rows.append(_quant("nvfp4", 4096, 1, 0.05))  # T = 1: no bound asked
    got = _module().quant_rows(rows)
    assert got == [
        ("quantize nvfp4, H 4096, T >= 2048", "88% of copy, 2 bytes off", ">= 85%"),
        ("quantize nvfp4, H 4096, T = 128", "61% of copy, 0 bytes off", ">= 50%"),
    ]


def test_the_planted_halves_report_their_worst_error_against_the_spin():
    timing = {
        "b/eager/base": {"dispatch": 100.0, "combine": 50.0},
        "b/eager/1600/200": {"dispatch": 1820.0, "combine": 252.0},  # +7.5%, +1%
        "b/eager/200/1600": {"dispatch": 297.0, "combine": 1650.0},  # -1.5%, 0%
    }
    figures = {"timing": timing, "planted": {"base": [0, 0], "1600/200": [1600, 200], "200/1600": [200, 1600]}}
    (row,) = _module().halves_rows(figures)
    assert row == ("planted halves: b (eager)", "worst +7.5% over 4 halves", "within 5%")


def test_the_summary_prints_the_figures_table(tmp_path):
    quant = tmp_path / "quant.json"
    quant.write_text(json.dumps([_quant("mxfp8", 7168, 2048, 0.93)]))
    steps = tmp_path / "steps.tsv"
    steps.write_text("bench/quant.py\tok\t9\n")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", str(steps), "--quant", str(quant)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "figures against their bounds" in out.stdout and "93% of copy" in out.stdout
