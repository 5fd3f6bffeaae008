"""NVFP4 quantize tile sizes side by side on one GPU, against an older kernel and the copy.

    python bench/quant_tiles.py [--old FILE] [--hidden 4096,7168] [--tokens 128,2048,16384] [--json FILE]

Each row: one variant's µs per call in a replayed CUDA graph and its share of the device copy's
GB/s (bench/quant.py's measure), with x warm in L2 (one x replayed, as bench/quant.py) and cold
(copies of x rotated, 128 MB or more); its bytes are checked against the torch path first.
Variants: the tree's NVFP4 kernel at its own tile and at 1024 to 8192 elements a program;
`--old FILE`: an older `kernels/_quant_kernels.py` (e.g. `git show REV:kernels/_quant_kernels.py`),
its NVFP4 kernel beside them; MXFP8 as an anchor. Maintainer tool for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch
from quant import graph_us  # bench/quant.py: run as a script, bench/ is on the path

from a2a_tune.kernels import _quant_kernels, quant
from a2a_tune.kernels.base import PAYLOADS


def load_old(path: str):
    """An older _quant_kernels.py as a module (its relative import of .base made absolute)."""
    source = Path(path).read_text().replace("from .base import", "from a2a_tune.kernels.base import")
    tmp = Path(tempfile.mkdtemp()) / "old_quant_kernels.py"
    tmp.write_text(source)
    spec = importlib.util.spec_from_file_location("old_quant_kernels", tmp)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variants(payload: str, old) -> dict:
    if payload == "mxfp8":
        return {"tree": _quant_kernels.quantize_mxfp8}
    out = {"old": old.quantize_nvfp4} if old else {}
    for elems in (None, 1024, 2048, 4096, 8192):
        out[f"tree, {elems or 'its'} elems"] = (
            lambda e: lambda x, q, s: _quant_kernels.quantize_nvfp4(x, q, s, elems=e)
        )(elems)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="an older kernels/_quant_kernels.py to time beside the tree's")
    ap.add_argument("--hidden", default="4096,7168")
    ap.add_argument("--tokens", default="128,2048,16384")
    ap.add_argument("--json")
    a = ap.parse_args()
    old = load_old(a.old) if a.old else None
    rows = []
    for payload in ("nvfp4", "mxfp8"):
        for h in map(int, a.hidden.split(",")):
            for t in map(int, a.tokens.split(",")):
                g = torch.Generator(device="cuda").manual_seed(t)
                x = (torch.randn(t, h, device="cuda", generator=g) * 3).bfloat16()
                cold = [x.clone() for _ in range(max(2, -(-128 * 2**20 // x.nbytes)))]
                want = [w.view(torch.uint8) for w in quant.QUANTIZE_TORCH[payload](x)]
                q, s = quant.empty_wire(payload, t, h, "cuda")
                copy = {
                    k: graph_us(lambda v: torch.empty_like(v).copy_(v), xs, replays=15)
                    for k, xs in (("warm", [x]), ("cold", cold))
                }
                moved = t * h * 2 + t * PAYLOADS[payload].row_bytes(h)
                for name, fn in variants(payload, old).items():
                    q.zero_()
                    s.view(torch.uint8).zero_()
                    fn(x, q, s)
                    bad = int((q.view(torch.uint8) != want[0]).sum() + (s.view(torch.uint8) != want[1]).sum())
                    row = {"payload": payload, "variant": name, "hidden": h, "tokens": t, "mismatched_bytes": bad}
                    for k, xs in (("warm", [x]), ("cold", cold)):
                        us = graph_us(lambda v, fn=fn, q=q, s=s: fn(v, q, s), xs, replays=15)
                        row |= {f"{k}_us": us, f"{k}_share_of_copy": moved / us / (2 * x.nbytes / copy[k])}
                    rows.append(row)
                    print(
                        f"{payload:6} {name:22} H={h} T={t:6} bad={bad} warm {row['warm_us']:8.2f} µs "
                        f"{row['warm_share_of_copy']:5.0%} | cold {row['cold_us']:8.2f} µs {row['cold_share_of_copy']:5.0%}",
                        flush=True,
                    )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    sys.exit(1 if any(r["mismatched_bytes"] for r in rows) else 0)


if __name__ == "__main__":
    main()
