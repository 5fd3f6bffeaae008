"""Records for store tests (tests/db/): a shape, library versions, a measurement's fields, a
new run, and the check that an error is one clean line."""

from __future__ import annotations

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


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def measurement(**over) -> Measurement:
    """A measurement from the store's columns (``MEASUREMENT_COLUMNS``: a figure by its column,
    e.g. ``dispatch_median_us``), these defaults overridden by `over`."""
    fields = dict(
        backend="nccl_all2allv",
        **SHAPE,
        timing="eager",
        median_us=41.5,
        p10_us=40.0,
        p90_us=44.25,
        ci_low_us=41.0,
        ci_high_us=42.0,
        n=5,
        host_median_us=55.0,
        samples=[40.0, 41.0, 41.5, 43.0, 44.5],
        knobs={"num_sms": 24},
    )
    fields.update(over)
    return Measurement.from_columns(fields)


def new_run(store, *, fingerprint="h200-sxm.nvl18x1.node1", facts_hash="f" * 64, config_hash="cfg1"):
    hw = store.get_or_create_hardware(fingerprint, facts_hash, {"gpus": [{"name": "NVIDIA H200"}] * 2})
    run = store.start_run(
        hw,
        device_type="cuda",
        world_size=2,
        versions=VERSIONS,
        git_sha="0123abc",
        config={"tokens": [1, 128], "backends": ["nccl_all2allv"], "iterations": 50},
        config_hash=config_hash,
    )
    return hw, run


def assert_one_clean_line(message: str) -> None:
    assert message and "\n" not in message
    for noise in ("Traceback", "sqlalche.me", "[SQL", "Background on this error"):
        assert noise not in message
