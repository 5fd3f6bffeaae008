"""Ops views (`show`, `diff`, `plot`, `report`) as an ops engineer uses them: real CLI
subprocesses for output and exit codes, the library for the finer rules.

Profiles are written by hand here (schema 1, and the schema-2 additions: per-backend
timing mode, winners with a ``tie`` flag, the tie preference) so these tests do not move
when the selection code does; databases are written through ``a2a_tune.db.open_store``.
"""

from __future__ import annotations

import base64
import copy
import html
import json
import os
import re
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest
from bad_tables import BAD_TABLES
from bad_tables import FIXTURE as LOOKUP_FIXTURE
from run_cli import a2a
from stored import measured, start_run

from a2a_tune.tuner.runtime.lookup import clear_cache, lookup
from a2a_tune.tuner.views.diff import diff_views
from a2a_tune.tuner.views.load import load_profile_view, load_run_view, load_view, run_tie_preference
from a2a_tune.tuner.views.model import ViewError
from a2a_tune.tuner.views.show import show_data, timing_summary, winner_ranges

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_header(data: bytes) -> tuple[int, int, int, int]:
    """(width, height, bit depth, colour type) of a PNG file's bytes; fails on anything else."""
    import struct
    import zlib

    assert data.startswith(PNG_MAGIC), data[:8]
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")  # the first chunk, by the PNG specification
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(data[12:29])  # and it is whole
    assert data.endswith(b"IEND\xaeB`\x82")  # so is the file
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    return width, height, depth, color


# plot / report need the optional extra a2a-tune[plot] (CI installs it).
needs_matplotlib = pytest.mark.skipif(
    find_spec("matplotlib") is None, reason="matplotlib not installed (a2a-tune[plot])"
)
DASH = "\u2013"

S1 = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, dtype="bf16", routing="uniform")
S2 = dict(ep_size=2, hidden=4096, topk=2, num_experts=8, dtype="bf16", routing="uniform")
T1 = [1, 4, 16, 64, 256, 1024]
T2 = [1, 64, 1024]
# S1: allgather wins 1-64 (margins 100, 91, 83, 25 %), nccl_all2allv 256-1024 (60, 200 %);
# flashinfer is fastest everywhere but failed its correctness check: never a winner.
CURVES = {
    "S1": (
        S1,
        T1,
        {
            "allgather_reducescatter": [10, 11, 12, 20, 80, 300],
            "nccl_all2allv": [20, 21, 22, 25, 50, 100],
            "flashinfer_nvlink_one_sided": [2, 2, 2, 2, 2, 2],
        },
    ),
    "S2": (
        S2,
        T2,
        {
            "allgather_reducescatter": [20, 60, 600],
            "nccl_all2allv": [40, 70, 300],
        },
    ),
}
INCORRECT = "max abs error 0.5 > tol 0.016 (bf16)"
UNAVAILABLE = "package deep_ep not installed"
H200_FACTS = {
    "fingerprint": "h200.nvl18x2.node1",
    "node_count": 1,
    "hostnames": ["gpu-node-7"],
    "driver_versions": ["580.159.04"],
    "gpus": [
        {
            "index": i,
            "node": 0,
            "name": "NVIDIA H200",
            "compute_capability": [9, 0],
            "memory_total_bytes": 150754820096,
            "pci_bus_id": f"00000000:00:0{6 + i}.0",
            "links": [{"index": j, "active": True, "speed_mbps": 26562} for j in range(18)],
        }
        for i in range(2)
    ],
    "islands": [{"gpus": [0, 1], "link_counts": [18, 18], "speed_mbps": 26562, "via_switch": True, "nodes": [0]}],
    "fabric_domains": [],
    "degraded": [],
    "pcie_only_pairs": [],
}


def _winners(tokens, per_backend, failed, schema):
    """The fastest backend per token count (the curves here have no ties unless a test plants one)."""
    out = []
    for j, t in enumerate(tokens):
        ranked = sorted((v[j], b) for b, v in per_backend.items() if b not in failed and v[j] is not None)
        (w_us, w), (r_us, r) = ranked[0], ranked[1]
        out.append({"tokens": t, "backend": w, "median_us": w_us, "runner_up": r, "margin": round(r_us / w_us - 1, 4)})
        if schema == 2:
            out[-1].update(fastest=w, tie=False)
    return out


def make_profile(curves=CURVES, *, spread=0.05, fingerprint="h200.nvl18x2.node1", versions=None, schema=1):
    """A profile in the shape select writes (schema 1 or 2, all eager): p10/p90 = median -/+ spread."""
    entries = []
    for shape, tokens, per_backend in curves.values():
        failed = {"deepep_low_latency": f"unavailable: {UNAVAILABLE}"}
        if "flashinfer_nvlink_one_sided" in per_backend:
            failed["flashinfer_nvlink_one_sided"] = f"incorrect at 256 tokens/rank: {INCORRECT}"
        entries.append(
            dict(
                shape,
                source="measured",
                tokens=list(tokens),
                failed=failed,
                backends={
                    b: {
                        "median_us": [float(x) for x in v],
                        "p10_us": [x * (1 - spread) for x in v],
                        "p90_us": [x * (1 + spread) for x in v],
                        **({"timing": "eager"} if schema == 2 else {}),
                    }
                    for b, v in per_backend.items()
                },
                winners=_winners(tokens, per_backend, failed, schema),
            )
        )
    names = {b for _, _, pb in curves.values() for b in pb} | {"deepep_low_latency"}
    extra = {"tie_preference": ["allgather_reducescatter"]} if schema == 2 else {}
    return {
        "schema": schema,
        "generated_by": "a2a-tune 0.1.0",
        "generated_at": "2026-11-30T15:30:00Z",
        "hardware": {"fingerprint": fingerprint, "facts_hash": "9558368b0d85f2c4", "facts": H200_FACTS},
        "run": {
            "id": 1,
            "device_type": "cuda",
            "world_size": 2,
            "timing": "eager",
            "versions": versions or {"torch": "2.11.0", "nccl": "2.28.9"},
            "started_at": "2026-11-30T15:00:00Z",
            "finished_at": "2026-11-30T15:29:00Z",
        },
        "backends": {b: {"vllm_name": None, "sglang_name": None} for b in sorted(names)},
        "entries": entries,
        **extra,
    }


def _is_json(content) -> bool:
    try:
        json.loads(content)
    except ValueError:
        return False
    return True


def write(path: Path, profile: dict) -> Path:
    path.write_text(json.dumps(profile, indent=1))
    return path


def planted(factor: float, backend: str, shape: str, tokens: list) -> dict:
    """CURVES with ``backend`` at ``tokens`` of ``shape`` multiplied by ``factor``."""
    curves = copy.deepcopy(CURVES)
    _, toks, per_backend = curves[shape]
    for t in tokens:
        per_backend[backend][toks.index(t)] *= factor
    return curves


def one_line_error(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture()
def profile_a(tmp_path):
    return write(tmp_path / "a.json", make_profile())


# ------------------------------------------------------------------------- database


def _store_run(store, hw, *, curves, versions, failures=(), spread=0.05):
    config = {"warmup": 10, "iters": 50, "argv": ["run", "--device", "cuda"]}
    rid = start_run(store, hw, config=config, config_hash="h", versions=versions)
    for shape, tokens, per_backend in curves.values():
        for b, values in per_backend.items():
            for t, v in zip(tokens, values):
                store.add_measurement(rid, measured(shape, b, t, v, v * (1 - spread), v * (1 + spread), n=3))
    for f in failures:
        store.add_failure(rid, **f)
    store.finish_run(rid, "completed")
    return rid


@pytest.fixture()
def two_run_db(tmp_path):
    """Run 1: clean. Run 2 (NCCL upgraded): nccl_all2allv fails its check on S2, and
    allgather_reducescatter is 3x slower at S1 256-1024 tokens."""
    from a2a_tune.db import open_store

    path = tmp_path / "runs.db"
    with open_store(str(path)) as s:
        hw = s.get_or_create_hardware("h200.nvl18x2.node1", "9558368b0d85f2c4", H200_FACTS)
        run1 = {k: v for k, v in CURVES.items()}
        shapeless = dict(backend="deepep_low_latency", kind="unavailable", reason=UNAVAILABLE)
        incorrect = dict(
            backend="flashinfer_nvlink_one_sided", kind="incorrect", reason=INCORRECT, tokens_per_rank=256, **S1
        )
        _store_run(s, hw, curves=run1, versions={"torch": "2.11.0", "nccl": "2.28.9"}, failures=[shapeless, incorrect])
        run2 = planted(3.0, "allgather_reducescatter", "S1", [256, 1024])
        new_bad = dict(
            backend="nccl_all2allv",
            kind="incorrect",
            reason="rows delivered to the wrong expert",
            tokens_per_rank=64,
            **S2,
        )
        _store_run(
            s, hw, curves=run2, versions={"torch": "2.11.0", "nccl": "2.29.1"}, failures=[shapeless, incorrect, new_bad]
        )
    return path


# ------------------------------------------------------------------------------ show


def test_show_collapses_buckets_with_one_winner_into_ranges(profile_a):
    view = load_profile_view(profile_a)
    s1 = view.shape(tuple(S1.values()))
    assert [r.line() for r in winner_ranges(s1)] == [
        f"1{DASH}64: allgather_reducescatter (margin 25{DASH}100%)",
        f"256{DASH}1024: nccl_all2allv (margin 60{DASH}200%)",
    ]
    s2 = view.shape(tuple(S2.values()))
    assert [r.tokens for r in winner_ranges(s2)] == [f"1{DASH}64", "1024"]


def test_show_cli_prints_ranges_margins_and_failure_reasons(profile_a):
    r = a2a("show", "--profile", str(profile_a))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(rf"1{DASH}64\s+allgather_reducescatter\s+25{DASH}100%", out), out
    assert re.search(rf"256{DASH}1024\s+nccl_all2allv\s+60{DASH}200%", out), out
    assert INCORRECT in out and UNAVAILABLE in out
    assert "flashinfer_nvlink_one_sided" in out and "incorrect" in out
    assert "h200.nvl18x2.node1" in out and "nccl 2.28.9" in out  # provenance
    assert "every shape" in out  # the unavailable failure is listed once, not per shape


def test_show_from_a_database_run_derives_winners_and_lists_failures(two_run_db):
    r = a2a("show", "--db", str(two_run_db), "--run", "1")
    assert r.returncode == 0, r.stderr
    assert re.search(rf"1{DASH}64\s+allgather_reducescatter\s+25{DASH}100%", r.stdout), r.stdout
    assert INCORRECT in r.stdout and UNAVAILABLE in r.stdout
    assert "run 1 (completed)" in r.stdout and "0123abc" in r.stdout

    data = json.loads(a2a("show", "--db", str(two_run_db), "--json").stdout)  # latest completed run: 2
    assert data["run"]["id"] == 2
    s2 = next(s for s in data["shapes"] if s["hidden"] == 4096)
    assert [x["winner"] for x in s2["ranges"]] == ["allgather_reducescatter"]  # nccl_all2allv failed there
    assert "nccl_all2allv" in s2["failed"] and "wrong expert" in s2["failed"]["nccl_all2allv"]


def test_show_reads_schema_2_shapes_tie_flags_and_timing_modes(tmp_path):
    # At 64 tokens nccl_all2allv (20.4) is 2% behind allgather_reducescatter (20, p90 21):
    # inside its spread and within 3%, a tie the table marks.
    p = make_profile(planted(20.4 / 25, "nccl_all2allv", "S1", [64]), schema=2)
    entry = p["entries"][0]
    entry["backends"]["nccl_all2allv"]["timing"] = "graph"
    entry["winners"][3]["tie"] = True
    del p["run"]["timing"]
    view = load_profile_view(write(tmp_path / "s2.json", p))
    assert view.notes == []  # the written winners are what the curves give
    s1 = view.shapes[0]
    assert s1.curves["nccl_all2allv"].timing == "graph"
    ranges = winner_ranges(s1)
    assert ranges[0].ties == [64] and "tie at 64" in ranges[0].line()
    r = a2a("show", "--profile", str(tmp_path / "s2.json"))
    assert r.returncode == 0 and "* tie at 64 tokens/rank" in r.stdout


def test_show_names_the_fastest_when_a_tie_went_to_the_preferred_backend(tmp_path):
    # Schema 2 at 64 tokens: nccl_all2allv (19.6) is fastest, allgather_reducescatter's
    # median (20) is inside its spread and 2% behind, and the tie preference (engine
    # default first) picked allgather.
    p = make_profile(planted(19.6 / 25, "nccl_all2allv", "S1", [64]), schema=2)
    w = p["entries"][0]["winners"][3]
    w.update(
        backend="allgather_reducescatter",
        median_us=20.0,
        fastest="nccl_all2allv",
        runner_up="allgather_reducescatter",
        margin=0.0204,
        tie=True,
    )
    view = load_profile_view(write(tmp_path / "s2.json", p))
    assert view.notes == []
    [w64] = [w for w in view.shapes[0].winners if w.tokens == 64]
    assert (w64.backend, w64.fastest, w64.tie, w64.other) == (
        "allgather_reducescatter",
        "nccl_all2allv",
        True,
        "nccl_all2allv",
    )
    first = winner_ranges(view.shapes[0])[0]
    assert (first.lo, first.hi, first.backend, first.runners_up) == (
        1,
        64,
        "allgather_reducescatter",
        ["nccl_all2allv"],
    )


@pytest.mark.parametrize("schema", [1, 2])
def test_show_and_lookup_agree_on_every_tie(tmp_path, schema):
    """The runner-up inside the fastest's p10..p90 spread but more than 3% behind is no tie:
    show says what the lookup answers at every token count, whatever winners the file holds."""
    tokens = [1, 8, 64, 512]
    nccl = [100.0, 100.0, 100.0, 100.0]  # fastest everywhere; spread 90..120
    allgather = [105.0, 102.0, 119.0, 150.0]  # 5% (in spread, over the cap), 2% (a tie), 19%, outside
    curves = {
        "S": (S2, tokens, {"nccl_all2allv": nccl, "allgather_reducescatter": allgather}),
    }
    p = make_profile(curves, schema=schema)
    entry = p["entries"][0]
    for b, v in (("nccl_all2allv", nccl), ("allgather_reducescatter", allgather)):
        entry["backends"][b]["p10_us"] = [x * 0.9 for x in v]
        entry["backends"][b]["p90_us"] = [x * 1.2 for x in v]
    # Winners as a rule without the 3% cap would write them: every in-spread runner-up a tie.
    for w, in_spread in zip(entry["winners"], [True, True, True, False]):
        if schema == 2:
            w["tie"] = in_spread
            if in_spread:
                w.update(backend="allgather_reducescatter", median_us=allgather[tokens.index(w["tokens"])])
    path = write(tmp_path / "ties.json", p)

    clear_cache()
    view = load_profile_view(path)
    by_t = {w.tokens: w for w in view.shapes[0].winners}
    answers = {}
    for t in tokens:
        c = lookup(profile=path, tokens=t, quiet=True, **S2)
        assert c.match == "exact"
        answers[t] = (c.backend, c.tie)
        assert (by_t[t].backend, by_t[t].tie) == answers[t], t
    assert answers == {
        1: ("nccl_all2allv", False),
        8: ("allgather_reducescatter", True),
        64: ("nccl_all2allv", False),
        512: ("nccl_all2allv", False),
    }
    # The command says the same, and that the file's own winners disagree (schema 2: tie flags).
    data = json.loads(a2a("show", "--profile", str(path), "--json").stdout)
    ranges = data["shapes"][0]["ranges"]
    assert [(r["tokens"], r["winner"], r["ties"]) for r in ranges] == [
        ([1, 1], "nccl_all2allv", []),
        ([8, 8], "allgather_reducescatter", [8]),
        ([64, 512], "nccl_all2allv", []),
    ]
    if schema == 2:
        assert any("winners differ from its curves at 1, 64 tokens/rank" in n for n in data["notes"]), data["notes"]


def test_show_derives_missing_or_stale_winners_and_says_so(tmp_path):
    p = make_profile(schema=2)
    del p["entries"][1]["winners"]
    p["entries"][0]["winners"][0]["backend"] = "nccl_all2allv"  # the curves say allgather at 1 token
    view = load_profile_view(write(tmp_path / "odd.json", p))
    assert view.notes == [
        "entries[0]: the table's winners differ from its curves at 1 tokens/rank; "
        "shown as its curves give them (what the lookup answers)",
        "entries[1]: no winners in the table; derived from its curves",
    ]
    assert winner_ranges(view.shapes[0])[0].backend == "allgather_reducescatter"
    assert [r.backend for r in winner_ranges(view.shapes[1])] == ["allgather_reducescatter", "nccl_all2allv"]


# Cases that are JSON: their problem is the table's, named by the one table reader (file-level
# problems have the views' own wording, tested below).
TABLE_DEFECTS = sorted(
    c for c, (make, problem) in BAD_TABLES.items() if "this machine is" not in problem and _is_json(make())
)


def test_views_read_what_select_writes(tmp_path):
    """The schema-2 table of a2a_tune.tuner.select, including a backend timed under CUDA
    graphs and a correctness failure, reads back with the same winners."""
    from a2a_tune.tuner.runtime.table import to_dict
    from a2a_tune.tuner.select import FailureRow, build_profile

    ms = []
    for shape, tokens, per_backend in CURVES.values():
        for b, values in per_backend.items():
            for t, v in zip(tokens, values):
                timing = "graph" if b == "nccl_all2allv" else "eager"
                ms.append(measured(shape, b, t, float(v), v * 0.95, v * 1.05, timing=timing, n=1))
    fails = [
        FailureRow(**S1, backend="flashinfer_nvlink_one_sided", kind="incorrect", reason=INCORRECT, tokens_per_rank=256)
    ]
    names = {
        b: {"vllm_name": None, "sglang_name": None}
        for b in ("allgather_reducescatter", "nccl_all2allv", "flashinfer_nvlink_one_sided")
    }
    profile = build_profile(
        ms,
        fails,
        hardware={"fingerprint": "h200.nvl18x2.node1", "facts_hash": "x", "facts": H200_FACTS},
        run={"id": 4, "device_type": "cuda", "world_size": 2, "versions": {"nccl": "2.28.9"}},
        backend_names=names,
    )
    view = load_profile_view(write(tmp_path / "sel.json", to_dict(profile)))
    assert view.notes == []
    s1 = view.shape(tuple(S1.values()))
    assert s1.curves["nccl_all2allv"].timing == "graph" and s1.curves["allgather_reducescatter"].timing == "eager"
    assert [(r.tokens, r.backend) for r in winner_ranges(s1)] == [
        (f"1{DASH}64", "allgather_reducescatter"),
        (f"256{DASH}1024", "nccl_all2allv"),
    ]
    assert "flashinfer_nvlink_one_sided" in s1.failed and INCORRECT in s1.failed["flashinfer_nvlink_one_sided"]
    assert "graph: nccl_all2allv" in timing_summary(view)


def test_a_run_timed_in_two_modes_shows_one_curve_per_backend(tmp_path):
    from a2a_tune.db import open_store

    path = tmp_path / "modes.db"
    with open_store(str(path)) as s:
        hw = s.get_or_create_hardware("h200.nvl18x2.node1", "x", H200_FACTS)
        rid = _store_run(s, hw, curves={"S2": CURVES["S2"]}, versions={})
    with open_store(str(path)) as s:
        s.add_measurement(rid, measured(S2, "nccl_all2allv", 1, 5.0, 4.9, 5.1, timing="graph", n=3))
    view = load_run_view(str(path), rid)
    [shape] = view.shapes
    assert set(shape.curves) == {"allgather_reducescatter", "nccl_all2allv"}
    assert shape.curves["nccl_all2allv"].timing == "eager"  # covers 3 token counts, graph only 1
    assert any("nccl_all2allv also has graph timings" in n for n in view.notes)


@pytest.mark.parametrize("case", TABLE_DEFECTS)
def test_views_refuse_every_table_the_lookup_refuses(tmp_path, case):
    make, problem = BAD_TABLES[case]
    path = tmp_path / "bad.json"
    path.write_text(make())
    with pytest.raises(ViewError) as info:
        load_profile_view(path)
    message = str(info.value)
    assert problem in message and "the lookup refuses this table" in message and "\n" not in message


@pytest.mark.parametrize(
    "case",
    ["schema_5", "failure_as_text", "nan_bare_token", "unsorted_tokens", "curve_length_mismatch", "subnormal_median"],
)
def test_show_and_diff_exit_2_on_a_table_the_lookup_refuses(tmp_path, case):
    make, problem = BAD_TABLES[case]
    path = tmp_path / "bad.json"
    path.write_text(make())
    r = a2a("show", "--profile", str(path))
    assert r.returncode == 2 and problem in one_line_error(r), r.stdout
    r = a2a("diff", str(LOOKUP_FIXTURE), str(path))
    assert r.returncode == 2 and problem in one_line_error(r) and "OK" not in r.stdout, r.stdout


# ------------------------------------------------------------------------------ diff


def test_diff_of_a_table_with_itself_is_clean(profile_a):
    r = a2a("diff", str(profile_a), str(profile_a))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 slower" in r.stdout and "OK" in r.stdout


def test_diff_catches_a_planted_regression_and_reports_the_ratio(tmp_path, profile_a):
    b = write(
        tmp_path / "b.json",
        make_profile(
            planted(3.0, "allgather_reducescatter", "S1", [1, 4]), versions={"torch": "2.11.0", "nccl": "2.29.1"}
        ),
    )
    r = a2a("diff", str(profile_a), str(b), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert [(x["backend"], x["tokens"]) for x in data["regressions"]] == [
        ("allgather_reducescatter", 1),
        ("allgather_reducescatter", 4),
    ]
    assert all(x["ratio"] == pytest.approx(3.0) for x in data["regressions"])
    assert data["version_changes"] == {"nccl": ["2.28.9", "2.29.1"]}
    assert data["failing"] == ["regressions"]

    human = a2a("diff", str(profile_a), str(b))
    assert human.returncode == 1
    assert re.search(rf"allgather_reducescatter\s+1{DASH}4\s+3\.00x", human.stdout), human.stdout
    assert "nccl 2.28.9 -> 2.29.1" in human.stdout and "FAIL (regressions)" in human.stdout
    assert a2a("diff", str(profile_a), str(b), "--fail-on", "none").returncode == 0


def test_slower_within_noise_is_not_a_regression(profile_a, tmp_path):
    # +8% with +-5% spreads: B's p10 (1.026x) is below A's p90 (1.05x) -> noise.
    b = make_profile(planted(1.08, "allgather_reducescatter", "S1", [1, 4, 16]))
    res = diff_views(load_profile_view(profile_a), load_profile_view(write(tmp_path / "b.json", b)))
    assert res.regressions == [] and res.failing(["regressions"]) == []
    # +20%: B's p10 (1.14x) is above A's p90 -> a regression; unless the tolerance says otherwise.
    b = make_profile(planted(1.2, "allgather_reducescatter", "S1", [16]))
    res = diff_views(load_profile_view(profile_a), load_profile_view(write(tmp_path / "b2.json", b)))
    assert [(p.backend, p.tokens) for p in res.regressions] == [("allgather_reducescatter", 16)]
    assert diff_views(res.a, res.b, tolerance=0.25).regressions == []


def test_diff_winner_change_exit_codes_follow_fail_on(tmp_path, profile_a):
    # nccl_all2allv 2x faster at 16 tokens: it now wins there (an improvement, no regression).
    b = write(tmp_path / "b.json", make_profile(planted(0.4, "nccl_all2allv", "S1", [16])))
    r = a2a("diff", str(profile_a), str(b), "--json")
    assert r.returncode == 0, r.stdout
    data = json.loads(r.stdout)
    [change] = data["winner_changes"]
    assert (change["tokens"], change["a_winner"], change["b_winner"], change["noise"]) == (
        16,
        "allgather_reducescatter",
        "nccl_all2allv",
        False,
    )
    assert data["regressions"] == [] and len(data["improvements"]) == 1
    assert a2a("diff", str(profile_a), str(b), "--fail-on", "winner-change").returncode == 1
    assert a2a("diff", str(profile_a), str(b), "--fail-on", "regressions").returncode == 0


def test_a_winner_change_inside_the_spreads_is_noise(tmp_path, profile_a):
    # At 64 tokens allgather 20 vs nccl 25: make nccl 19 (5% faster) -> spreads overlap in B.
    b = make_profile(planted(0.76, "nccl_all2allv", "S1", [64]))
    res = diff_views(load_profile_view(profile_a), load_profile_view(write(tmp_path / "b.json", b)))
    [change] = res.winner_changes
    assert change.tokens == 64 and change.noise
    assert res.failing(["winner-change"]) == []


def test_diff_two_runs_of_one_database_reports_new_failures(two_run_db):
    r = a2a("diff", "--db", str(two_run_db), "--run", "1", "--run", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "newly failing in B: nccl_all2allv" in r.stdout and "wrong expert" in r.stdout
    assert re.search(rf"allgather_reducescatter\s+256{DASH}1024\s+3\.00x", r.stdout), r.stdout
    res = diff_views(load_run_view(str(two_run_db), 1), load_run_view(str(two_run_db), 2))
    assert [(f.backend, f.shape) for f in res.new_failures] == [("nccl_all2allv", tuple(S2.values()))]
    # A run against a table: the same store and a profile made of run 1's curves.
    assert a2a("diff", "--db", str(two_run_db), "--run", "1", str(two_run_db)).returncode == 1  # B: latest run (2)


def test_curves_timed_in_another_mode_are_not_compared(tmp_path, profile_a):
    b = make_profile(planted(3.0, "nccl_all2allv", "S1", [1]), schema=2)
    for e in b["entries"]:
        e["backends"]["nccl_all2allv"]["timing"] = "graph"
    res = diff_views(load_profile_view(profile_a), load_profile_view(write(tmp_path / "b.json", b)))
    assert res.regressions == []
    assert any("nccl_all2allv: timing mode eager in A, graph in B" in n for n in res.notes)


@pytest.mark.parametrize(
    "args, message",
    [
        (("diff", "only-one.json"), "exactly two inputs"),
        (("diff", "a.json", "b.json", "c.json"), "exactly two inputs"),
        (("diff", "missing.json", "missing2.json"), "missing.json: cannot read: No such file"),
        (("diff", "--run", "1", "--run", "2"), "--run needs --db"),
        (("diff", "x.json", "y.json", "--fail-on", "sometimes"), "--fail-on must be"),
    ],
)
def test_diff_bad_input_exits_2_with_one_line(tmp_path, args, message):
    r = a2a(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in one_line_error(r)


# ------------------------------------------------------------------------------ plot


@needs_matplotlib
def test_plot_writes_one_png_per_shape(tmp_path, profile_a):
    out = tmp_path / "plots"
    r = a2a("plot", "--profile", str(profile_a), "--out", str(out))
    assert r.returncode == 0, r.stderr
    paths = [Path(p) for p in r.stdout.split()]
    assert len(paths) == 2 and sorted(paths) == sorted(out.glob("*.png"))
    assert {p.name for p in paths} == {
        "h200.nvl18x2.node1.a.ep2_e256_k8_h7168_bf16_uniform.png",  # .a: the table file's name
        "h200.nvl18x2.node1.a.ep2_e8_k2_h4096_bf16_uniform.png",
    }
    for p in paths:
        data = p.read_bytes()
        # 8-bit RGBA, 10.5 in wide by 5.92 in + 0.2 in per legend row (3 here) high, at 110 dpi
        assert png_header(data) == (1155, 717, 8, 6), p.name
        assert len(data) > 10_000  # drawn, not blank


@needs_matplotlib
def test_plot_from_a_database_run(tmp_path, two_run_db):
    r = a2a("plot", "--db", str(two_run_db), "--run", "2", "--out", str(tmp_path / "p"), "--link-gbs", "400")
    assert r.returncode == 0, r.stderr
    pngs = sorted((tmp_path / "p").glob("*.png"))
    assert len(pngs) == 2 and all(png_header(p.read_bytes())[:1] == (1155,) for p in pngs)


@needs_matplotlib
def test_plots_of_two_sources_into_one_folder_keep_both(tmp_path, two_run_db):
    """Issue 37: `plot` named its files by fingerprint and shape only, so plotting a second run (or
    another table) of the machine overwrote the first one's PNGs."""
    out = tmp_path / "p"
    for run in ("1", "2"):
        r = a2a("plot", "--db", str(two_run_db), "--run", run, "--out", str(out))
        assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.glob("*.png"))
    assert len(names) == 4 and {n.split(".")[-3] for n in names} == {"run1", "run2"}, names


def test_copy_bound_takes_nvlink_bandwidth_from_the_probe_facts(profile_a):
    from a2a_tune.tuner.views.plot import copy_bound, remote_ranks

    view = load_profile_view(profile_a)
    s1 = view.shape(tuple(S1.values()))
    bound, why = copy_bound(view, s1)
    assert why is None and bound.gbs == pytest.approx(18 * 26.562)
    assert "18 NVLinks x 26.562 GB/s" in bound.assumption
    # 2 ranks, 256 experts, top-8: all 8 experts land on the own rank with
    # p = 128/256 x 127/255 x ... x 121/249 = 0.00349.
    miss = 1.0
    for i in range(8):
        miss *= (128 - i) / (256 - i)
    assert remote_ranks(256, 8, 2) == pytest.approx(1 - miss) and remote_ranks(256, 8, 2) == pytest.approx(
        0.9965, abs=1e-4
    )
    # 1024 tokens x 7168 x 2 B x 0.9965 x 2 (dispatch + combine) / 478.1 GB/s = 61.2 µs
    assert bound.us(1024) == pytest.approx(1024 * 7168 * 2 * (1 - miss) * 2 / 478.116e9 * 1e6, rel=1e-6)
    assert bound.us(1024) == pytest.approx(61.2, abs=0.1)
    assert copy_bound(view, s1, link_gbs=100)[0].gbs == 100

    view.facts = {"gpus": [], "islands": []}  # a CPU run or a PCIe-only box
    bound, why = copy_bound(view, s1)
    assert bound is None and "--link-gbs" in why


# ---------------------------------------------------------------------------- report


@needs_matplotlib
def test_report_is_one_self_contained_html_file_with_the_plots_inside(tmp_path):
    p = make_profile()
    p["entries"][0]["failed"]["evil_backend"] = "error: <script>alert(1)</script>"
    src = write(tmp_path / "a.json", p)
    out = tmp_path / "out" / "report.html"
    r = a2a("report", "--profile", str(src), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert [f.name for f in (tmp_path / "out").iterdir()] == ["report.html"]
    text = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "<link" not in text and "<script" not in text and "@import" not in text
    assert "&lt;script&gt;" in text  # reasons are escaped
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 2
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    for needle in (
        "h200.nvl18x2.node1",
        "NVIDIA H200",
        "18 links/GPU",
        "2.28.9",
        INCORRECT,
        UNAVAILABLE,
        "allgather_reducescatter",
        f"1{DASH}64",
    ):
        assert html.escape(needle) in text, needle


# ------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read: No such file"),  # the lookup's own words: one reader (issue 31.3)
        (b'{"schema": 1, "entr', "invalid JSON"),
        (b"[1, 2]", "top level: expected a JSON object"),
        (b'{"schema": 1}', "hardware: expected a JSON object"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
    ],
)
def test_bad_profile_gives_one_line_error(tmp_path, content, message):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_bytes(content)
    for command in ("show", "plot", "report"):
        r = a2a(command, "--profile", str(path), cwd=tmp_path)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert message in one_line_error(r)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no database at"),
        (b"", "empty file, not an a2a-tune database"),
        (b"this is not a database at all" * 10, "not an SQLite database"),
        (b"SQLite format 3\x00" + b"\x00" * 84 + b"garbage" * 100, "cannot open database"),
    ],
)
def test_corrupt_or_missing_database_gives_one_line_error_and_is_left_alone(tmp_path, content, message):
    path = tmp_path / "a.db"
    if content is not None:
        path.write_bytes(content)
    r = a2a("show", "--db", str(path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in one_line_error(r)
    assert path.exists() == (content is not None)  # a view never creates a database...
    if content is not None:
        assert path.read_bytes() == content  # ...nor writes to one


def test_unknown_run_names_the_runs_there(two_run_db):
    r = a2a("show", "--db", str(two_run_db), "--run", "9")
    assert r.returncode == 2
    assert "no run 9" in one_line_error(r) and "runs: 1, 2" in r.stderr


def test_a_database_given_as_profile_says_so(two_run_db):
    with pytest.raises(ViewError, match="is an SQLite database, not a profile"):
        load_profile_view(two_run_db)
    with pytest.raises(ViewError, match="either --profile"):
        load_view(profile=two_run_db, db="x.db")


def test_a_db_view_breaks_ties_in_the_order_select_uses():
    config = {"backends": ["allgather_reducescatter", "nccl_all2allv", "nvlink_one_sided", "nvlink_low_latency"]}
    pref = run_tie_preference(config)
    assert pref.index("nvlink_one_sided") < pref.index("nvlink_low_latency")
    assert pref[0] == "allgather_reducescatter"
    assert run_tie_preference(None) == ("allgather_reducescatter",)


# ----------------------------------------------------------------- hostile table strings

# An OSC window title, a screen clear and a stray rich closing tag.
EVIL = "evil\x1b]0;pwned\x07\x1b[2J[/]"


def test_escape_sequences_in_a_table_never_reach_the_terminal(tmp_path, profile_a):
    curves = copy.deepcopy(CURVES)
    curves["S1"][2][EVIL] = [1, 1, 1, 1, 1, 1]  # the fastest everywhere: the winner
    p = make_profile(curves)
    p["entries"][1]["failed"]["deepep_low_latency"] = "unavailable: \x1b[31mred\x1b[0m\r\nsecond line"
    path = write(tmp_path / "evil.json", p)
    for r in (a2a("show", "--profile", str(path)), a2a("diff", str(profile_a), str(path))):
        assert r.returncode in (0, 1), r.stderr
        assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout and "Traceback" not in r.stderr
        assert "evil\\x1b]0;pwned\\x07\\x1b[2J[/]" in r.stdout  # shown, as its escapes
    assert "\\x1b[31mred\\x1b[0m second line" in a2a("show", "--profile", str(path)).stdout
    del p["backends"][EVIL]  # now a table the lookup refuses, and the refusal names the curve
    r = a2a("show", "--profile", str(write(tmp_path / "evil2.json", p)))
    assert r.returncode == 2 and "backends.evil\\x1b]0;pwned" in one_line_error(r) and "\x1b" not in r.stderr


@needs_matplotlib
def test_a_dollar_in_a_backend_name_is_text_in_plots_and_reports(tmp_path):
    from a2a_tune.tuner.views.plot import plot_view
    from a2a_tune.tuner.views.report import render_report

    name = "price$\\frac{1$"  # matplotlib would parse "$...$" as math, and fail on this one
    curves = copy.deepcopy(CURVES)
    curves["S1"][2][name] = [15, 15, 15, 15, 15, 15]
    view = load_profile_view(write(tmp_path / "dollar.json", make_profile(curves)))
    assert len(plot_view(view, tmp_path / "plots")) == 2
    assert html.escape(name) in render_report(view)


def test_a_run_reads_as_the_table_select_writes_for_it(two_run_db, tmp_path):
    """A run read straight from the store shows what the table selected from it shows."""
    from a2a_tune.db import open_store
    from a2a_tune.tuner.select import profile_from_store, write_profile

    names = {b: {"vllm_name": None, "sglang_name": None} for b in ("allgather_reducescatter", "nccl_all2allv")}
    for run in (1, 2):
        with open_store(str(two_run_db)) as s:
            table = write_profile(profile_from_store(s, run, backend_names=names), tmp_path / str(run))
        from_run, from_table = show_data(load_run_view(str(two_run_db), run)), show_data(load_profile_view(table))
        assert from_run["shapes"] == from_table["shapes"]


def test_a_resumed_run_says_when_it_began_and_was_resumed_from_the_store_and_its_table(tmp_path):
    """Issue 37: a run is dated from its command's start; a resumed run keeps its first start,
    says when it was resumed and counts its duration from the resume (the pause between is no
    part of the run). The table select writes for it says the same."""
    import datetime as dt

    from a2a_tune.db import Writer, open_store
    from a2a_tune.tuner.select import profile_from_store, write_profile
    from a2a_tune.tuner.views.model import when
    from a2a_tune.tuner.views.show import provenance_lines

    now = dt.datetime.now(dt.timezone.utc)
    launched, resumed = now - dt.timedelta(hours=3), now - dt.timedelta(seconds=90)
    db = str(tmp_path / "r.db")
    names = {b: {"vllm_name": None, "sglang_name": None} for b in ("allgather_reducescatter",)}
    with open_store(db) as s:
        hw = s.get_or_create_hardware("h200.nvl18x2.node1", "9558368b0d85f2c4", H200_FACTS)
        run = start_run(s, hw, config={}, config_hash="h", launched_at=launched)
        s.add_measurement(run, measured(S1, "allgather_reducescatter", 1, 10.0, 9.5, 10.5, n=3))
        s.finish_run(run, "interrupted")
        me = Writer.this_process()
        s.claim_run(run, me, resumed_at=resumed)
        s.finish_run(run, "completed", writer=me)
        record = s.get_run(run)
        table = write_profile(profile_from_store(s, run, backend_names=names), tmp_path / "tables")
    assert (record.launched_at, record.resumed_at) == (launched, resumed)
    span = f"{(record.finished_at - resumed).total_seconds():.0f} s"
    expected = f"{when(launched)}, resumed {when(resumed)} ({span} from the resume to the end)"
    assert dict(provenance_lines(load_run_view(db, run)))["measured"] == expected
    assert dict(provenance_lines(load_profile_view(table)))["measured"] == expected


# ------------------------------------------------------------------------ 80 columns, CPU ranks

LONG_NAMES = {  # the fixture's backends renamed to the longest shipped names
    '"nvlink_one_sided"': '"allgather_reducescatter_padded"',
    '"nccl_all2allv"': '"flashinfer_nvlink_two_sided"',
}


def _long_named_profile(tmp_path) -> Path:
    text = (LOOKUP_FIXTURE.parent / "test.fixture.node1.json").read_text()
    for old, new in LONG_NAMES.items():
        text = text.replace(old, new)
    path = tmp_path / "long.json"
    path.write_text(text)
    return path


def test_show_at_80_columns_never_cuts_or_breaks_a_backend_name(tmp_path):
    path = _long_named_profile(tmp_path)
    r = a2a("show", "--profile", str(path), env_extra={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines() if "│" in line or "─" in line) <= 80
    words = set(re.findall(r"[\w.-]+", r.stdout))
    names = set(json.loads(path.read_text())["backends"])
    assert names <= words, names - words  # each name whole, on one line


def _cpu_profile(tmp_path) -> Path:
    p = make_profile(fingerprint="cpu-x86.node1")
    p["run"]["device_type"] = "cpu"
    return write(tmp_path / "cpu.json", p)


def test_show_says_a_cpu_rank_table_is_a_rehearsal(tmp_path):
    view = load_profile_view(_cpu_profile(tmp_path))
    assert any("rehearsal" in n and "CPU ranks" in n for n in view.notes)
    assert not any("rehearsal" in n for n in load_profile_view(write(tmp_path / "gpu.json", make_profile())).notes)
    r = a2a("show", "--profile", str(tmp_path / "cpu.json"))
    assert r.returncode == 0 and "note: measured on CPU ranks over gloo: a rehearsal" in r.stdout


def test_report_says_a_cpu_rank_table_is_a_rehearsal_and_when_its_plots_are_left_out(tmp_path):
    fake = tmp_path / "no_matplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {"PYTHONPATH": f"{fake.parent}{os.pathsep}{os.environ['PYTHONPATH']}"}
    out = tmp_path / "r.html"
    r = a2a("report", "--profile", str(_cpu_profile(tmp_path)), "--out", str(out), env_extra=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()  # the path whole on its line, then the rest (issue 37: 93 columns)
    assert lines[0] == f"wrote {out}"
    assert " ".join(" ".join(lines[1:]).split()) == (
        "2 shape(s); without plots: plotting needs matplotlib: pip install 'a2a-tune[plot]'"
    )
    narrow = a2a(
        "report", "--profile", str(_cpu_profile(tmp_path)), "--out", str(out), env_extra={**env, "COLUMNS": "80"}
    )
    assert [line for line in narrow.stdout.splitlines()[1:] if len(line) > 80] == []
    assert "a rehearsal of the flow" in out.read_text()


def test_report_states_the_saving_against_vllms_default_in_decode(tmp_path):
    """Per shape: vLLM's fastest told (S1: flashinfer_nvlink_one_sided is incorrect there, so
    allgather_reducescatter, the default itself: no saving) and, for a preset model, per step."""
    from a2a_tune.tuner.views.load import load_profile_view
    from a2a_tune.tuner.views.report import _vs_default

    p = make_profile()
    for name in ("allgather_reducescatter", "flashinfer_nvlink_one_sided"):  # the engine's names for them
        p["backends"][name]["vllm_name"] = name
    p["entries"][1]["backends"]["nccl_all2allv"]["median_us"] = [1.0, 1.0, 1.0]  # no vLLM literal: not told
    view = load_profile_view(write(tmp_path / "a.json", p))
    lines = {s.key: _vs_default(view, s) for s in view.shapes}
    for key, line in lines.items():
        assert "vs vLLM&#x27;s default (allgather_reducescatter)" in line and "decode 1.." in line, line
        # a preset's shape, with the preset's MoE layers (every preset has its count: issue 37)
        layers = {(7168, 8, 256): 58, (4096, 2, 8): 32}[key[1:4]]
        assert "ms per decode step" in line and f"({layers} MoE layers)" in line, line


def test_report_states_what_each_engine_can_start_with(tmp_path):
    """The engines section lists the start-up rules that concern this table's backends."""
    from a2a_tune.tuner.views.load import load_profile_view
    from a2a_tune.tuner.views.report import _engines_section

    p = make_profile()
    p["backends"]["flashinfer_nvlink_one_sided"]["vllm_name"] = "flashinfer_nvlink_one_sided"
    text = _engines_section(load_profile_view(write(tmp_path / "a.json", p)))
    assert "vllm/lora/layers/fused_moe.py:FusedMoEWithLoRA._ep_check" in text and "LoRA with expert parallelism" in text
