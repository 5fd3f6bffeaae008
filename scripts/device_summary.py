#!/usr/bin/env python3
"""The short table a device call ends with (scripts/device_run.sh): each step's result, then
the GPU tests per file (passed, failed, skipped) and why tests were skipped, from pytest's
JUnit XML files.

    python scripts/device_summary.py --steps steps.tsv junit.xml [junit_peers.xml ...]

steps.tsv: one line per step, `name<TAB>result<TAB>seconds` (device_run.sh's `record`).
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=Path, required=True)
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
