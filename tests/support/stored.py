"""Records for store tests (tests/db/) and for the tests that build runs and tables from
measurements: a shape, library versions, a measurement's fields, a measurement at a point, a
new run, and the check that an error is one clean line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from a2a_tune.tuner.runtime.measurement import Measurement

# One point, in the point's field order (the store's key: the backend, then these).
SHAPE = dict(ep_size=2, hidden=7168, topk=8, num_experts=64, dtype="bf16", routing="uniform", tokens_per_rank=128)

VERSIONS = {
    "torch": "2.11.0",
    "nccl": "2.27.3",
    "cuda": "12.9",
    "driver": "575.57",
    "triton": "3.4.0",
    "flashinfer": None,
    "python": "3.12.3",
    "a2a_tune": "0.1.0",
}

# The round trip's statistics in `measurement` (µs; n: how many samples).
STATS = dict(median_us=41.5, p10_us=40.0, p90_us=44.25, ci_low_us=41.0, ci_high_us=42.0, n=5, host_median_us=55.0)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def measurement(**over) -> Measurement:
    """A measurement from the store's columns (``MEASUREMENT_COLUMNS``: a figure by its column,
    e.g. ``dispatch_median_us``), these defaults overridden by `over`."""
    fields = dict(backend="nccl_all2allv", **SHAPE, timing="eager", **STATS, knobs={"num_sms": 24})
    fields["samples"] = [40.0, 41.0, 41.5, 43.0, 44.5]
    fields.update(over)
    return Measurement.from_columns(fields)


def measured(
    shape: Mapping, backend: str, tokens: int, median_us, p10_us, p90_us, *, timing="eager", n=None, **columns
) -> Measurement:
    """A :class:`Measurement` of `backend` at `shape` (the point's fields but the tokens) and
    `tokens` per rank, timed in `timing` mode: its median, p10 and p90 (µs), `n` samples all at
    the median (None: neither n nor samples) and any other store column in `columns` (a
    figure's, the knobs)."""
    if n is not None:
        columns.update(n=n, samples=[median_us] * n)
    stats = dict(median_us=median_us, p10_us=p10_us, p90_us=p90_us)
    return Measurement.from_columns(
        dict(shape, backend=backend, tokens_per_rank=tokens, timing=timing, **stats, **columns)
    )


def new_run(store, *, fingerprint="h200-sxm.nvl18x1.node1", facts_hash="f" * 64, config_hash="cfg1"):
    hw = store.get_or_create_hardware(fingerprint, facts_hash, {"gpus": [{"name": "NVIDIA H200"}] * 2})
    config = {"tokens": [1, 128], "backends": ["nccl_all2allv"], "iterations": 50}
    return hw, start_run(store, hw, config=config, config_hash=config_hash)


def start_run(store, hw, *, config: Mapping, config_hash: str, versions: Mapping = VERSIONS, launched_at=None) -> int:
    """A run started on `hw` (the id): CUDA, 2 ranks, commit 0123abc, `versions`, `config`, its
    command begun at `launched_at` (None: not recorded)."""
    return store.start_run(
        hw,
        device_type="cuda",
        world_size=2,
        versions=versions,
        git_sha="0123abc",
        config=config,
        config_hash=config_hash,
        launched_at=launched_at,
    )


def assert_one_clean_line(message: str) -> None:
    assert message and "\n" not in message
    for noise in ("Traceback", "sqlalche.me", "[SQL", "Background on this error"):
        assert noise not in message
