#!/usr/bin/env python3
"""Smoke-check DeepEP's and torch's NVSHMEM backends on this machine's GPUs, one line per step.

    PYTHONPATH=.deepep/site python scripts/deepep_smoke.py --world 2 --out smoke.json

Reports what the machine offers (GPUs, NVSHMEM, RDMA devices, the DeepEP build), each
backend's availability, then runs each case (a backend at a shape and token counts: the
invariant check, CUDA-graph replays for the capturable ones, a rebuild after `close()`) in
freshly spawned ranks, so that a kernel trap or a hang ends that case only. Availability is
reported, not enforced: a case runs even where it says no (e.g. one rank), to record what the
library itself answers. The conformance run over the standard cases is `a2a-tune check --backend
deepep_low_latency --device cuda --world 2` (tuner/check.py); this script adds what that does not
check: the machine's facts, a rebuild after `close()`, and two backends sharing the same ranks.
Inputs and the invariant gate are tuner.measure's. The full test is `pytest -m gpu
tests/test_deepep_gpu.py` (2 GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BACKENDS = ("deepep_high_throughput", "deepep_low_latency", "torch_nvshmem_all2all")
# (backends (joined by "+": run one after the other in the same ranks), experts, topk, hidden,
#  capacity, dtype, token counts, graph replays, rebuild after close)
CASES = [
    ("deepep_high_throughput", 128, 8, 7168, 128, "bf16", (64,), 0, False),
    ("deepep_low_latency", 256, 8, 7168, 128, "bf16", (0, 1, 77, 128), 5, True),
    ("deepep_low_latency", 256, 8, 7168, 128, "fp8_e4m3", (100,), 0, False),
    ("deepep_low_latency", 128, 8, 4096, 77, "bf16", (77,), 0, False),
    ("torch_nvshmem_all2all", 256, 8, 7168, 256, "bf16", (0, 1, 200, 256), 5, True),
    ("torch_nvshmem_all2all", 256, 8, 7168, 256, "fp8_e4m3", (200,), 0, False),
    ("torch_nvshmem_all2all", 8, 2, 4096, 4096, "bf16", (3000,), 5, False),
    ("deepep_low_latency+torch_nvshmem_all2all", 256, 8, 7168, 128, "bf16", (100,), 0, False),
    ("torch_nvshmem_all2all+nvlink_one_sided", 256, 8, 7168, 128, "bf16", (100,), 0, False),
]


def say(line: str) -> None:
    print(line, flush=True)


def machine() -> dict:
    import torch

    from a2a_tune.kernels._deepep import find_deepep, nvshmem_library

    ib = Path("/sys/class/infiniband")
    facts = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "nvshmem_library": str(nvshmem_library()),
        "rdma_devices": sorted(p.name for p in ib.iterdir()) if ib.is_dir() else [],
        "deepep": str(find_deepep()),
    }
    staged = [Path(p).parent / "STAGED" for p in sys.path if p.endswith("site")]
    facts["staged"] = next((json.loads(p.read_text()) for p in staged if p.is_file()), None)
    for k, v in facts.items():
        say(f"machine  {k}: {v}")
    return facts


def availability(world: int) -> dict:
    from a2a_tune.kernels import BackendEnv, get_backend

    env = BackendEnv.local(world, "cuda")
    out = {}
    for name in BACKENDS:
        ok, reason = get_backend(name).availability(env)
        out[name] = "available" if ok else reason
        say(f"available  {name} on {world} rank(s): {out[name]}")
    return out


def deepep_import() -> str:
    try:
        import deep_ep

        return f"ok: sm90 compiled {deep_ep.Buffer.is_sm90_compiled()}, topk_idx_t {deep_ep.topk_idx_t}"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _case(ctx, case) -> list[str]:
    """One case on every rank; lines of what happened (rank 0's are kept)."""
    from a2a_tune.kernels import MoEShape, get_backend
    from a2a_tune.kernels.reference import graph_replay_error
    from a2a_tune.tuner.measure import gate, input_sets

    names, experts, topk, hidden, capacity, dtype, counts, replays, rebuild = case
    shape = MoEShape(experts, topk, hidden, capacity, dtype)
    lines = []
    for name in names.split("+"):
        for build in range(2 if rebuild else 1):
            t0 = time.perf_counter()
            try:
                backend = get_backend(name)(ctx.group, shape, ctx.device)
            except Exception as exc:  # noqa: BLE001 - said, and the next backend still runs
                lines.append(f"{name}: construction FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                break
            again = " (again, after close)" if build else ""
            lines.append(f"{name}: built in {time.perf_counter() - t0:.1f} s{again}")
            try:
                for i, tokens in enumerate(counts):
                    r = gate(backend, input_sets(ctx, shape, tokens, seed=i)[0])
                    verdict = "ok" if r.ok else "FAILED"
                    lines.append(f"{name}: T={tokens}: {verdict} max rel error {r.max_rel_error:.3g} {r.reason}")
                if replays and not build:
                    err = graph_replay_error(backend, counts[-1], replays)
                    lines.append(f"{name}: graph replays x{replays} at T={counts[-1]}: max rel error {err:.3g}")
            finally:
                backend.close()
    return lines


def run_case(case, world: int, limit_s: float) -> list[str]:
    from a2a_tune.tuner.launch import RankFailed, run_ranks

    start = time.monotonic()

    def stalled() -> str | None:
        return f"no answer in {limit_s:.0f} s" if time.monotonic() - start > limit_s else None

    try:
        return run_ranks(_case, world, "cuda", case, stalled=stalled)[0]
    except RankFailed as exc:
        return [f"FAILED: {exc}", *(str(exc.__cause__).strip().splitlines()[-3:] if exc.__cause__ else [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU)")
    ap.add_argument("--limit", type=float, default=60, help="seconds a case may take before its ranks are stopped")
    ap.add_argument("--only", action="append", default=[], help="run only cases of this backend (repeatable)")
    ap.add_argument("--out", type=Path, help="write everything as JSON here")
    args = ap.parse_args()
    for key, value in {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }.items():
        os.environ.setdefault(key, value)  # NVLink multicast stays off (shared hosts)
    import torch

    world = args.world or torch.cuda.device_count()
    report = {"machine": machine(), "availability": availability(world), "import_deep_ep": deepep_import(), "cases": {}}
    say(f"import deep_ep: {report['import_deep_ep']}")
    failed: set[str] = set()  # a backend whose case failed: its later cases would only repeat it
    for case in CASES:
        if args.only and case[0] not in args.only:
            continue
        label = f"{case[0]} E{case[1]} k{case[2]} H{case[3]} cap{case[4]} {case[5]}"
        if case[0] in failed:
            report["cases"][label] = ["skipped: an earlier case of this backend failed"]
            say(f"{label}: skipped (an earlier case of this backend failed)")
            continue
        t0 = time.perf_counter()
        lines = run_case(case, world, args.limit)
        if any("FAILED" in line for line in lines) and "+" not in case[0]:
            failed.add(case[0])
        report["cases"][label] = lines
        for line in lines:
            say(f"{label}: {line}")
        say(f"{label}: ({time.perf_counter() - t0:.1f} s)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
