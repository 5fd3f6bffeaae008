"""The figures beside the round trip on real GPUs (2 ranks): halves cut under graph replay and
eagerly, and the device memory a backend holds. Runs only with 2 CUDA GPUs (`pytest -m gpu`)."""

from __future__ import annotations

import pytest
import torch

from a2a_tune.kernels import MoEShape
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.measure import Backends, input_sets, measure_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

SHAPE = MoEShape(64, 8, 4096, 256, "bf16")


def _figures(ctx) -> dict:
    got = {}
    with Backends(ctx, SHAPE) as built:
        inputs = input_sets(ctx, SHAPE, 256, sets=3)
        for name in ("nccl_all2allv", "nvlink_one_sided"):
            r = measure_case(ctx, built, name, 256, inputs, warmup=5, iters=20)
            host = sorted(r.host_us)[len(r.host_us) // 2] if r.host_us else None
            got[name] = (
                r.kind,
                r.timing,
                r.median_us,
                r.dispatch_median_us,
                r.combine_median_us,
                r.workspace_bytes,
                host,
            )
    return got


def test_halves_add_up_to_the_round_trip_and_memory_is_measured():
    rank0, rank1 = run_ranks(_figures, 2, "cuda")
    assert rank0 == rank1
    for name, mode in (("nccl_all2allv", "eager"), ("nvlink_one_sided", "graph")):
        kind, timing, round_trip, dispatch, combine, held, host = rank0[name]
        assert (kind, timing) == ("measured", mode)
        assert dispatch > 0 and combine > 0
        # what timing.py says the cut adds: graph, the event nodes; eager, each half alone, at most
        # the round trip's host time per round trip more (+ the drains, the max over ranks per half)
        extra = 10.0 if mode == "graph" else host + 40.0
        assert 0.9 * round_trip <= dispatch + combine <= 1.1 * round_trip + extra
        assert held is not None and held >= 0
    assert rank0["nvlink_one_sided"][5] > 0  # its symmetric-memory workspace, outside torch's allocator
