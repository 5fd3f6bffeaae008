"""Replay a stored full-grid run through the adaptive token search, without a GPU.

The search asks for (tokens, backend) points; the answers are the full run's own medians,
so the result isolates the search's choices from run-to-run noise. Prints how many of the
run's measurements the search needed, writes the table built from just those, and scores it
(`evaluate`) on the full run and on any other stored runs (e.g. held-out points).

    python bench/replay_adaptive.py --db sqlite:///a2a_tune.db --run 4 --score 5 --out /tmp/adaptive
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from a2a_tune.db import StoreError, open_store
from a2a_tune.kernels import engine_names, list_backends
from a2a_tune.tuner.adaptive import AdaptiveSearch
from a2a_tune.tuner.evaluate import evaluate
from a2a_tune.tuner.runtime.table import ProfileError
from a2a_tune.tuner.select import build_profile, profile_from_store, write_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", type=int, required=True, help="the full-grid run to replay")
    ap.add_argument(
        "--score", type=int, action="append", default=[], help="another run to score the table on, repeatable"
    )
    ap.add_argument("--out", type=Path, required=True, help="directory for the replayed table")
    a = ap.parse_args()
    names = engine_names()
    try:
        replay(a, names)
    except (StoreError, ProfileError) as exc:
        sys.exit(f"error: {exc}")


def replay(a: argparse.Namespace, names: dict) -> None:
    with open_store(a.db) as store:
        run = store.get_run(a.run)
        full = store.measurements(a.run)
        if not full:
            sys.exit(f"error: run {a.run} has no measurements to replay")
        backends = tuple((run.config or {}).get("backends") or list_backends())  # the run's own, in its order
        groups: dict[tuple, dict[tuple[int, str], object]] = {}
        for m in full:
            groups.setdefault((m.num_experts, m.topk, m.hidden, m.dtype, m.routing), {})[
                (m.tokens_per_rank, m.backend)
            ] = m
        # the run's grid (refinement counts are not grid points) and its refinement setting
        grid = tuple(sorted((run.config or {}).get("tokens") or {m.tokens_per_rank for m in full}))
        refine = (run.config or {}).get("refine_ratio")
        kept, missing = [], 0
        for points in groups.values():
            search = AdaptiveSearch(grid, backends, refine_ratio=refine)
            while batch := search.next_points():
                for t, b in batch:
                    m = points.get((t, b))
                    search.observe(t, b, None if m is None else m.median_us)
                    if m is not None:
                        kept.append(m)
                    elif t not in grid:
                        missing += 1  # a refinement count the full run did not refine: counts as failed
        base = profile_from_store(store, a.run, backend_names=names)  # hardware and run sections
        profile = build_profile(
            kept,
            store.failures(a.run),
            hardware={**base.meta["hardware"], "fingerprint": base.fingerprint},
            run=base.meta["run"],
            backend_names=names,
        )
        path = write_profile(profile, a.out)
        print(
            f"adaptive replay of run {a.run}: {len(kept)} of {len(full)} measurements "
            f"({100 * len(kept) / len(full):.1f}%); table {path}"
        )
        if missing:
            print(f"  {missing} refinement point(s) the search asked for are not in run {a.run} (not replayed)")
        for r in [a.run, *a.score]:
            store.get_run(r)
            result = evaluate(store.measurements(r), str(path), store.failures(r))
            ev = result.policies.get("table")
            outside = f"; {result.outside} point(s) of other shapes not scored" if result.outside else ""
            if ev:
                print(
                    f"  scored on run {r}: mean regret {100 * ev['mean']:.2f}%, worst {100 * ev['worst']:.1f}% "
                    f"({ev['points']} points{outside})"
                )
            else:
                print(f"  run {r}: no point of the table's shapes{outside}")


if __name__ == "__main__":
    main()
