"""The table model (runtime/table.py): what a table must hold to be read (every bad table is
one line naming the file and the field, and the lookup falls back on it with one warning),
schema 1 converted on load, and what a table's strings may not carry to a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_tables import BAD_TABLES
from lookups import FIXTURES, FP, A, fixture_data, warnings_of, write

from a2a_tune.tuner.runtime.lookup import FALLBACK_BACKEND, lookup
from a2a_tune.tuner.runtime.profiles import load_profile
from a2a_tune.tuner.runtime.table import (
    SCHEMA_VERSION,
    Failed,
    ProfileError,
    Shape,
    parse_profile,
    to_dict,
    to_json,
    upgrade,
)

# ---------------------------------------------------------------------------- bad tables


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_table_falls_back_with_exactly_one_warning(case, tmp_path, monkeypatch, caplog):
    make, problem = BAD_TABLES[case]
    content = make()
    path = tmp_path / f"{FP}.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))

    for tokens in (64, 64, 200):  # repeated and different requests: still one warning
        c = lookup(fingerprint=FP, tokens=tokens, **A)
        assert (c.backend, c.engines["vllm"], c.match) == (FALLBACK_BACKEND, FALLBACK_BACKEND, "fallback")
        assert c.expected_us == {} and c.entry_shape is None
    recs = warnings_of(caplog)
    assert len(recs) == 1, [r.getMessage() for r in recs]
    msg = recs[0].getMessage()
    assert str(path) in msg and problem in msg and FALLBACK_BACKEND in msg
    assert "\n" not in msg
    assert problem in c.reason


def test_load_profile_raises_one_line_error_naming_the_field(tmp_path):
    data = fixture_data()
    data["entries"][1]["backends"]["nccl_all2allv"]["median_us"][2] = -1
    p = write(tmp_path, data)
    with pytest.raises(ProfileError) as info:
        load_profile(p)
    assert info.value.field == "entries[1].backends.nccl_all2allv.median_us[2]"
    assert str(info.value) == f"{p}: entries[1].backends.nccl_all2allv.median_us[2]: not a positive finite number"


# ----------------------------------------------------------------------- schema versions


SCHEMA1 = FIXTURES / "schema1" / f"{FP}.json"


def test_schema1_table_is_converted_on_load(caplog):
    prof = load_profile(SCHEMA1)
    assert prof.schema == 1 and prof.fingerprint == FP
    assert prof.tie_preference[0] == "allgather_reducescatter"
    a = prof.by_shape[Shape(**A)]
    assert set(a.timing.values()) == {"eager"}  # schema 1: the run's one timing mode
    assert a.p90_us["nccl_all2allv"][0] == pytest.approx(49.5)  # its p10/p90 are used

    c = lookup(profile=SCHEMA1, fingerprint=FP, tokens=64, **A)
    assert (c.backend, c.match, c.hardware_match) == ("nvlink_one_sided", "exact", "exact")
    assert dict(c.expected_us) == {"allgather_reducescatter": 100.0, "nccl_all2allv": 75.0, "nvlink_one_sided": 50.0}
    assert warnings_of(caplog) == []


def test_schema1_graph_timing_is_read_per_backend(tmp_path):
    data = json.loads(SCHEMA1.read_text())
    data["run"]["timing"] = "cuda_graph"
    prof = load_profile(write(tmp_path, data))
    assert set(prof.entries[0].timing.values()) == {"graph"}


def test_a_refusal_quotes_the_tables_names_in_one_safe_line(tmp_path):
    data = fixture_data()
    data["backends"]["evil\n\x1b]0;pwned\x07"] = {"engines": {"vllm": 7}}
    with pytest.raises(ProfileError) as info:
        load_profile(write(tmp_path, data))
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text
    assert text.endswith(
        "backends.evil \\x1b]0;pwned\\x07.engines.vllm: expected a non-empty string or null, got number"
    )


# ------------------------------------------------------------------ one model, both ways

SHIPPED = sorted(p for p in (Path(__file__).parents[2] / "profiles").glob("*.json") if not p.name.startswith("schema-"))
OLD_TABLES = [FIXTURES / "schema1" / f"{FP}.json", FIXTURES / "schema2" / f"{FP}.json"]


@pytest.mark.parametrize("path", SHIPPED + [FIXTURES / f"{FP}.json"], ids=lambda p: p.parent.name + "/" + p.name)
def test_writing_a_parsed_table_gives_its_file_byte_for_byte(path):
    assert SHIPPED
    text = path.read_text()
    prof = parse_profile(json.loads(text))
    assert prof.schema == SCHEMA_VERSION == 4
    assert to_json(prof) == text


@pytest.mark.parametrize("path", OLD_TABLES, ids=lambda p: p.parent.name)
def test_an_old_table_upgrades_to_what_it_reads_as(path):
    """The one upgrade path: the conversion on load, written back; it reads as the same model."""
    old = parse_profile(json.loads(path.read_text()))
    new = parse_profile(upgrade(json.loads(path.read_text())))
    assert new.schema == 4 and old.schema in (1, 2)
    assert new.entries == old.entries and new.backends == old.backends
    assert new.tie_preference == old.tie_preference
    assert to_json(new) == to_json(old)


def test_failures_are_structure_in_the_model_and_in_the_file():
    v2 = json.loads(OLD_TABLES[1].read_text())
    text = v2["entries"][1]["failed"]
    prof = parse_profile(v2)
    failed = prof.entries[1].failed
    # The old text is read once, on load ...
    assert {b: str(f) for b, f in failed.items()} == text
    assert all(isinstance(f, Failed) for f in failed.values())
    # ... and written as structure: kind, tokens (None: the whole shape), reason.
    written = to_dict(prof)["entries"][1]["failed"]
    assert written == {b: {"kind": f.kind, "tokens": f.tokens, "reason": f.reason} for b, f in failed.items()}
    assert parse_profile(to_dict(prof)).entries[1].failed == failed


def test_a_new_engine_is_a_key_of_the_map_not_a_new_schema():
    data = fixture_data()
    data["backends"]["nccl_all2allv"]["engines"]["lmdeploy"] = "nccl"
    prof = parse_profile(data)
    names = prof.backends["nccl_all2allv"]
    assert names.literal("lmdeploy") == "nccl" and names.literal("vllm") is None
    assert to_dict(prof)["backends"]["nccl_all2allv"]["engines"]["lmdeploy"] == "nccl"
    from a2a_tune.tuner.select import validate_profile

    validate_profile(to_dict(prof))  # the published schema takes it too
