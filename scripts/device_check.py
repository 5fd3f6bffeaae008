#!/usr/bin/env python3
"""The backend invariant per backend, each in its own launch: correctness only, never timing.

* W=1 (--w1, none by default): backends on a single GPU (not yet run on one).
* W=2 (--w2): two GPUs, over NCCL; a quick check before the long GPU test suite.

Each backend runs in its own launch with a watchdog, so one that hangs is reported and the
others still run. Prints one line per case; --json writes them.

    python scripts/device_check.py [--w2 flashinfer_nvlink_one_sided,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from a2a_tune.kernels import MoEShape, get_backend
from a2a_tune.kernels.reference import check_invariant, graph_replay_error, make_inputs
from a2a_tune.tuner.launch import RankFailed, run_ranks

DEEPSEEK = (256, 8, 7168)  # experts, top-k, hidden


def cases_for(name: str, world: int) -> list[tuple[str, tuple[int, ...], str, str, int]]:
    """(id, tokens per rank, dtype, routing, repeats)."""
    pick = lambda *t: t[:world]  # noqa: E731
    cases = [
        ("uniform", pick(128, 77), "bf16", "uniform", 1),
        ("skewed-zero", pick(0, 300), "bf16", "skewed", 1),
        ("large-repeated", pick(1024, 1024), "bf16", "uniform", 3),
    ]
    if get_backend(name).quantized_payloads:
        cases.append(("fp8", pick(256, 100), "fp8_e4m3", "uniform", 2))
    return cases


def _graph_check(ctx, name: str, replays: int) -> float:
    backend = get_backend(name)(ctx.group, MoEShape(*DEEPSEEK, 64, "bf16"), ctx.device)
    try:
        return graph_replay_error(backend, 64, replays)
    finally:
        backend.close()


def _check_backend(ctx, name: str) -> list[dict]:
    rows = []
    for i, (cid, tokens, dtype, routing, repeats) in enumerate(cases_for(name, ctx.world_size)):
        shape = MoEShape(*DEEPSEEK, max(max(tokens), 1), dtype)
        t0 = time.perf_counter()
        backend = get_backend(name)(ctx.group, shape, ctx.device)
        verdicts = []
        for rep in range(repeats):
            inputs = make_inputs(
                shape,
                tokens[ctx.rank],
                rank=ctx.rank,
                world_size=ctx.world_size,
                routing=routing,
                seed=1000 * i + rep,
                device=ctx.device,
            )
            verdicts.append(check_invariant(backend, inputs))
        backend.close()
        worst = max(verdicts, key=lambda v: (not v.ok, v.max_rel_error))
        rows.append(
            {
                "case": cid,
                "tokens": list(tokens),
                "dtype": dtype,
                "ok": all(v.ok for v in verdicts),
                "max_rel_error": worst.max_rel_error,
                "reason": worst.reason,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    if get_backend(name).graph_capturable:
        err = _graph_check(ctx, name, 5)
        rows.append(
            {
                "case": "graph-replays",
                "tokens": [64] * ctx.world_size,
                "dtype": "bf16",
                "ok": err < 2.5e-2,
                "max_rel_error": err,
                "reason": "" if err < 2.5e-2 else f"replay error {err:.3g}",
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--w1", default="", help="backends to check on 1 GPU (comma-separated)")
    ap.add_argument(
        "--w2", default="flashinfer_nvlink_one_sided,flashinfer_nvlink_two_sided", help="backends to check on 2 GPUs"
    )
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per backend before its ranks are killed")
    ap.add_argument("--json")
    args = ap.parse_args()
    report = []
    for world, names in ((1, args.w1), (2, args.w2)):
        for name in filter(None, names.split(",")):
            deadline = time.monotonic() + args.timeout
            stalled = lambda: "timed out" if time.monotonic() > deadline else None  # noqa: B023, E731
            try:
                rows = run_ranks(_check_backend, world, "cuda", name, stalled=stalled)[0]
            except RankFailed as exc:
                rows = [{"case": "launch", "ok": False, "reason": str(exc).splitlines()[0]}]
            for row in rows:
                row.update(backend=name, world=world)
                report.append(row)
                verdict = "ok  " if row["ok"] else "FAIL"
                print(
                    f"{verdict} W={world} {name:30s} {row['case']:16s} "
                    f"err={row.get('max_rel_error', float('nan')):.3g} {row.get('seconds', '')}s {row['reason']}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in report) else 1)


if __name__ == "__main__":
    main()
