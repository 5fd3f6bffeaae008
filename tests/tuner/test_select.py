"""Selection: measurements -> profile dict -> validated, atomically written JSON.

CPU only, no database: build_profile works on plain values. The packaged test
fixture tests/fixtures/profiles/test.fixture.node1.json is exactly what
``fixture_profile()`` builds (regenerate: ``write_profile(fixture_profile(), FIXTURES)``);
schema1/ and schema2/ hold the same table as the releases before wrote it.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import paths
import pytest
from stored import measured

from a2a_tune.tuner import select
from a2a_tune.tuner.runtime.engines import ENGINES
from a2a_tune.tuner.runtime.lookup import ProfileError, load_profile, lookup, profile_filename
from a2a_tune.tuner.runtime.table import Failed, to_dict
from a2a_tune.tuner.select import FailureRow, upgrade_profile, validate_profile


def build_profile(*args, **kwargs) -> dict:
    """select's Profile as the object its file holds: what these tests inspect and change."""
    return to_dict(select.build_profile(*args, **kwargs))


def profile_from_store(*args, **kwargs) -> dict:
    return to_dict(select.profile_from_store(*args, **kwargs))


def write_profile(table: dict, directory):
    """Write a table object as select writes a Profile, read first as a file is read."""
    return select.write_profile(validate_profile(table), directory)


FIXTURES = paths.FIXTURES / "profiles"
FIXTURE_FP = "test.fixture.node1"

SHAPE_A = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, dtype="bf16", routing="uniform")
SHAPE_B = dict(ep_size=2, hidden=4096, topk=6, num_experts=64, dtype="bf16", routing="uniform")
NO_SHAPE = dict(ep_size=None, hidden=None, topk=None, num_experts=None, dtype=None, routing=None)

# shape -> (tokens per rank, {backend: median µs per token count, None = not measured})
# Shape A is built so that nvlink_one_sided and nccl_all2allv cross between 64 and 256
# tokens at ~234 tokens: at 200 tokens interpolation says nvlink_one_sided, while the
# nearest bucket (256) says nccl_all2allv. flashinfer_nvlink_one_sided is fastest
# everywhere but fails the correctness check, so it must never win.
CURVES = {
    "A": (
        SHAPE_A,
        [1, 4, 16, 64, 256, 1024],
        {
            "allgather_reducescatter": [30, 31, 35, 100, 400, 1500],
            "nccl_all2allv": [45, 46, 50, 75, 190, 420],
            "nvlink_one_sided": [20, 21, 25, 50, 195, None],
            "flashinfer_nvlink_one_sided": [5, 5, 5, 5, 5, 5],
        },
    ),
    "B": (
        SHAPE_B,
        [1, 64, 1024],
        {
            "allgather_reducescatter": [20, 60, 600],
            "nccl_all2allv": [40, 70, 300],
        },
    ),
}

BACKEND_NAMES = {
    "allgather_reducescatter": {"vllm_name": "allgather_reducescatter", "sglang_name": None},
    "nccl_all2allv": {"vllm_name": None, "sglang_name": None},
    "nvlink_one_sided": {"vllm_name": None, "sglang_name": None},
    "flashinfer_nvlink_one_sided": {"vllm_name": "flashinfer_nvlink_one_sided", "sglang_name": None},
    "deepep_low_latency": {"vllm_name": "deepep_low_latency", "sglang_name": "deepep"},
}

HARDWARE = {"fingerprint": FIXTURE_FP, "facts_hash": "0" * 16, "facts": {"gpus": [{"name": "Test GPU"}] * 2}}
RUN = {
    "id": 1,
    "device_type": "cuda",
    "world_size": 2,
    "versions": {"torch": "2.11.0", "nccl": "2.28.3"},
    "started_at": dt.datetime(2026, 11, 30, 14, 0),
    "finished_at": dt.datetime(2026, 11, 30, 14, 30),
}


# nvlink_one_sided is CUDA-graph capturable: the sweep times it under graph replay, the others
# eagerly -- one table, two timing modes (schema 2 records the mode per backend per entry).
TIMINGS = {"nvlink_one_sided": "graph"}


# Shape A's measurements carry the figures beside the round trip (schema 3): dispatch 45% and
# combine 50% of it, every token to both ranks (bf16 rows of 7168 x 2 B; half of them over the
# link), and each backend's device memory; shape B's carry none, like runs from before them.
WORKSPACE_MIB = {
    "allgather_reducescatter": 16,
    "nccl_all2allv": 64,
    "nvlink_one_sided": 3072,
    "flashinfer_nvlink_one_sided": 6144,
}


def _figures(shape, backend, t, v) -> dict:
    if shape is not SHAPE_A:
        return {}
    row = shape["hidden"] * 2
    return {
        "dispatch_median_us": v * 0.45,
        "combine_median_us": v * 0.5,
        "dispatch_logical_bytes": 2.0 * t * row,
        "dispatch_link_bytes": 1.0 * t * row,
        "combine_logical_bytes": 2.0 * t * row,
        "combine_link_bytes": 1.0 * t * row,
        "workspace_bytes": WORKSPACE_MIB[backend] * 2**20,
    }


def measurements_from(curves=CURVES, timing=None):
    out = []
    for shape, tokens, per_backend in curves.values():
        for backend, values in per_backend.items():
            for t, v in zip(tokens, values):
                if v is not None:
                    mode = timing or TIMINGS.get(backend, "eager")
                    figures = _figures(shape, backend, t, v)
                    # 50 samples, of which only the statistics matter here
                    out.append(measured(shape, backend, t, float(v), v * 0.98, v * 1.03, timing=mode, n=50, **figures))
    return out


FAILURES = [
    FailureRow(
        **SHAPE_A,
        backend="flashinfer_nvlink_one_sided",
        kind="incorrect",
        tokens_per_rank=256,
        reason="max abs error 0.5 > tol 0.016 (bf16)",
    ),
    FailureRow(
        **SHAPE_A,
        backend="nvlink_one_sided",
        kind="timeout",
        tokens_per_rank=1024,
        reason="no completion flag after 10 s",
    ),
    FailureRow(
        **NO_SHAPE,
        backend="deepep_low_latency",
        kind="unavailable",
        tokens_per_rank=None,
        reason="package deep_ep not installed",
    ),
]


def fixture_profile() -> dict:
    return build_profile(
        measurements_from(),
        FAILURES,
        hardware=HARDWARE,
        run=RUN,
        backend_names=BACKEND_NAMES,
        generated_at="2026-11-30T15:00:00Z",
    )


def entry(profile, **shape):
    (e,) = [e for e in profile["entries"] if all(e[k] == v for k, v in shape.items())]
    return e


# ----------------------------------------------------------------------------- build


def test_winners_follow_the_crossover_with_margins():
    p = build_profile(
        measurements_from(
            {
                "X": (
                    SHAPE_B,
                    [1, 8, 64],
                    {
                        "allgather_reducescatter": [10, 20, 80],
                        "nccl_all2allv": [20, 22, 40],
                    },
                )
            }
        ),
        [],
        hardware=HARDWARE,
        run=RUN,
        backend_names=BACKEND_NAMES,
    )
    (e,) = p["entries"]
    assert p["schema"] == 4
    assert e["tokens"] == [1, 8, 64]
    assert [(w["tokens"], w["backend"], w["fastest"], w["runner_up"], w["tie"]) for w in e["winners"]] == [
        (1, "allgather_reducescatter", "allgather_reducescatter", "nccl_all2allv", False),
        (8, "allgather_reducescatter", "allgather_reducescatter", "nccl_all2allv", False),
        (64, "nccl_all2allv", "nccl_all2allv", "allgather_reducescatter", False),
    ]
    assert [w["margin"] for w in e["winners"]] == [1.0, 0.1, 1.0]  # runner_up / fastest - 1
    assert [w["median_us"] for w in e["winners"]] == [10.0, 20.0, 40.0]
    assert e["failed"] == {}
    assert "timing" not in p["run"]  # per backend now
    assert {b: c["timing"] for b, c in e["backends"].items()} == {
        "allgather_reducescatter": "eager",
        "nccl_all2allv": "eager",
    }
    validate_profile(p)


def test_tie_goes_to_the_engine_default_then_registry_order(tmp_path):
    """A runner-up inside the fastest's p10..p90 is a tie: the measurement cannot tell them
    apart, so the tie preference (engine default first, then registry order) decides."""
    curves = {
        "X": (
            SHAPE_B,
            [1, 8, 64],
            {
                "nccl_all2allv": [10.0, 20.0, 40.0],  # fastest everywhere; p90 = 1.03 x median
                "allgather_reducescatter": [10.2, 30.0, 41.0],  # within 3% at 1 and 64 tokens
                "nvlink_one_sided": [10.1, 20.4, 80.0],  # within 3% at 1 and 8 tokens
            },
        )
    }
    p = build_profile(
        measurements_from(curves, timing="eager"), [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES
    )
    (e,) = p["entries"]
    assert p["tie_preference"] == ["allgather_reducescatter", "nccl_all2allv", "nvlink_one_sided"]
    assert [(w["tokens"], w["backend"], w["fastest"], w["tie"]) for w in e["winners"]] == [
        (1, "allgather_reducescatter", "nccl_all2allv", True),  # engine default wins the 3-way tie
        (8, "nccl_all2allv", "nccl_all2allv", True),  # registered before nvlink_one_sided
        (64, "allgather_reducescatter", "nccl_all2allv", True),
    ]
    w1 = e["winners"][0]
    assert (w1["median_us"], w1["runner_up"], w1["margin"]) == (10.2, "nvlink_one_sided", 0.01)  # margin: vs fastest
    # Lookup applies the same rule, so at a measured point it answers the table's winner.
    out = write_profile(p, tmp_path)
    for w in e["winners"]:
        c = lookup(profile=out, tokens=w["tokens"], **SHAPE_B)
        assert (c.backend, c.tie) == (w["backend"], w["tie"])
    reason = lookup(profile=out, tokens=1, **SHAPE_B).reason
    assert (
        "allgather_reducescatter 10.200 us (+2.0%), fastest nccl_all2allv 10.000 us; tie: nvlink_one_sided, "
        "allgather_reducescatter within nccl_all2allv's p10..p90, preferring allgather_reducescatter"
    ) in reason


def test_timing_mode_is_per_backend_and_one_per_curve():
    # nvlink_one_sided is graph-timed, the rest eager: one table, mixed modes.
    p = fixture_profile()
    a = entry(p, hidden=7168)
    assert {b: c["timing"] for b, c in a["backends"].items()} == {
        "allgather_reducescatter": "eager",
        "flashinfer_nvlink_one_sided": "eager",
        "nccl_all2allv": "eager",
        "nvlink_one_sided": "graph",
    }
    # A backend timed both ways keeps ONE mode per entry: the one covering more token counts
    # (graph on a draw), never a patchwork curve.
    both = measurements_from({"X": (SHAPE_B, [1, 8, 64], {"nccl_all2allv": [10, 20, 40]})}, timing="eager")
    both += measurements_from({"X": (SHAPE_B, [1, 8], {"nccl_all2allv": [5, 6]})}, timing="graph")
    (e,) = build_profile(both, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)["entries"]
    assert e["backends"]["nccl_all2allv"]["timing"] == "eager"
    assert e["backends"]["nccl_all2allv"]["median_us"] == [10.0, 20.0, 40.0]
    both += measurements_from({"X": (SHAPE_B, [64], {"nccl_all2allv": [7]})}, timing="cuda_graph")  # a synonym
    (e,) = build_profile(both, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)["entries"]
    assert e["backends"]["nccl_all2allv"]["timing"] == "graph"
    assert e["backends"]["nccl_all2allv"]["median_us"] == [5.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="timing='host'"):
        build_profile(measurements_from(timing="host"), [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)
    # virtual-rank samples (one device standing for every rank) are no table's figures either
    with pytest.raises(ValueError, match="timing='virtual'"):
        build_profile(measurements_from(timing="virtual"), [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)


def test_incorrect_backend_is_failed_for_the_whole_shape_and_never_wins():
    p = fixture_profile()
    a = entry(p, hidden=7168)
    failed = a["failed"]["flashinfer_nvlink_one_sided"]  # structure, never text to parse back
    assert (failed["kind"], failed["tokens"]) == ("incorrect", 256)
    assert failed["reason"].startswith("max abs error")
    # Fastest at every token count, yet never a winner or runner-up.
    assert all(w["backend"] != "flashinfer_nvlink_one_sided" for w in a["winners"])
    assert all(w["runner_up"] != "flashinfer_nvlink_one_sided" for w in a["winners"])
    # Its timings stay in the table for inspection.
    assert a["backends"]["flashinfer_nvlink_one_sided"]["median_us"] == [5.0] * 6
    # Only shape A: it was correct on shape B (not measured there, not failed there).
    assert "flashinfer_nvlink_one_sided" not in entry(p, hidden=4096)["failed"]


def test_unavailable_without_shape_goes_into_every_entry():
    p = fixture_profile()
    for e in p["entries"]:
        assert e["failed"]["deepep_low_latency"] == {
            "kind": "unavailable",
            "tokens": None,
            "reason": "package deep_ep not installed",
        }
    # One map, every engine: null where the engine has no literal.
    assert p["backends"]["deepep_low_latency"] == {
        "engines": {"vllm": "deepep_low_latency", "sglang": "deepep", "trtllm": None}
    }


def test_timeout_leaves_a_null_point_only():
    a = entry(fixture_profile(), hidden=7168)
    assert a["backends"]["nvlink_one_sided"]["median_us"] == [20.0, 21.0, 25.0, 50.0, 195.0, None]
    assert a["backends"]["nvlink_one_sided"]["p90_us"][-1] is None
    assert "nvlink_one_sided" not in a["failed"]
    assert [w["backend"] for w in a["winners"]] == [
        "nvlink_one_sided",
        "nvlink_one_sided",
        "nvlink_one_sided",
        "nvlink_one_sided",
        "nccl_all2allv",
        "nccl_all2allv",
    ]


def test_backend_that_only_errored_on_a_shape_is_explained():
    fails = [
        FailureRow(**SHAPE_B, backend="nvlink_one_sided", kind="error", tokens_per_rank=64, reason="CUDA OOM\nat alloc")
    ]
    p = build_profile(measurements_from(), fails, hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)
    assert entry(p, hidden=4096)["failed"]["nvlink_one_sided"] == {
        "kind": "error",
        "tokens": 64,
        "reason": "CUDA OOM at alloc",
    }
    assert "nvlink_one_sided" not in entry(p, hidden=7168)["failed"]  # measured there: just a null


def test_duplicate_point_keeps_lower_median():
    ms = measurements_from({"X": (SHAPE_B, [1], {"nccl_all2allv": [30]})})
    ms.append(measured(SHAPE_B, "nccl_all2allv", 1, 25.0, 24.0, 26.0, n=50))
    p = build_profile(ms, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)
    assert p["entries"][0]["backends"]["nccl_all2allv"]["median_us"] == [25.0]


def test_no_measurements_gives_no_entries_and_is_not_writable(tmp_path):
    p = build_profile([], FAILURES, hardware=HARDWARE, run={**RUN, "timing": "eager"}, backend_names=BACKEND_NAMES)
    assert p["entries"] == []
    with pytest.raises(ProfileError, match="^entries: "):
        write_profile(p, tmp_path)
    assert os.listdir(tmp_path) == []


def test_microseconds_keep_three_decimals():
    ms = measurements_from({"X": (SHAPE_B, [1], {"nccl_all2allv": [41.23456789]})})
    p = build_profile(ms, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)
    assert p["entries"][0]["backends"]["nccl_all2allv"]["median_us"] == [41.235]


def test_checked_in_fixture_is_what_select_builds():
    on_disk = json.loads((FIXTURES / f"{FIXTURE_FP}.json").read_text())
    built = fixture_profile()
    on_disk.pop("generated_by"), built.pop("generated_by")
    assert on_disk == built


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.json")), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_profile_matches_its_schema(path):
    validate_profile(json.loads(path.read_text()))  # schema-v1/-v2/-v3.json by its "schema"


def test_packaged_profiles_match_their_schema():
    import importlib.resources

    packaged = Path(os.fspath(importlib.resources.files("a2a_tune.profiles")))
    tables = [p for p in packaged.glob("*.json") if not p.name.startswith("schema-")]
    assert tables
    for p in tables:
        validate_profile(json.loads(p.read_text()))


def test_upgrade_schema1_to_the_current_schema():
    v1 = json.loads((FIXTURES / "schema1" / f"{FIXTURE_FP}.json").read_text())
    assert v1["schema"] == 1 and v1["run"]["timing"] == "eager"
    v2 = upgrade_profile(v1)
    validate_profile(v2)
    assert v1["schema"] == 1  # the input is not modified
    assert v2["schema"] == 4 and "timing" not in v2["run"]
    assert v2["tie_preference"][0] == "allgather_reducescatter"
    a = entry(v2, hidden=7168)
    assert {c["timing"] for c in a["backends"].values()} == {"eager"}
    assert a["backends"]["nvlink_one_sided"]["median_us"] == [20.0, 21.0, 25.0, 50.0, 195.0, None]
    # Its spreads were p10 = 0.95, p90 = 1.1 x median: at 256 tokens nvlink_one_sided (195) is
    # inside nccl_all2allv's 190 [180.5, 209]: a tie, which the engine-default-first order
    # leaves with nccl_all2allv (allgather_reducescatter is not inside the spread).
    w256 = [w for w in a["winners"] if w["tokens"] == 256][0]
    assert (w256["backend"], w256["fastest"], w256["tie"]) == ("nccl_all2allv", "nccl_all2allv", True)
    # Failure text becomes structure, read once on load (the one upgrade path).
    assert {b: str(Failed(**f)) for b, f in a["failed"].items()} == v1["entries"][1]["failed"]
    assert upgrade_profile(v2) == v2  # the current schema: a copy
    with pytest.raises(ProfileError, match="^schema: version 7 is from a newer a2a-tune .*; upgrade a2a-tune"):
        upgrade_profile({**v1, "schema": 7})
    with pytest.raises(ProfileError, match="^schema: unsupported version 0 .*regenerate the table"):
        upgrade_profile({**v1, "schema": 0})


def failure_of(text: str) -> tuple:
    """(kind, tokens, reason) a schema-2 failure text says, for the check below."""
    kind, _, reason = text.partition(": ")
    kind, _, at = kind.partition(" at ")
    return kind, int(at.split()[0]) if at else None, reason


def test_upgrade_schema2_changes_the_names_the_failures_and_the_version_only():
    """A schema-2 table has no figures (schema 3 makes them optional); schema 4 writes engine
    literals as one map, failures as structure and each entry's provenance (its one run)."""
    v2 = json.loads((FIXTURES / "schema2" / f"{FIXTURE_FP}.json").read_text())
    assert v2["schema"] == 2
    v4 = upgrade_profile(v2)
    validate_profile(v4)
    names = {b: {"engines": {e: n.get(f"{e}_name") for e in ENGINES}} for b, n in v2["backends"].items()}
    run, facts_hash = v2["run"], v2["hardware"]["facts_hash"]
    source = [{"run": run["id"], "date": run["started_at"], "facts_hash": facts_hash, "status": "completed"}]
    entries = [
        {**e, "failed": {b: dict(zip(("kind", "tokens", "reason"), failure_of(t))) for b, t in e["failed"].items()}}
        for e in v2["entries"]
    ]
    assert v4 == {
        **v2,
        "schema": 4,
        "backends": names,
        "entries": [{**e, "provenance": source} for e in entries],
    }
    validate_profile(v2)  # and schema 2 still validates as it is


def test_figures_come_from_the_measurement_whose_median_is_kept():
    p = fixture_profile()
    a = entry(p, hidden=7168)["backends"]["nccl_all2allv"]
    assert a["dispatch_us"] == [round(v * 0.45, 3) for v in (45, 46, 50, 75, 190, 420)]
    assert a["combine_us"] == [round(v * 0.5, 3) for v in (45, 46, 50, 75, 190, 420)]
    assert a["dispatch_logical_bytes"] == [2.0 * t * 7168 * 2 for t in (1, 4, 16, 64, 256, 1024)]
    assert a["workspace_mib"] == [64.0] * 6
    # nvlink_one_sided has no measurement at 1024: null there, as its round trip
    assert entry(p, hidden=7168)["backends"]["nvlink_one_sided"]["workspace_mib"][-1] is None
    # shape B was measured without them: its curves carry the round trip alone
    assert set(entry(p, hidden=4096)["backends"]["nccl_all2allv"]) == {"timing", "median_us", "p10_us", "p90_us"}
    # a resumed run measured a point twice: the figures of the lower median win with it
    twice = measurements_from({"X": (SHAPE_A, [4], {"nccl_all2allv": [40]})})
    twice += [
        replace(twice[0], median_us=30.0, p10_us=29.0, p90_us=31.0, figures={**twice[0].figures, "dispatch_us": 11.0})
    ]
    (e,) = build_profile(twice, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)["entries"]
    assert e["backends"]["nccl_all2allv"]["dispatch_us"] == [11.0]


# -------------------------------------------------------------------------- validate


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda p: p.__setitem__("schema", 5), "schema"),
        (lambda p: p.__setitem__("schema", "2"), "schema"),
        (lambda p: p["entries"][0]["failed"].__setitem__("x", "error: text"), "entries[0].failed.x"),
        (lambda p: p["entries"][0].__setitem__("fabric", "pcie"), "entries[0].fabric"),
        (lambda p: p["backends"]["nccl_all2allv"].__setitem__("vllm_name", None), "backends.nccl_all2allv"),
        (
            lambda p: p["entries"][0]["backends"]["nccl_all2allv"].__setitem__("workspace_mib", [1.0, -1.0, 2.0]),
            "entries[0].backends.nccl_all2allv.workspace_mib[1]",
        ),
        (
            lambda p: p["entries"][1]["backends"]["nvlink_one_sided"].__setitem__("timing", "cuda_graph"),
            "entries[1].backends.nvlink_one_sided.timing",
        ),
        (lambda p: p["entries"][0]["winners"][0].__setitem__("tie", "no"), "entries[0].winners[0].tie"),
        (lambda p: p["tie_preference"].append("mystery"), "tie_preference[5]"),
        (lambda p: p.pop("tie_preference"), "top level"),
        # p10 above the median (a broken spread) is caught by the reader's own checks:
        (
            lambda p: p["entries"][0]["backends"]["nccl_all2allv"]["p10_us"].__setitem__(0, 45.0),
            "entries[0].backends.nccl_all2allv.median_us[0]",
        ),
        (lambda p: p["hardware"].__setitem__("fingerprint", "Bad/FP"), "hardware.fingerprint"),
        (
            lambda p: p["entries"][1]["backends"]["nccl_all2allv"]["median_us"].__setitem__(2, -1.0),
            "entries[1].backends.nccl_all2allv.median_us[2]",
        ),
        (lambda p: p["entries"][0]["winners"][0].__setitem__("margin", "big"), "entries[0].winners[0].margin"),
        (lambda p: p["entries"][0].pop("tokens"), "entries[0]"),
        (lambda p: p.__setitem__("entries", []), "entries"),
        # Cross-field rules (not expressible in JSON Schema) are checked too:
        (
            lambda p: p["entries"][0]["backends"]["nccl_all2allv"]["median_us"].pop(),
            "entries[0].backends.nccl_all2allv.median_us",
        ),
        (lambda p: p["entries"][0]["winners"][0].__setitem__("backend", "mystery"), "entries[0].winners[0].backend"),
    ],
)
def test_validation_error_names_the_json_path(mutate, where):
    p = fixture_profile()
    validate_profile(p)
    mutate(p)
    with pytest.raises(ProfileError) as info:
        validate_profile(p)
    assert info.value.field == where, str(info.value)
    assert str(info.value).startswith(f"{where}: ")
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- write


def test_write_is_atomic_named_by_key_and_round_trips(tmp_path):
    p = fixture_profile()
    out = write_profile(p, tmp_path / "profiles")
    assert out == tmp_path / "profiles" / profile_filename(FIXTURE_FP)
    assert sorted(os.listdir(tmp_path / "profiles")) == [out.name]  # no temp files left
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # readable by the engine's user
    assert json.loads(out.read_text()) == p
    text = out.read_text()
    assert '"median_us": [20.0, 21.0, 25.0, 50.0, 195.0, null]' in text  # one line per curve
    keys = [k for k in json.loads(text)]
    assert keys == sorted(keys)

    loaded = load_profile(out)
    assert loaded.fingerprint == FIXTURE_FP
    assert [e.shape.hidden for e in loaded.entries] == [4096, 7168]

    # Overwrite in place: still one file, new content.
    p2 = copy.deepcopy(p)
    p2["run"]["id"] = 2
    assert write_profile(p2, tmp_path / "profiles") == out
    assert sorted(os.listdir(tmp_path / "profiles")) == [out.name]
    assert json.loads(out.read_text())["run"]["id"] == 2


def test_invalid_profile_is_not_written_and_leaves_no_temp(tmp_path):
    p = fixture_profile()
    p["entries"][0]["backends"]["nccl_all2allv"]["median_us"][0] = float("nan")
    with pytest.raises(ProfileError, match=r"entries\[0\]\.backends\.nccl_all2allv\.median_us\[0\]"):
        write_profile(p, tmp_path)
    assert os.listdir(tmp_path) == []


def test_failed_write_removes_the_temp_file(tmp_path, monkeypatch):
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_profile(fixture_profile(), tmp_path)
    assert os.listdir(tmp_path) == []


def test_written_profile_answers_lookup(tmp_path):
    out = write_profile(fixture_profile(), tmp_path)
    c = lookup(profile=out, tokens=1, **SHAPE_B)
    assert (c.backend, c.engines["vllm"], c.match) == ("allgather_reducescatter", "allgather_reducescatter", "exact")


# ----------------------------------------------------------------------------- store


class FakeStore:
    def __init__(self):
        self.calls = []

    def measurements(self, run_id):
        self.calls.append(("measurements", run_id))
        return measurements_from()

    def failures(self, run_id):
        return [SimpleNamespace(**f._asdict()) for f in FAILURES]

    def get_run(self, run_id):
        return SimpleNamespace(
            id=run_id,
            device_type="cuda",
            world_size=2,
            versions={"torch": "2.11.0"},
            started_at=dt.datetime(2026, 11, 30, 14, 0, tzinfo=dt.timezone.utc),
            finished_at=None,
            status="done",
            config={},
        )

    def hardware_for_run(self, run_id):
        return SimpleNamespace(fingerprint=FIXTURE_FP, facts_hash="f" * 16, facts={"gpus": []})


def test_profile_from_store_adapter():
    store = FakeStore()
    p = profile_from_store(store, 7, backend_names=BACKEND_NAMES)
    validate_profile(p)
    assert store.calls == [("measurements", 7)]
    assert p["run"]["id"] == 7 and "timing" not in p["run"]
    assert entry(p, hidden=7168)["backends"]["nvlink_one_sided"]["timing"] == "graph"
    assert p["run"]["started_at"] == "2026-11-30T14:00:00Z" and p["run"]["finished_at"] is None
    assert p["hardware"]["facts_hash"] == "f" * 16
    assert [e["hidden"] for e in p["entries"]] == [4096, 7168]


if __name__ == "__main__":  # regenerate the checked-in fixture
    print(write_profile(fixture_profile(), FIXTURES))


def test_backends_without_a_vllm_literal_name_the_closest_one():
    names = {
        **BACKEND_NAMES,
        "nccl_all2allv": {"vllm_name": None, "sglang_name": None, "vllm_closest": "flashinfer_nvlink_two_sided"},
        "allgather_reducescatter": {
            "vllm_name": "allgather_reducescatter",
            "sglang_name": None,
            "vllm_closest": "ignored",
        },
    }
    p = build_profile(
        measurements_from({"X": (SHAPE_B, [1, 8], {"allgather_reducescatter": [10, 20], "nccl_all2allv": [20, 22]})}),
        [],
        hardware=HARDWARE,
        run=RUN,
        backend_names=names,
    )
    assert p["backends"]["nccl_all2allv"] == {
        "engines": {"vllm": None, "sglang": None, "trtllm": None},
        "closest": {"vllm": "flashinfer_nvlink_two_sided"},
    }
    assert "closest" not in p["backends"]["allgather_reducescatter"]  # it has a literal of its own
    validate_profile(p)


def test_a_wide_spread_never_ties_a_backend_more_than_3_percent_slower():
    """Graph replays on a shared host can have p90 = 2x median: the spread alone would call a
    25%-slower engine default a tie and cost 25%. The cap keeps a tie's cost within 3%."""
    ms = measurements_from(
        {
            "X": (
                SHAPE_B,
                [16],
                {
                    "nccl_all2allv": [37.6],  # fastest, but a noisy one
                    "allgather_reducescatter": [46.9],  # 25% slower, inside the fastest's p10..p90
                    "nvlink_one_sided": [38.5],  # 2.4% slower: still a tie
                },
            )
        },
        timing="eager",
    )
    ms = [replace(m, p90_us=m.median_us * 1.3) for m in ms]
    (e,) = build_profile(ms, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)["entries"]
    (w,) = e["winners"]
    assert (w["backend"], w["fastest"], w["tie"]) == (
        "nccl_all2allv",
        "nccl_all2allv",
        True,
    )  # registered first of the two
    ms_no_close = [m for m in ms if m.backend != "nvlink_one_sided"]
    (e,) = build_profile(ms_no_close, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)["entries"]
    assert (e["winners"][0]["backend"], e["winners"][0]["tie"]) == ("nccl_all2allv", False)


@pytest.mark.parametrize(
    "value",
    [5e-324, 1e-4, 1e300, float("nan")],
    ids=["subnormal", "below-a-nanosecond", "absurd", "nan"],
)
def test_validation_rejects_every_time_the_lookup_cannot_compute_with(value, tmp_path):
    """A median of 5e-324 rounds to 0 in the lookup and divides by zero: it never gets written."""
    p = fixture_profile()
    curve = entry(p, **SHAPE_B)["backends"]["nccl_all2allv"]
    for key in ("median_us", "p10_us", "p90_us"):
        curve[key][0] = value
    with pytest.raises(ProfileError) as info:
        validate_profile(p)
    assert info.value.field.startswith("entries[0].backends.nccl_all2allv."), str(info.value)
    with pytest.raises(ProfileError):
        write_profile(p, tmp_path)
    assert os.listdir(tmp_path) == []


def test_validation_rejects_counts_beyond_int32():
    p = fixture_profile()
    entry(p, **SHAPE_B)["tokens"][-1] = 2**31
    with pytest.raises(ProfileError) as info:
        validate_profile(p)
    assert info.value.field == "entries[0].tokens[2]", str(info.value)


def test_select_leaves_out_a_median_the_table_cannot_hold(caplog):
    ms = measurements_from(
        {"X": (SHAPE_B, [1, 64], {"nccl_all2allv": [40.0, 70.0], "allgather_reducescatter": [20, 60]})}
    )
    ms[0] = replace(ms[0], median_us=5e-324, p10_us=5e-324)  # nccl_all2allv at 1 token
    p = build_profile(ms, [], hardware=HARDWARE, run=RUN, backend_names=BACKEND_NAMES)
    assert p["entries"][0]["backends"]["nccl_all2allv"]["median_us"] == [None, 70.0]
    validate_profile(p)
    assert "ignoring nccl_all2allv" in caplog.text and "5e-324" in caplog.text


def test_tables_record_every_engines_name_and_options(tmp_path):
    # The registry's names (kernels declare them) go into the table as select writes it, pass
    # the published schema, and are what lookup tells each engine.
    from a2a_tune.kernels.registry import engine_names

    names = dict(engine_names())
    nccl = names["nccl_all2allv"]
    names["nccl_all2allv"] = dict(nccl, engines=dict(nccl["engines"], sglang="deepep", trtllm="DEEPEP"))
    names["nccl_all2allv"]["engine_options"] = {"sglang": ("--deepep-mode", "normal")}
    p = build_profile(measurements_from(), [], hardware=HARDWARE, run=RUN, backend_names=names)
    validate_profile(p)
    assert p["backends"]["flashinfer_nvlink_one_sided"]["engines"]["trtllm"] == "NVLINK_ONE_SIDED"
    assert p["backends"]["allgather_reducescatter"]["engines"]["trtllm"] == "ALLGATHER"
    assert p["backends"]["nvlink_one_sided"]["engines"]["trtllm"] is None  # no TensorRT-LLM method
    assert p["backends"]["nccl_all2allv"]["engine_options"] == {"sglang": ["--deepep-mode", "normal"]}
    out = write_profile(p, tmp_path)
    c = lookup(profile=out, tokens=1024, engine="sglang", **SHAPE_B)
    assert (c.backend, c.engine_args("sglang")) == ("nccl_all2allv", ("deepep", ("--deepep-mode", "normal")))
    # Shape B: allgather_reducescatter 20 us at 1 token, nccl_all2allv (here DEEPEP) 300 at 1024.
    assert lookup(profile=out, tokens=1, engine="trtllm", **SHAPE_B).engine_args("trtllm") == ("ALLGATHER", ())
    assert lookup(profile=out, tokens=1024, engine="trtllm", **SHAPE_B).engine_args("trtllm") == ("DEEPEP", ())


# ------------------------------------------------------------- a store's knobs, read-only

TUNED = {"chunk": 2}


def tuned_store(path: Path) -> None:
    """store_with_a_completed_run, plus the row tune-knobs leaves for nccl_all2allv at 64
    tokens per rank on that machine (and one of another machine, which must not count)."""
    from databases import store_with_a_completed_run

    store_with_a_completed_run(path)
    add_tuned(f"sqlite:///{path}")


TUNED_KEY = ("nccl_all2allv", 2, 7168, 8, 64, "bf16", "uniform", 64)


def add_tuned(url: str) -> None:
    from a2a_tune.db import KnobsRecord, MeasurementKey, open_store

    with open_store(url) as store:
        for fingerprint in ("h200.nvl18x2.node1", "other.machine.node1"):
            store.put_knobs(KnobsRecord(fingerprint, MeasurementKey(*TUNED_KEY), TUNED, best_us=30.0))


def test_the_tuned_knobs_are_read_from_any_store_url(db_url):
    from a2a_tune.db import open_store
    from a2a_tune.tuner.studies import stored_knobs

    open_store(db_url).close()
    with open_store(db_url, readonly=True) as store:
        assert stored_knobs(store, "h200.nvl18x2.node1") == []
    add_tuned(db_url)
    with open_store(db_url, readonly=True) as store:
        assert stored_knobs(store, "h200.nvl18x2.node1") == [(TUNED_KEY, TUNED)]
        assert stored_knobs(store, "h200.nvl18x2.node") == []  # a fingerprint is matched whole


def old_tuned_store(path: Path) -> None:
    """A store as a2a-tune left it before knobs were rows of ours (schema 0004_ep): the best
    setting only in the user attributes of Optuna's studies, named as tune-knobs named them."""
    import optuna
    from alembic import command

    from a2a_tune.db.engine import alembic_config
    from a2a_tune.tuner.studies import study_name

    tuned_store(path)
    url = f"sqlite:///{path}"
    command.downgrade(alembic_config(url), "0004_ep")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from a2a_tune.db import MeasurementKey

    key = MeasurementKey(*TUNED_KEY)
    for fingerprint, knobs in (("h200.nvl18x2.node1", {"chunk": 1}), ("h200.nvl18x2.node1", TUNED), ("other.m", {})):
        study = optuna.create_study(study_name=study_name(fingerprint, key), storage=url, load_if_exists=True)
        attrs = {**key.point._asdict(), "backend": key.backend, "fingerprint": fingerprint, "timing": "eager"}
        for k, v in {**attrs, "capacity": None, "default_knobs": {"chunk": 4}, "best_knobs": knobs}.items():
            study.set_user_attr(k, v)  # a rerun's study: the newer best setting replaces the older
    optuna.create_study(study_name="someone else's study", storage=url)


def test_a_store_tuned_before_keeps_its_knobs_through_the_migration(tmp_path):
    from a2a_tune.db import StoreOutdatedError, head_revision, open_store, upgrade
    from a2a_tune.tuner.select import profile_for_run

    db = tmp_path / "old.db"
    old_tuned_store(db)
    with pytest.raises(StoreOutdatedError, match="db upgrade"):
        profile_for_run(str(db), None)
    assert upgrade(str(db)) == ("0004_ep", head_revision())
    with open_store(str(db), readonly=True) as store:
        (record,) = store.tuned_knobs("h200.nvl18x2.node1")
    assert (tuple(record.key), dict(record.best), dict(record.default), record.timing) == (
        TUNED_KEY,
        TUNED,
        {"chunk": 4},
        "eager",
    )
    assert record.study.startswith("a2a-tune knobs: h200.nvl18x2.node1 nccl_all2allv E64-k8-H7168-bf16 ep2 T64")
    profile, kept, note = profile_for_run(str(db), None)
    assert (kept, note) == (1, None)
    (entry,) = profile.entries
    assert [k and dict(k) for k in entry.knobs["nccl_all2allv"]] == [None, TUNED]


def test_select_on_a_store_in_a_read_only_directory_keeps_its_tuned_knobs_and_changes_nothing(tmp_path):
    import sys

    from read_only import run_in_read_only

    shelf = tmp_path / "shelf"
    shelf.mkdir()
    db = shelf / "runs.db"
    tuned_store(db)
    before = {p.name: p.read_bytes() for p in shelf.iterdir()}
    argv = [sys.executable, "-m", "a2a_tune.tuner.cli", "select", "--db", str(db), "--out", str(tmp_path / "out")]
    r = run_in_read_only(shelf, argv)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.strip().endswith("(1 shape(s)) from run 1, with the knobs of 1 tuned case(s)"), r.stdout
    (entry,) = json.loads((tmp_path / "out" / "h200.nvl18x2.node1.json").read_text())["entries"]
    assert entry["tokens"] == [1, 64] and entry["backends"]["nccl_all2allv"]["knobs"] == [None, TUNED]
    assert "knobs" not in entry["backends"]["allgather_reducescatter"]
    assert {p.name: p.read_bytes() for p in shelf.iterdir()} == before  # byte-identical, no new files


def test_reading_the_tuned_knobs_needs_no_optuna_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "runs.db"
    tuned_store(db)
    before = (db.read_bytes(), sorted(tmp_path.iterdir()))
    code = (
        "import sys\n"
        "from a2a_tune.db import open_store\n"
        "from a2a_tune.tuner.studies import stored_knobs\n"
        f"with open_store({str(db)!r}, readonly=True) as store:\n"
        "    print([(tuple(k), v) for k, v in stored_knobs(store, 'h200.nvl18x2.node1')])\n"
        "print('optuna' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str([(TUNED_KEY, TUNED)]), "False"]
    assert (db.read_bytes(), sorted(tmp_path.iterdir())) == before  # SQLite's shared-memory index aside


def test_select_of_the_latest_completed_run_names_it(tmp_path):
    from a2a_tune.db import NotFoundError, open_store
    from a2a_tune.tuner.select import profile_for_run

    db = tmp_path / "runs.db"
    tuned_store(db)
    profile, kept, note = profile_for_run(str(db), None)
    assert (profile.meta["run"]["id"], kept, note) == (1, 1, None)
    empty = tmp_path / "empty.db"
    open_store(str(empty)).close()
    with pytest.raises(NotFoundError, match="no completed run"):
        profile_for_run(str(empty), None)


def test_knobs_go_into_a_table_file_judged_as_lookup_judges_it(tmp_path):
    from a2a_tune.tuner.select import with_knobs_from_file

    path = write_profile(fixture_profile(), tmp_path)
    updated, notes = with_knobs_from_file(path, SHAPE_B, "nccl_all2allv", {64: TUNED, 5: TUNED})
    assert notes == ["5 tokens/rank is not one of the entry's token counts (1, 64, 1024)"]
    assert entry(to_dict(updated), **SHAPE_B)["backends"]["nccl_all2allv"]["knobs"] == [None, TUNED, None]
    assert "knobs" not in entry(json.loads(path.read_text()), **SHAPE_B)["backends"]["nccl_all2allv"]  # a copy
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**fixture_profile(), "schema": 99}))
    with pytest.raises(ProfileError, match=f"{broken}: schema"):
        with_knobs_from_file(broken, SHAPE_B, "nccl_all2allv", {64: TUNED})
    (tmp_path / "not.json").write_text("{")
    with pytest.raises(ValueError):
        with_knobs_from_file(tmp_path / "not.json", SHAPE_B, "nccl_all2allv", {64: TUNED})
    with pytest.raises(ProfileError, match="missing.json: cannot read"):  # the lookup's reader (issue 31.3)
        with_knobs_from_file(tmp_path / "missing.json", SHAPE_B, "nccl_all2allv", {64: TUNED})


def test_show_reads_the_tuned_knobs_from_the_store_and_from_the_table_select_wrote(tmp_path):
    from run_cli import a2a

    from a2a_tune.tuner.views.load import load_run_view
    from a2a_tune.tuner.views.show import show_data

    db = tmp_path / "runs.db"
    tuned_store(db)
    line = "tuned knobs: nccl_all2allv at 64: chunk=2"
    run = a2a("show", "--db", str(db))
    assert run.returncode == 0 and line in run.stdout, run.stdout + run.stderr
    data = show_data(load_run_view(str(db)))  # show --json
    assert data["shapes"][0]["knobs"] == {"nccl_all2allv": [None, TUNED]}
    assert a2a("select", "--db", str(db), "--out", str(tmp_path / "out")).returncode == 0
    (table,) = (tmp_path / "out").glob("*.json")
    assert line in a2a("show", "--profile", str(table)).stdout


def test_the_committed_schema4_store_keeps_its_tuned_knobs_through_the_upgrade(tmp_path):
    """A store tuned by the release before knobs were rows of ours (tests/fixtures/db/README.md):
    `db upgrade` copies its study's best setting into tuned_knobs, and select keeps it where the
    release before kept it."""
    import shutil

    from a2a_tune.db import open_store, upgrade
    from a2a_tune.tuner.select import profile_for_run

    db = tmp_path / "schema4.db"
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "db" / "schema4.db", db)
    assert upgrade(str(db))[0] == "0004_ep"
    with open_store(str(db), readonly=True) as store:
        (record,) = store.tuned_knobs("h200.nvl18x2.node1")
    best = {"send_num_warps": 8, "recv_num_warps": 4, "row_block_bytes": 16384, "recv_block_h": 2048}
    assert (record.key.backend, record.key.tokens_per_rank, dict(record.best), record.best_us) == (
        "nvlink_one_sided",
        64,
        best,
        20.0,
    )
    assert (record.default_us, record.timing, record.capacity) == (30.0, "graph", None)
    profile, kept, note = profile_for_run(str(db), None)
    assert (kept, note) == (1, None)
    (entry,) = profile.entries
    assert [k and dict(k) for k in entry.knobs["nvlink_one_sided"]] == [None, best]
    assert "allgather_reducescatter" not in entry.knobs
