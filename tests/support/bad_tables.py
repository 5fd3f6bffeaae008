"""Tables every reader must refuse, each with the one-line problem the refusal names.

Each case is (make, problem): ``make()`` returns the file's content (str or bytes), a copy of
the fixture table tests/fixtures/profiles/test.fixture.node1.json with one defect; the lookup
falls back on it (tests/runtime/test_table.py) and ``show`` / ``diff`` refuse it (tests/views/test_views.py),
both naming ``problem``.
"""

from __future__ import annotations

import json
from pathlib import Path

FP = "test.fixture.node1"
FIXTURE = Path(__file__).parent.parent / "fixtures" / "profiles" / f"{FP}.json"


def fixture_data() -> dict:
    return json.loads(FIXTURE.read_text())


def _text() -> str:
    return FIXTURE.read_text()


def _mutated(fn):
    def make():
        data = fixture_data()
        fn(data)
        return json.dumps(data)

    return make


BAD_TABLES = {
    "truncated_json": (lambda: _text()[: len(_text()) // 2], "invalid JSON"),
    "empty_file": (lambda: "", "invalid JSON"),
    "garbage_bytes": (lambda: b"\x89PNG\r\n\x1a\n\x00\xff\xfe\xfa" * 20, "not UTF-8"),
    "top_level_array": (lambda: "[1, 2, 3]", "top level: expected a JSON object"),
    "schema_99": (_mutated(lambda d: d.__setitem__("schema", 99)), "schema: version 99 is from a newer a2a-tune"),
    "schema_0": (_mutated(lambda d: d.__setitem__("schema", 0)), "schema: unsupported version 0"),
    "schema_missing": (_mutated(lambda d: d.pop("schema")), "schema: missing"),
    "empty_entries": (_mutated(lambda d: d.__setitem__("entries", [])), "entries: empty table"),
    "nan_bare_token": (
        lambda: _text().replace(
            '"median_us": [20.0, 21.0, 25.0, 50.0, 195.0, null]', '"median_us": [20.0, NaN, 25.0, 50.0, 195.0, null]'
        ),
        "entries[1].backends.nvlink_one_sided.median_us[1]: not a positive finite number",
    ),
    "infinity_token": (
        lambda: _text().replace('"median_us": [40.0, 70.0, 300.0]', '"median_us": [40.0, Infinity, 300.0]'),
        "entries[0].backends.nccl_all2allv.median_us[1]: not a positive finite number",
    ),
    "negative_timing": (
        _mutated(lambda d: d["entries"][0]["backends"]["nccl_all2allv"]["median_us"].__setitem__(2, -3.0)),
        "entries[0].backends.nccl_all2allv.median_us[2]: not a positive finite number",
    ),
    "string_timing": (
        _mutated(lambda d: d["entries"][0]["backends"]["nccl_all2allv"]["median_us"].__setitem__(0, "40")),
        "entries[0].backends.nccl_all2allv.median_us[0]: not a positive finite number",
    ),
    "wrong_field_type": (_mutated(lambda d: d["entries"][1].__setitem__("hidden", "7168")), "entries[1].hidden"),
    "curve_length_mismatch": (
        _mutated(lambda d: d["entries"][0]["backends"]["nccl_all2allv"]["median_us"].pop()),
        "entries[0].backends.nccl_all2allv.median_us: expected an array of 3 values",
    ),
    "unknown_backend_in_winners": (
        _mutated(lambda d: d["entries"][1]["winners"][0].__setitem__("backend", "mystery_backend")),
        "entries[1].winners[0].backend: unknown backend 'mystery_backend'",
    ),
    "undeclared_backend_curve": (
        _mutated(lambda d: (d["backends"].pop("nccl_all2allv"), d["tie_preference"].remove("nccl_all2allv"))),
        "entries[0].backends.nccl_all2allv: backend not declared",
    ),
    "unknown_backend_in_tie_preference": (
        _mutated(lambda d: d["tie_preference"].insert(0, "mystery_backend")),
        "tie_preference[0]: unknown backend 'mystery_backend'",
    ),
    "schema_1_as_string": (_mutated(lambda d: d.__setitem__("schema", "1")), "schema: unsupported version '1'"),
    "schema_5": (
        _mutated(lambda d: d.__setitem__("schema", 5)),
        "schema: version 5 is from a newer a2a-tune (this one reads schemas 1, 2, 3, 4); upgrade a2a-tune",
    ),
    # Schema 4 reads failures as structure, never text: a reason string there is refused.
    "failure_as_text": (
        _mutated(lambda d: d["entries"][0]["failed"].__setitem__("deepep_low_latency", "unavailable: no")),
        "entries[0].failed.deepep_low_latency: expected a JSON object, got string",
    ),
    "failure_without_kind": (
        _mutated(lambda d: d["entries"][0]["failed"]["deepep_low_latency"].pop("kind")),
        "entries[0].failed.deepep_low_latency.kind: expected a non-empty string, got null",
    ),
    "engine_literal_not_a_string": (
        _mutated(lambda d: d["backends"]["nccl_all2allv"]["engines"].__setitem__("vllm", 1)),
        "backends.nccl_all2allv.engines.vllm: expected a non-empty string or null, got number",
    ),
    "unknown_fabric": (
        _mutated(lambda d: d["entries"][0].__setitem__("fabric", "carrier-pigeon")),
        "entries[0].fabric: expected one of 'island', 'domain', 'network' or null",
    ),
    "negative_bytes": (
        _mutated(
            lambda d: (
                d.__setitem__("schema", 3),
                d["entries"][0]["backends"]["nccl_all2allv"].__setitem__("dispatch_logical_bytes", [1.0, -2.0, 3.0]),
            )
        ),
        "entries[0].backends.nccl_all2allv.dispatch_logical_bytes[1]: expected a finite number >= 0 or null, got -2.0",
    ),
    "dispatch_us_too_short": (
        _mutated(
            lambda d: (
                d.__setitem__("schema", 3),
                d["entries"][0]["backends"]["nccl_all2allv"].__setitem__("dispatch_us", [1.0]),
            )
        ),
        "entries[0].backends.nccl_all2allv.dispatch_us: expected an array of 3 values (one per token count)",
    ),
    "nan_p90": (
        lambda: _text().replace('"p90_us": [41.2, 72.1, 309.0]', '"p90_us": [41.2, NaN, 309.0]'),
        "entries[0].backends.nccl_all2allv.p90_us[1]: not a positive finite number",
    ),
    "bad_timing_mode": (
        _mutated(lambda d: d["entries"][1]["backends"]["nvlink_one_sided"].__setitem__("timing", "warp")),
        "entries[1].backends.nvlink_one_sided.timing: expected one of 'eager', 'graph', got 'warp'",
    ),
    "median_outside_spread": (
        _mutated(lambda d: d["entries"][0]["backends"]["nccl_all2allv"]["p90_us"].__setitem__(2, 250.0)),
        "entries[0].backends.nccl_all2allv.median_us[2]: median 300.0 outside its p10..p90 spread",
    ),
    "tie_not_boolean": (
        _mutated(lambda d: d["entries"][0]["winners"][0].__setitem__("tie", "yes")),
        "entries[0].winners[0].tie: expected true or false",
    ),
    "unsorted_tokens": (
        _mutated(lambda d: d["entries"][0].__setitem__("tokens", [64, 1, 1024])),
        "entries[0].tokens[1]",
    ),
    "other_fingerprint": (
        _mutated(lambda d: d["hardware"].__setitem__("fingerprint", "h100.nvl18x8.node1")),
        "profile is for 'h100.nvl18x8.node1', this machine is 'test.fixture.node1'",
    ),
    "subnormal_median": (
        _mutated(
            lambda d: [
                d["entries"][0]["backends"]["nccl_all2allv"][k].__setitem__(1, 5e-324) for k in ("median_us", "p10_us")
            ]
        ),
        "entries[0].backends.nccl_all2allv.median_us[1]: 5e-324 us is outside the range a table may hold",
    ),
    "absurd_median": (
        _mutated(
            lambda d: [
                d["entries"][0]["backends"]["nccl_all2allv"][k].__setitem__(2, 1e300) for k in ("median_us", "p90_us")
            ]
        ),
        "entries[0].backends.nccl_all2allv.median_us[2]: 1e+300 us is outside the range a table may hold",
    ),
    "subnormal_winner_median": (
        _mutated(lambda d: d["entries"][0]["winners"][0].__setitem__("median_us", 5e-324)),
        "entries[0].winners[0].median_us: 5e-324 us is outside the range",
    ),
    "absurd_token_count": (
        _mutated(lambda d: d["entries"][0]["tokens"].__setitem__(2, 2**40)),
        "entries[0].tokens[2]: tokens per rank must be in 1..1048576, got 1099511627776",
    ),
    "absurd_hidden": (
        _mutated(lambda d: d["entries"][1].__setitem__("hidden", 10**400)),
        "entries[1].hidden: ",
    ),
    "zero_capacity": (
        _mutated(lambda d: d["run"].__setitem__("capacity", 0)),
        "run.capacity: tokens per rank must be in 1..1048576, got 0",
    ),
    # numbers at the edges of JSON (issue 31.4): each one line naming the field, never a traceback
    "integer_of_5000_digits": (
        lambda: _text().replace('"median_us": [40.0, 70.0, 300.0]', '"median_us": [40.0, ' + "9" * 5000 + ", 300.0]"),
        "invalid JSON: an integer with too many digits",
    ),
    "workspace_sum_overflows": (
        _mutated(
            lambda d: d["entries"][0]["backends"]["nccl_all2allv"].__setitem__("workspace_mib", [1.7e308, 1.7e308, 1.0])
        ),
        "entries[0].backends.nccl_all2allv.workspace_mib[0]: 1.7e+308 is over the largest figure a table may hold",
    ),
    "workspace_of_401_digits": (
        _mutated(
            lambda d: d["entries"][0]["backends"]["nccl_all2allv"].__setitem__("workspace_mib", [10**400, 1.0, 1.0])
        ),
        "entries[0].backends.nccl_all2allv.workspace_mib[0]: an integer of 401 digits is over the largest figure",
    ),
}
