"""A machine's table across runs: a new run's table is merged into the one on disk, never over it.

One table per fingerprint answers every shape and EP size measured on that hardware, whichever
run measured it: a run on 4 GPUs then one on 8, or ``run --preset mixtral-8x7b`` then
``run --preset qwen3-235b-a22b``. The rule (:func:`merge`):

* an entry (shape) only one table has is kept as it is;
* an entry both have keeps the **newest measurement per point**: per backend and token count,
  the value of the newer run wherever it measured that backend there, else the older one's
  (a backend timed in another mode by the newer run takes the newer curve whole: one mode
  per backend per entry). Newer is the later ``provenance`` date (the run's start), then the
  higher run id; re-selecting the same run replaces its entries;
* a backend the newer run lists as failed stays failed; an older failure stays unless the
  newer run measured that backend where it failed (anywhere, for a failure of the whole
  shape): a backend once found incorrect is not chosen again on the strength of other points;
* ``provenance`` lists every run an entry holds measurements of, newest first; the winners
  are recomputed from the merged curves (the rule lookup applies).

Writing, with the lock
that keeps two writers from losing each other's entries, is :func:`a2a_tune.tuner.publish.write_table`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from .runtime.table import SHAPE_KEYS
from .select import fabric_of, shape_sort_key, table_winners

__all__ = ["merge"]

_ARRAYS = ("median_us", "p10_us", "p90_us")


def _key(entry: Mapping) -> tuple:
    return tuple(entry[k] for k in SHAPE_KEYS)


def _newest(entry: Mapping) -> tuple:
    """(date, run id) of the newest run an entry holds measurements of: later sorts higher."""
    p = (entry.get("provenance") or [{}])[0]
    run = p.get("run")
    return (str(p.get("date") or ""), run if isinstance(run, int) else -1, str(run))


def merge(old: Mapping, new: Mapping) -> dict:
    """The table of ``new`` (a current-schema dict, e.g. just selected) with what ``old`` (the
    table on disk, upgraded to the current schema) holds and ``new`` lacks, by the module's
    rule. ``new``'s top level (hardware, run, generated_*) is kept. Not validated here."""
    out = copy.deepcopy(dict(new))
    for b, names in old.get("backends", {}).items():
        out["backends"].setdefault(b, copy.deepcopy(names))
    preference = list(out["tie_preference"])
    preference += [b for b in old.get("tie_preference", []) if b not in preference]
    preference += [b for b in out["backends"] if b not in preference]
    out["tie_preference"] = preference
    entries = {_key(e): e for e in out["entries"]}
    facts, world = old.get("hardware", {}).get("facts"), old.get("run", {}).get("world_size")
    for e in old.get("entries", []):
        if "fabric" not in e and fabric_of(facts, e["ep_size"], world):  # a table from before schema 4
            e = {**e, "fabric": fabric_of(facts, e["ep_size"], world)}
        mine = entries.get(_key(e))
        if mine is None:
            entries[_key(e)] = copy.deepcopy(e)
        elif _newest(e) > _newest(mine):
            entries[_key(e)] = _merge_entry(mine, e, preference)
        else:
            entries[_key(e)] = _merge_entry(e, mine, preference)
    out["entries"] = [entries[k] for k in sorted(entries, key=shape_sort_key)]
    return out


def _points(curve: Mapping, tokens: list) -> dict:
    """token count -> that point's values (every per-token array of the curve), where measured."""
    arrays = {k: v for k, v in curve.items() if isinstance(v, list)}
    return {t: {k: v[j] for k, v in arrays.items()} for j, t in enumerate(tokens) if curve["median_us"][j] is not None}


def _merge_entry(older: Mapping, newer: Mapping, preference: list) -> dict:
    """One shape measured by two runs: the newest measurement per point (module docstring)."""
    first = [p.get("run") for p in newer.get("provenance", [])[:1]]
    if first and first == [p.get("run") for p in older.get("provenance", [])[:1]]:
        return copy.deepcopy(dict(newer))  # the same run selected again: its entries as they are now
    tokens = sorted(set(older["tokens"]) | set(newer["tokens"]))
    backends = {}
    for b in sorted(set(older["backends"]) | set(newer["backends"])):
        a, n = older["backends"].get(b), newer["backends"].get(b)
        if a is None or (n is not None and a["timing"] != n["timing"]):
            src = [(n, newer["tokens"])]
        elif n is None:
            src = [(a, older["tokens"])]
        else:
            src = [(n, newer["tokens"]), (a, older["tokens"])]
        points = {}
        for curve, ts in reversed(src):  # the newer run's last: its points win
            points.update(_points(curve, ts))
        keys = dict.fromkeys(k for curve, _ in src for k, v in curve.items() if isinstance(v, list))
        merged = {"timing": src[0][0]["timing"]}
        for k in keys:
            row = [points[t].get(k) if t in points else None for t in tokens]
            if k in _ARRAYS or any(v is not None for v in row):
                merged[k] = row
        backends[b] = merged
    failed = dict(newer.get("failed") or {})
    for b, f in (older.get("failed") or {}).items():
        measured = {t for t, v in zip(newer["tokens"], newer["backends"].get(b, {}).get("median_us", [])) if v}
        if b not in failed and not (measured if f.get("tokens") is None else f.get("tokens") in measured):
            failed[b] = f
    out = {k: newer[k] for k in SHAPE_KEYS}
    out.update(source=newer.get("source", "measured"), tokens=tokens, backends=backends, failed=failed)
    out["winners"] = table_winners(tokens, backends, failed, preference)
    runs = {p.get("run") for p in newer.get("provenance", [])}  # each run once, newest first
    out["provenance"] = list(newer.get("provenance", [])) + [
        p for p in older.get("provenance", []) if p.get("run") not in runs
    ]
    fabric = newer.get("fabric") or older.get("fabric")
    if fabric:
        out["fabric"] = fabric
    return copy.deepcopy(out)
