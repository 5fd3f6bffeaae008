"""nvlink_one_sided's and nvlink_low_latency's Triton kernels on CPU: all ranks in one process under TRITON_INTERPRET.

The kernels write through raw peer addresses and signal with flags; here every "peer" is a
CPU buffer of the same process, and the ranks run each phase in turn (one legal schedule).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

EMULATOR = Path(__file__).parent / "support" / "emulate_nvlink.py"

CASES = [
    {"id": "w2-fp32", "world": 2, "experts": 8, "topk": 2, "hidden": 16, "tokens": [3, 2]},
    {"id": "w2-bf16-odd-hidden", "world": 2, "experts": 8, "topk": 3, "hidden": 33, "tokens": [4, 5], "dtype": "bf16"},
    {"id": "w2-zero-tokens", "world": 2, "experts": 8, "topk": 2, "hidden": 8, "tokens": [0, 4]},
    {"id": "w3-skewed", "world": 3, "experts": 12, "topk": 3, "hidden": 8, "tokens": [5, 1, 3], "routing": "skewed"},
    {"id": "w3-all-local", "world": 3, "experts": 12, "topk": 2, "hidden": 8, "tokens": [2, 2, 2], "routing": "local"},
    {
        "id": "w2-repeated-no-host-barrier",
        "world": 2,
        "experts": 8,
        "topk": 2,
        "hidden": 8,
        "tokens": [3, 4],
        "repeats": 4,
    },
    {"id": "w2-zero-tokens-repeated", "world": 2, "experts": 8, "topk": 2, "hidden": 8, "tokens": [0, 3], "repeats": 3},
    {"id": "w4-bf16", "world": 4, "experts": 16, "topk": 4, "hidden": 8, "tokens": [2, 3, 0, 1], "dtype": "bf16"},
    # EP 8, an HGX node: every rank a peer of every other (issue 7's machines)
    {
        "id": "w8-skewed",
        "world": 8,
        "experts": 16,
        "topk": 4,
        "hidden": 8,
        "tokens": [3, 0, 1, 2, 4, 1, 0, 2],
        "routing": "skewed",
    },
    {
        "id": "w8-fp8",
        "world": 8,
        "experts": 32,
        "topk": 8,
        "hidden": 128,
        "tokens": [1, 2, 0, 1, 1, 2, 1, 1],
        "dtype": "fp8_e4m3",
    },
    {
        "id": "w2-fp8-block-scales",
        "world": 2,
        "experts": 8,
        "topk": 2,
        "hidden": 256,
        "tokens": [3, 2],
        "dtype": "fp8_e4m3",
    },
    {
        "id": "w3-fp8-odd-hidden",
        "world": 3,
        "experts": 6,
        "topk": 2,
        "hidden": 136,
        "tokens": [2, 0, 3],
        "dtype": "fp8_e4m3",
    },
    # knobs: rows copied in several steps (N_HB > 1), combine_recv over several H blocks,
    # dispatch_recv (low latency) over several row blocks; num_warps passes through
    {
        "id": "w2-knobs-small-blocks",
        "world": 2,
        "experts": 8,
        "topk": 2,
        "hidden": 1100,
        "tokens": [5, 3],
        "repeats": 2,
        "knobs": {
            "row_block_bytes": 2048,
            "recv_block_h": 512,
            "recv_block_rows": 16,
            "send_num_warps": 1,
            "recv_num_warps": 8,
        },
    },
    {
        "id": "w3-knobs-bf16-large-blocks",
        "world": 3,
        "experts": 6,
        "topk": 2,
        "hidden": 40,
        "tokens": [2, 0, 3],
        "dtype": "bf16",
        "knobs": {"row_block_bytes": 32768, "recv_block_h": 4096, "recv_block_rows": 256, "send_num_warps": 16},
    },
    {
        "id": "w2-knobs-fp8",
        "world": 2,
        "experts": 8,
        "topk": 2,
        "hidden": 2176,
        "tokens": [3, 2],
        "dtype": "fp8_e4m3",
        "knobs": {"row_block_bytes": 2048, "recv_block_h": 512},
    },
    {
        "id": "planted-off-by-one-slot",
        "world": 2,
        "experts": 8,
        "topk": 2,
        "hidden": 8,
        "tokens": [4, 4],
        "plant": "off_by_one_slot",
    },
]
# the same cases through the low-latency (expert-major) kernels
CASES += [{**c, "id": "ll-" + c["id"], "backend": "low_latency"} for c in list(CASES)]
# one-sided with a workspace larger than the step (an engine's capacity) and the step's size
# changing between rounds (set_step_tokens): rows pack at the regions' start, nothing stale
CASES += [
    {
        "id": "w2-step-below-capacity",
        "world": 2,
        "experts": 8,
        "topk": 2,
        "hidden": 16,
        "tokens": [3, 2],
        "capacity": 12,
        "steps": [4, 3, 8],
        "repeats": 3,
    },
    {
        "id": "w3-fp8-step-below-capacity",
        "world": 3,
        "experts": 6,
        "topk": 2,
        "hidden": 128,
        "tokens": [2, 0, 3],
        "dtype": "fp8_e4m3",
        "capacity": 9,
        "steps": [3, 5],
        "repeats": 2,
    },
]


@pytest.fixture(scope="module")
def results():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, str(EMULATOR), json.dumps(CASES)], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["id"]: r for r in json.loads(out.stdout)}


@pytest.mark.parametrize("case", [c["id"] for c in CASES if "plant" not in c])
def test_kernels_satisfy_the_invariant(results, case):
    r = results[case]
    assert r["ok"], r["reason"]


@pytest.mark.parametrize("case", ["planted-off-by-one-slot", "ll-planted-off-by-one-slot"])
def test_a_planted_slot_bug_fails_the_invariant(results, case):
    r = results[case]
    assert not r["ok"] and r["max_rel_error"] > 0.1
