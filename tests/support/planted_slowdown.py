"""A table with one backend made slower by a factor: its medians and p10/p90 all scaled (what a
regression of that backend alone looks like to `diff`)."""

from __future__ import annotations

import json
from pathlib import Path


def slowed(table: Path, out: Path, backend: str, factor: float) -> Path:
    data = json.loads(table.read_text())
    hit = 0
    for entry in data["entries"]:
        curve = entry["backends"].get(backend)
        if curve is None:
            continue
        hit += 1
        for key in ("median_us", "p10_us", "p90_us"):
            curve[key] = [None if v is None else v * factor for v in curve[key]]
    assert hit, f"{backend} is in no entry of {table}"
    out.write_text(json.dumps(data))
    return out
