"""Timing one dispatch + combine round trip, and the statistics every measurement stores.

What is timed: `combine(dispatch(x))` with the received rows passed straight back as the
expert output (no expert compute), launched eagerly from the host as an engine's prefill
step is. On CUDA the device time comes from events around the round trip; the host wall
time (from the first launch until combine returns, without a device sync) is recorded
beside it, because the two differ a lot at small token counts. On CPU (gloo) both are the
host wall time of a completed round trip.

Ranks agree on one number: each sample is the max over ranks of that iteration's time
(an all2all step is as slow as its slowest rank), and the statistics are of those samples.
Several input sets are rotated so repeated iterations do not replay a warm L2.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from a2a_tune.kernels import All2AllBackend
from a2a_tune.kernels.reference import RankInputs


@dataclass(frozen=True)
class Stats:
    median_us: float
    p10_us: float
    p90_us: float
    ci_low_us: float  # ~95% confidence interval of the median, from order statistics
    ci_high_us: float
    n: int


def quantile(sorted_samples: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted samples."""
    if not sorted_samples:
        raise ValueError("no samples")
    pos = q * (len(sorted_samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> Stats:
    """Median, p10/p90 and a distribution-free 95% CI of the median (binomial order statistics)."""
    s = sorted(samples)
    n = len(s)
    half_width = 1.96 * math.sqrt(n) / 2  # ranks n/2 -/+ 1.96 sqrt(n)/2 bracket the median
    lo = max(0, math.floor(n / 2 - half_width))
    hi = min(n - 1, math.ceil(n / 2 + half_width))
    return Stats(statistics.median(s), quantile(s, 0.1), quantile(s, 0.9), s[lo], s[hi], n)


def _round_trip(backend: All2AllBackend, inputs: RankInputs) -> None:
    d = backend.dispatch(inputs.x, inputs.topk_ids, inputs.topk_weights)
    backend.combine(d.x, d)


def time_round_trips(
    backend: All2AllBackend, input_sets: Sequence[RankInputs], *, warmup: int, iters: int
) -> tuple[list[float], list[float]]:
    """Return (device_us, host_us) per iteration, each already the max over ranks."""
    cuda = backend.device.type == "cuda"
    for i in range(warmup):
        _round_trip(backend, input_sets[i % len(input_sets)])
    device_us: list[float] = []
    host_us: list[float] = []
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        inputs = input_sets[i % len(input_sets)]
        # Ranks start each iteration together, so one rank's late start is not timed as the
        # other's communication wait.
        dist.barrier(group=backend.group)
        if cuda:
            torch.cuda.synchronize(backend.device)
            t0 = time.perf_counter()
            starts[i].record()
            _round_trip(backend, inputs)
            ends[i].record()
            host_us.append((time.perf_counter() - t0) * 1e6)
        else:
            t0 = time.perf_counter()
            _round_trip(backend, inputs)
            host_us.append((time.perf_counter() - t0) * 1e6)
    if cuda:
        torch.cuda.synchronize(backend.device)
        device_us = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    else:
        device_us = list(host_us)
    both = torch.tensor([device_us, host_us], dtype=torch.float64, device=backend.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=backend.group)
    return both[0].tolist(), both[1].tolist()
