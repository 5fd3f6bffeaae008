#!/usr/bin/env python3
"""The peers' backends at one rank on one GPU: does each run, refuse or crash, and its round trip.

    PYTHONPATH=.flashinfer/site:.deepep/site python scripts/peers_one_rank.py --json peers.json

Each backend runs in a rank of its own (world 1, spawned), built, gated and timed as the sweep
does it (`tuner.measure.Backends` + `measure_case`: the invariant first, then the round trip in
its timing mode and the halves), so a kernel trap ends that backend only. Availability is
reported beside, not enforced: the point is what the library itself answers at one rank.
Verdicts: "runs" (invariant held, timed), "refuses" (a one-line error from the library or
the backend), "crashes" (the rank died or hung).
"""

from __future__ import annotations

import argparse
import json
import time

# backend -> experts: DeepSeek-V3's 256, but 128 for DeepEP's normal mode (its layout kernel takes at
# most 128 experts per rank, and one rank holds them all): what the library answers, not our limit
PEERS = {
    "flashinfer_nvlink_one_sided": 256,
    "flashinfer_nvlink_two_sided": 256,
    "deepep_low_latency": 256,
    "deepep_high_throughput": 128,
}


def _one(ctx, name: str, tokens: list[int], experts: int, topk: int, hidden: int) -> list[dict]:
    from a2a_tune.kernels import MoEShape
    from a2a_tune.tuner.measure import Backends, input_sets, measure_case

    shape = MoEShape(experts, topk, hidden, max(tokens), "bf16")
    rows = []
    with Backends(ctx, shape) as built:
        for t in tokens:
            r = measure_case(ctx, built, name, t, input_sets(ctx, shape, t, sets=3), warmup=10, iters=30)
            rows.append(
                {
                    "tokens": t,
                    "kind": r.kind,
                    "reason": r.reason,
                    "timing": r.timing,
                    "round_trip_us": r.median_us,
                    "dispatch_us": r.dispatch_median_us,
                    "combine_us": r.combine_median_us,
                    "max_rel_error": r.max_rel_error,
                    "workspace_mib": None if r.workspace_bytes is None else round(r.workspace_bytes / 2**20, 1),
                }
            )
    return rows


def _deadline(until: float, limit: int):
    """run_ranks' `stalled`: a reason once `until` (perf_counter) has passed."""
    return lambda: f"no answer in {limit} s (hung?)" if time.perf_counter() > until else None


def verdict(rows: list[dict]) -> str:
    if all(r["kind"] == "measured" for r in rows):
        return "runs"
    return "refuses" if all(r["kind"] in ("measured", "error", "infeasible") for r in rows) else "incorrect"


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from a2a_tune.kernels import BackendEnv, get_backend
    from a2a_tune.tuner.launch import RanksLost, run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", action="append", default=None, help=f"default: {', '.join(PEERS)}")
    ap.add_argument("--tokens", default="1,128")
    ap.add_argument("--experts", type=int, default=None, help="default: 256 (128 for deepep_high_throughput)")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--json", default=None)
    ap.add_argument("--limit", type=int, default=90, help="seconds one backend may take before it counts as hung")
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    env = BackendEnv.local(1, "cuda")
    table = Table(title=f"peers at one rank, k={args.topk} H={args.hidden} bf16")
    for col in ("backend", "E", "availability", "verdict", "T", "round trip µs", "dispatch µs", "combine µs", "why"):
        table.add_column(col, overflow="fold")
    out = {}
    for name in args.backend or PEERS:
        experts = args.experts or PEERS.get(name, 256)
        ok, why = get_backend(name).availability(env)
        start, seen = time.perf_counter(), ""
        if "not installed" in why or "not built" in why:  # nothing to ask the library
            rows, seen = [{"tokens": None, "kind": "not staged", "reason": why}], "not staged"
        try:
            if seen != "not staged":
                stalled = _deadline(start + args.limit, args.limit)
                rows = run_ranks(_one, 1, "cuda", name, tokens, experts, args.topk, args.hidden, stalled=stalled)[0]
                seen = verdict(rows)
        except RanksLost as exc:  # the rank died or hung: this backend's rank only
            rows, seen = [{"tokens": None, "kind": "crash", "reason": str(exc)}], "crashes"
        except Exception as exc:  # noqa: BLE001 - raised in the rank or before it started: a refusal
            rows, seen = [{"tokens": None, "kind": "error", "reason": f"{type(exc).__name__}: {exc}"}], "refuses"
        out[name] = {
            "experts": experts,
            "availability": why or "ok",
            "verdict": seen,
            "rows": rows,
            "wall_s": time.perf_counter() - start,
        }
        for r in rows:
            fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            table.add_row(
                name,
                str(experts),
                why or "ok",
                seen,
                str(r.get("tokens")),
                fmt(r.get("round_trip_us")),
                fmt(r.get("dispatch_us")),
                fmt(r.get("combine_us")),
                (r.get("reason") or (r.get("timing") or ""))[:160],
            )
    Console(width=160).print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
