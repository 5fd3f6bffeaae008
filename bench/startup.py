"""Start-up cost of the runtime lookup: what an engine pays to ask the table (issues 6, 17).

    python bench/startup.py [--runs 21] [--probe-runs 5] [--json FILE]

Measured in fresh child interpreters with cached bytecode (one more row: compiled from source):
(a) import: wall time of ``import a2a_tune.tuner.runtime.lookup``, and the heavy modules it
    loaded (must be none of torch, sqlalchemy, pynvml, jsonschema, rich, numpy,
    a2a_tune.kernels, a2a_tune.db, importlib.metadata, email);
(b) warm lookup: µs per call once the table is loaded and the answer cached;
(c) cold lookup: ``clear_cache()`` then one lookup of a 50-shape table, and the first lookup
    of each fresh interpreter;
(d) this machine's fingerprint: the first lookup without ``$A2A_TUNE_FINGERPRINT``, with an
    empty fingerprint cache and with the one it filled;
(e) ``a2a-tune probe --json``: wall time and peak RSS.

Each row shows the earlier figure beside today's (``EARLIER``: the 1xH200 host, 2026-12-01).
Targets (issues 6 and 17): import < 30 ms and no heavy import, warm < 50 µs, cold < 20 ms,
first lookup with a cached fingerprint < 20 ms, ``a2a-tune probe`` < 1.5 s and < 200 MB;
exit status 1 when one is missed.

Design notes: docs/architecture.md, "Module notes", `bench/startup.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = [
    "torch",
    "sqlalchemy",
    "pynvml",
    "jsonschema",
    "rich",
    "numpy",
    "a2a_tune.kernels",
    "a2a_tune.db",
    "importlib.metadata",
    "email",
]
FP = "bench.startup.node1"
BACKENDS = [
    "allgather_reducescatter",
    "nccl_all2allv",
    "nvlink_one_sided",
    "nvlink_low_latency",
    "flashinfer_nvlink_one_sided",
    "flashinfer_nvlink_two_sided",
]
TOKENS = [2**i for i in range(20)]  # 1 .. 524288: 20 buckets
#: The figures before (1xH200 host, 2026-12-01), by row: import, warm lookups, cold lookup.
EARLIER_HOST = "1xH200 host, 2026-12-01"
EARLIER = {
    "import": "4.05 ms",
    "warm": "13-18 us",
    "cold": "11 ms",
}
ASK = dict(ep_size=8, hidden=7168, topk=8, num_experts=256)  # one of the 50 shapes

CHILD = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
import a2a_tune.tuner.runtime.lookup as lk
import_s = time.perf_counter() - t0
heavy = [m for m in HEAVY if m in sys.modules]
ask = dict(ASK, fingerprint=FP)
t0 = time.perf_counter()
first = lk.lookup(tokens=200, **ask)
first_s = time.perf_counter() - t0
assert first.match == "exact", first.reason
cold = []
for _ in range(20):
    lk.clear_cache()
    t0 = time.perf_counter()
    c = lk.lookup(tokens=200, **ask)
    cold.append(time.perf_counter() - t0)
warm = {}
for name, kw in (("tokens", {"tokens": 200}), ("decode", {"phase": "decode", "max_tokens": 256}),
                 ("workload", {"workload": WORKLOAD})):
    lk.lookup(**ask, **kw)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20000):
            lk.lookup(**ask, **kw)
        best = min(best, (time.perf_counter() - t0) / 20000)
    warm[name] = best
print(json.dumps({"import_s": import_s, "heavy": heavy, "first_s": first_s,
                  "cold_s": statistics.median(cold), "warm_s": warm, "backend": first.backend}))
"""


def make_table(directory: Path) -> Path:
    """50 shapes x 20 token buckets x 6 backends, through select (validated, schema 2)."""
    from a2a_tune.tuner.runtime.measurement import Measurement
    from a2a_tune.tuner.select import build_profile, write_profile

    shapes = []
    for ep in (2, 4, 8):
        for hidden in (2048, 2880, 4096, 5120, 7168):
            for topk, experts in ((2, 8), (4, 128), (8, 256)):
                shapes.append(
                    dict(ep_size=ep, hidden=hidden, topk=topk, num_experts=experts, dtype="bf16", routing="uniform")
                )
    shapes += [dict(s, routing="skewed") for s in shapes[:5]]  # 45 + 5 = 50 distinct shapes
    measurements = []
    for si, shape in enumerate(shapes):
        for bi, b in enumerate(BACKENDS):
            for t in TOKENS:
                med = (20 + 7 * bi + si % 5) + t * shape["hidden"] * shape["topk"] * (0.4 + 0.13 * ((bi * 7) % 6)) / 1e6
                measurements.append(
                    dict(
                        shape,
                        backend=b,
                        tokens_per_rank=t,
                        timing="graph" if bi == 3 else "eager",
                        median_us=med,
                        p10_us=med * 0.97,
                        p90_us=med * 1.05,
                    )
                )
    profile = build_profile(
        [Measurement.from_columns(m) for m in measurements],
        [],
        hardware={"fingerprint": FP, "facts_hash": "0" * 16, "facts": {"generated": "bench/startup.py"}},
        run={"id": 1, "device_type": "cuda", "world_size": 8, "versions": {}},
        backend_names={b: {"engines": {}} for b in BACKENDS},
    )
    assert len(profile.entries) == 50 and all(len(e.tokens) == 20 and len(e.median_us) == 6 for e in profile.entries)
    return write_profile(profile, directory)


def run_child(table_dir: Path, workload: Path, *, no_bytecode: bool = False) -> dict:
    code = (f"HEAVY = {HEAVY!r}\nFP = {FP!r}\nASK = {ASK!r}\nWORKLOAD = {str(workload)!r}\n") + CHILD
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(A2A_TUNE_PROFILE_DIR=str(table_dir), XDG_DATA_HOME=str(table_dir / "xdg"))
    flags = []
    if no_bytecode:
        empty = table_dir / "empty-pycache"
        empty.mkdir(exist_ok=True)
        flags = ["-X", f"pycache_prefix={empty}", "-B"]
    out = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBED = r"""
import json, time
import a2a_tune.tuner.runtime.lookup as lk
t0 = time.perf_counter()
c = lk.lookup(tokens=200, **ASK)
print(json.dumps({"first_s": time.perf_counter() - t0, "match": c.match, "hardware": c.hardware_match}))
"""


def run_probed_child(cache_dir: Path, table_dir: Path) -> dict:
    """(d): a fresh interpreter's first lookup with no fingerprint given, cache in `cache_dir`."""
    env = {k: v for k, v in os.environ.items() if k not in ("A2A_TUNE_FINGERPRINT", "PYTHONDONTWRITEBYTECODE")}
    env.update(A2A_TUNE_PROFILE_DIR=str(table_dir), XDG_DATA_HOME=str(table_dir / "xdg"), XDG_CACHE_HOME=str(cache_dir))
    code = f"ASK = {ASK!r}\n" + PROBED
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_probe_command(cache_dir: Path) -> tuple[float, float]:
    """(e): wall seconds and peak RSS (MB) of one `a2a-tune probe --json`."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "a2a_tune.tuner.cli", "probe", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"a2a-tune probe exited with {proc.returncode}")
    return wall, usage.ru_maxrss / 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21, help="fresh interpreters [default: 21]")
    ap.add_argument("--json", default=None, help="also write the raw results to this file")
    ap.add_argument("--probe-runs", type=int, default=5, help="interpreters for (d) and runs for (e) [default: 5]")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        table = make_table(tmp)
        workload = tmp / "workload.csv"
        workload.write_text("".join(f"{t},{100 // (i + 1)}\n" for i, t in enumerate(TOKENS[:12])))
        run_child(tmp, workload)  # writes the bytecode; not counted
        runs = [run_child(tmp, workload) for _ in range(args.runs)]
        source_runs = [run_child(tmp, workload, no_bytecode=True) for _ in range(max(3, args.runs // 3))]
        size_kb = table.stat().st_size / 1024
        uncached, cached = [], []
        for i in range(args.probe_runs):
            cache = tmp / f"cache{i}"  # empty: the first lookup probes and fills it
            uncached.append(run_probed_child(cache, tmp))
            cached.append(run_probed_child(cache, tmp))
        probe_cmd = [run_probe_command(tmp / "probe-cache") for _ in range(args.probe_runs)]

    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    us = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    heavy = sorted({m for r in runs for m in r["heavy"]})
    rows = [
        (
            "import a2a_tune.tuner.runtime.lookup",
            f"{ms([r['import_s'] for r in runs]):.2f} ms",
            EARLIER["import"],
            f"{min(r['import_s'] for r in runs) * 1e3:.2f} .. {max(r['import_s'] for r in runs) * 1e3:.2f} ms",
            "< 30 ms",
            ms([r["import_s"] for r in runs]) < 30,
        ),
        ("heavy modules imported", ", ".join(heavy) or "none", "", "none", not heavy),
        (
            "(import without cached bytecode: sources compiled)",
            f"{ms([r['import_s'] for r in source_runs]):.2f} ms",
            f"{min(r['import_s'] for r in source_runs) * 1e3:.2f} .. {max(r['import_s'] for r in source_runs) * 1e3:.2f} ms",
            "-",
            True,
        ),
        (
            "warm lookup, tokens=200",
            f"{us([r['warm_s']['tokens'] for r in runs]):.2f} us",
            EARLIER["warm"],
            "",
            "< 50 us",
            us([r["warm_s"]["tokens"] for r in runs]) < 50,
        ),
        (
            "warm lookup, phase=decode max_tokens=256",
            f"{us([r['warm_s']['decode'] for r in runs]):.2f} us",
            EARLIER["warm"],
            "",
            "< 50 us",
            us([r["warm_s"]["decode"] for r in runs]) < 50,
        ),
        (
            "warm lookup, workload file (12 points)",
            f"{us([r['warm_s']['workload'] for r in runs]):.2f} us",
            EARLIER["warm"],
            "",
            "< 50 us",
            us([r["warm_s"]["workload"] for r in runs]) < 50,
        ),
        (
            f"cold lookup, 50x20x6 table ({size_kb:.0f} KiB), clear_cache() + 1 lookup",
            f"{ms([r['cold_s'] for r in runs]):.2f} ms",
            EARLIER["cold"],
            "",
            "< 20 ms",
            ms([r["cold_s"] for r in runs]) < 20,
        ),
        (
            "first lookup in a fresh interpreter (import excluded)",
            f"{ms([r['first_s'] for r in runs]):.2f} ms",
            f"{min(r['first_s'] for r in runs) * 1e3:.2f} .. {max(r['first_s'] for r in runs) * 1e3:.2f} ms",
            "< 20 ms",
            ms([r["first_s"] for r in runs]) < 20,
        ),
        (
            "first lookup, no fingerprint given, empty cache (NVML probe)",
            f"{ms([r['first_s'] for r in uncached]):.1f} ms",
            f"{min(r['first_s'] for r in uncached) * 1e3:.1f} .. {max(r['first_s'] for r in uncached) * 1e3:.1f} ms",
            "< 5 s (the probe's timeout)",
            max(r["first_s"] for r in uncached) < 6,
        ),
        (
            "first lookup, no fingerprint given, cached fingerprint",
            f"{ms([r['first_s'] for r in cached]):.2f} ms",
            f"{min(r['first_s'] for r in cached) * 1e3:.2f} .. {max(r['first_s'] for r in cached) * 1e3:.2f} ms",
            "< 20 ms",
            ms([r["first_s"] for r in cached]) < 20,
        ),
        (
            "a2a-tune probe --json: wall time",
            f"{statistics.median(w for w, _ in probe_cmd):.2f} s",
            f"{min(w for w, _ in probe_cmd):.2f} .. {max(w for w, _ in probe_cmd):.2f} s",
            "< 1.5 s",
            statistics.median(w for w, _ in probe_cmd) < 1.5,
        ),
        (
            "a2a-tune probe --json: peak RSS (without the NVML child)",
            f"{statistics.median(m for _, m in probe_cmd):.0f} MB",
            "",
            "< 200 MB",
            statistics.median(m for _, m in probe_cmd) < 200,
        ),
    ]
    load = " load average {:.2f} {:.2f} {:.2f},".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    print(
        f"{dt.date.today().isoformat()}  {platform.node()}  {platform.machine()}, {os.cpu_count()} CPUs,{load} "
        f"{platform.platform()}, Python {platform.python_version()}  ({args.runs} fresh interpreters)"
    )
    print()
    rows = [row if len(row) == 6 else (*row[:2], "", *row[2:]) for row in rows]  # (name, value, earlier, ...)
    print(f"| measurement | median | earlier ({EARLIER_HOST}) | range | target | met |")
    print("|---|---:|---:|---:|---:|:---:|")
    for name, value, earlier, spread, target, ok in rows:
        print(f"| {name} | {value} | {earlier} | {spread} | {target} | {'yes' if ok else 'NO'} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "runs": runs,
                    "table_kib": size_kb,
                    "probed_uncached": uncached,
                    "probed_cached": cached,
                    "probe_command": [{"wall_s": w, "max_rss_mb": m} for w, m in probe_cmd],
                },
                indent=2,
            )
        )
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
