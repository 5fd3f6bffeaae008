#!/usr/bin/env python3
"""The short table a device call ends with (scripts/device_run.sh): each step's result, the
figures against their bounds (the quantizers' share of the copy bandwidth, from bench/quant.py's
--json; the planted-halves errors, from tests/tuner/test_figures_gpu.py's A2A_TUNE_FIGURES_OUT),
then the GPU tests per file (passed, failed, skipped) and why tests were skipped, from pytest's
JUnit XML files.

    python scripts/device_summary.py --steps steps.tsv [--quant quant.json] [--figures figures.json] junit.xml ...

steps.tsv: one line per step, `name<TAB>result<TAB>seconds` (device_run.sh's `record`).
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path


def test_outcomes(paths: list[Path]) -> tuple[dict[str, Counter], Counter]:
    """Per test file: Counter of passed / failed / skipped; and skip reasons with their counts.
    A test run again in a later file (the peers after staging) counts by its last outcome."""
    last: dict[tuple[str, str], tuple[str, str]] = {}
    for path in paths:
        if not path.is_file():
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            where = (case.get("classname") or "").replace(".", "/") + ".py"
            outcome, reason = "passed", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome, reason = "failed", (child.get("message") or "")[:100]
                elif child.tag == "skipped":
                    outcome, reason = "skipped", (child.get("message") or "").removeprefix("Skipped: ")[:100]
            last[(where, case.get("name") or "")] = (outcome, reason)
    per_file: dict[str, Counter] = defaultdict(Counter)
    reasons: Counter = Counter()
    for (where, _), (outcome, reason) in last.items():
        per_file[where][outcome] += 1
        if outcome == "skipped":
            reasons[reason] += 1
    return per_file, reasons


# What issue 38 asks of the MXFP8 and NVFP4 quantizers: a share of the copy bandwidth by T
QUANT_TARGETS = (("T >= 2048", lambda t: t >= 2048, 0.85), ("T = 128", lambda t: t == 128, 0.50))


def quant_rows(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(what, figure, target) per payload and hidden: the worst share of the copy bandwidth at
    T >= 2048 and at T = 128 (block-FP8: no target, shown beside)."""
    out = []
    for payload, hidden in sorted({(r["payload"], r["hidden"]) for r in rows}):
        mine = [r for r in rows if (r["payload"], r["hidden"]) == (payload, hidden)]
        for when, counts, target in QUANT_TARGETS:
            got = [r for r in mine if counts(r["tokens"])]
            if not got:
                continue
            share = min(r["share_of_copy"] for r in got)
            bad = sum(r["mismatched_bytes"] for r in got)
            goal = "-" if payload == "fp8_e4m3" else f">= {target:.0%}"
            out.append((f"quantize {payload}, H {hidden}, {when}", f"{share:.0%} of copy, {bad} bytes off", goal))
    return out


def halves_rows(figures: dict) -> list[tuple[str, str, str]]:
    """(what, figure, target) per backend and mode: the worst relative error of a half against
    the spin planted in it (Δ over the same backend's base), over every planting."""
    timing = figures.get("timing", {})
    worst: dict[str, list[float]] = defaultdict(list)
    for key, m in timing.items():
        name, mode, label = key.split("/", 2)  # labels hold a slash: "1600/200"
        planted = figures.get("planted", {}).get(label)
        base = timing.get(f"{name}/{mode}/base")
        if not planted or base is None:
            continue
        for half, us in zip(("dispatch", "combine"), planted):
            if us > 0 and m.get(half) is not None and base.get(half) is not None:
                worst[f"{name} ({mode})"].append((m[half] - base[half]) / us - 1)
    rows = []
    for what, errs in sorted(worst.items()):
        err = max(errs, key=abs)
        rows.append((f"planted halves: {what}", f"worst {err:+.1%} over {len(errs)} halves", "within 5%"))
    for what, why in sorted(figures.get("absent", {}).items()):
        rows.append((f"planted halves: {what}", f"absent: {why}", "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=Path, required=True)
    ap.add_argument("--quant", type=Path, help="bench/quant.py --json output")
    ap.add_argument("--figures", type=Path, help="tests/tuner/test_figures_gpu.py's figures JSON")
    ap.add_argument("junit", type=Path, nargs="*")
    args = ap.parse_args(argv)
    console = Console(width=120)

    steps = Table("step", "result", "s", box=box.SIMPLE_HEAD, title="device call: steps")
    if args.steps.is_file():
        for line in args.steps.read_text().splitlines():
            name, result, seconds = (line.split("\t") + ["", ""])[:3]
            style = "green" if result == "ok" else "red" if result.startswith("FAIL") else "yellow"
            steps.add_row(name, f"[{style}]{result}[/]", seconds)
    console.print(steps)

    figures = Table("figure", "measured", "asked", box=box.SIMPLE_HEAD, title="figures against their bounds")
    if args.quant and args.quant.is_file():
        for row in quant_rows(json.loads(args.quant.read_text())):
            figures.add_row(*row)
    if args.figures and args.figures.is_file():
        for row in halves_rows(json.loads(args.figures.read_text())):
            figures.add_row(*row)
    if figures.row_count:
        console.print(figures)

    per_file, reasons = test_outcomes(args.junit)
    tests = Table("GPU test file", "passed", "failed", "skipped", box=box.SIMPLE_HEAD, title="pytest -m gpu")
    total: Counter = Counter()
    for where in sorted(per_file):
        c = per_file[where]
        total.update(c)
        tests.add_row(where, str(c["passed"]), str(c["failed"]), str(c["skipped"]))
    tests.add_row("[bold]all[/]", str(total["passed"]), str(total["failed"]), str(total["skipped"]))
    console.print(tests)
    if reasons:
        why = Table("skipped because", "tests", box=box.SIMPLE_HEAD)
        for reason, n in reasons.most_common():
            why.add_row(reason, str(n))
        console.print(why)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
