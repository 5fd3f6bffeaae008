"""What the runtime's tests share: the fixture table's shapes and a few helpers.

The fixture profile tests/fixtures/profiles/test.fixture.node1.json (schema 3) is built by
tests/tuner/test_select.py::fixture_profile (see the curves there); every point has
p10 = 0.98 x median and p90 = 1.03 x median; nvlink_one_sided is graph-timed, the rest
eager. Shape A (ep 2, hidden 7168, topk 8, 256 experts) over tokens [1, 4, 16, 64, 256, 1024]:

    allgather_reducescatter      30   31   35  100  400 1500
    nccl_all2allv                45   46   50   75  190  420
    nvlink_one_sided             20   21   25   50  195  null   (timeout at 1024)
    flashinfer_nvlink_one_sided   5    5    5    5    5    5   (failed: incorrect)

Shape B (ep 2, hidden 4096, topk 6, 64 experts) over [1, 64, 1024]:
    allgather_reducescatter 20 60 600, nccl_all2allv 40 70 300.

Shape A also carries the figures beside the round trip (dispatch 45% and combine 50% of it,
bytes, and memory per rank: allgather_reducescatter 16, nccl_all2allv 64, nvlink_one_sided
3072 MiB); shape B carries none.

Tie preference: allgather_reducescatter, nccl_all2allv, nvlink_one_sided, ... (registry
order). tests/fixtures/profiles/schema1/ holds the same table as schema 1 wrote it
(p10 = 0.95, p90 = 1.1 x median, one timing mode); schema2/ as schema 2 wrote it (no figures).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from bad_tables import FIXTURE, FP, fixture_data

__all__ = ["A", "B", "FIXTURE", "FIXTURES", "FP", "fixture_data", "variant", "warnings_of", "write"]

FIXTURES = FIXTURE.parent
A = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, dtype="bf16", routing="uniform")
B = dict(ep_size=2, hidden=4096, topk=6, num_experts=64, dtype="bf16", routing="uniform")


def warnings_of(caplog) -> list:
    """The warnings the runtime logged (logger ``a2a_tune``)."""
    return [r for r in caplog.records if r.name == "a2a_tune" and r.levelno == logging.WARNING]


def write(dirpath: Path, data, name: str = f"{FP}.json") -> Path:
    """``data`` (a str, or JSON-able) as ``dirpath/name``."""
    p = dirpath / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def variant(backend_fast: str) -> dict:
    """The fixture with one backend made fastest everywhere in shape B."""
    data = fixture_data()
    data["entries"][0]["backends"][backend_fast].update(median_us=[1.0] * 3, p10_us=[1.0] * 3, p90_us=[1.0] * 3)
    data["entries"][0]["winners"] = []
    return data
