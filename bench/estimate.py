"""How far `run`'s estimate is from the run's real time, for the README's three `run` lines.

    python bench/estimate.py [--device cuda|cpu] [--world N] [--line 1 --line 2 ...] [--json FILE]

Each line runs twice in a row, in a fresh store and a fresh cost cache (so the first line's
estimate is the built-in guess, and each later one comes from the run before it, as a new
user meets them): ``--dry-run`` for the estimate, then for real, timing the command's wall
time. Prints one row per line: the estimate, the sweep's own seconds (the ``run N (...)`` line),
the command's wall time and the error against the wall time. On a GPU host leave ``--device``
and ``--world`` out (every GPU); on CPU ranks the third line needs ``--world 8`` to be the
README's (``--ep-sizes 2,4,8``), or give ``--line`` to run fewer.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The README's "Operators: run once per cluster" lines, without `a2a-tune run`.
LINES = {
    1: [],
    2: ["--preset", "deepseek-v3", "--dtype", "fp8_e4m3", "--tokens", "1,64,4096"],
    3: ["--ep-sizes", "2,4,8", "--dtype", "nvfp4", "--dtype", "bf16"],
}
UNITS = {"s": 1, "min": 60}


def _estimate(text: str) -> float | None:
    found = re.search(r"cases; estimated (\d+) (s|min)", " ".join(text.split()))
    return float(found.group(1)) * UNITS[found.group(2)] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda or cpu [default: the run's own choice]")
    ap.add_argument("--world", type=int, default=None, help="ranks [default: the run's own choice]")
    ap.add_argument("--line", type=int, action="append", choices=sorted(LINES), help="README line(s) [default: all]")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    extra = (["--device", args.device] if args.device else []) + (["--world", str(args.world)] if args.world else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="a2a-tune-estimate-") as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": f"{tmp}/cache", "COLUMNS": "200"}
        common = ["--db", f"{tmp}/runs.db", "--out", f"{tmp}/tables", "--no-progress", *extra]
        for n in args.line or sorted(LINES):
            cmd = [sys.executable, "-m", "a2a_tune.tuner.cli", "run", *LINES[n], *common]
            plan = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, env=env)
            if plan.returncode != 0:
                print(f"line {n}: the plan was refused: {plan.stderr.strip() or plan.stdout.strip()}")
                continue
            estimate = _estimate(plan.stdout)
            source = re.search(r"estimated \S+ \S+ \((.*?)\)", " ".join(plan.stdout.split()))
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            wall = time.perf_counter() - t0
            sweep = re.search(r"^run \d+ \(\w+\) on .*\((\d+) s\)$", done.stdout, re.M)
            rows.append(
                {
                    "line": n,
                    "command": "a2a-tune run " + " ".join([*LINES[n], *extra]),
                    "estimate_s": estimate,
                    "from": source.group(1) if source else None,
                    "sweep_s": float(sweep.group(1)) if sweep else None,
                    "wall_s": round(wall, 1),
                    "error_pct": round(100 * (estimate - wall) / wall, 1) if estimate else None,
                    "exit": done.returncode,
                }
            )
    load = " load average {:.2f} {:.2f} {:.2f},".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    print(
        f"{dt.date.today().isoformat()}  {platform.node()}, {os.cpu_count()} CPUs,{load} Python {platform.python_version()}"
    )
    print()
    print("| command | estimate | sweep | wall | error vs wall | estimate from |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| `{r['command']}` | {r['estimate_s']} s | {r['sweep_s']} s | {r['wall_s']} s | "
            f"{r['error_pct']:+.0f}% | {r['from']} |"
            if r["error_pct"] is not None
            else f"| `{r['command']}` | - | {r['sweep_s']} s | {r['wall_s']} s | - | exit {r['exit']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
