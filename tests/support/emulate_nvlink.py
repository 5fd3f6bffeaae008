"""Run the nvlink_one_sided (or, with "backend": "low_latency", nvlink_low_latency) kernels for W ranks in one process, buffers side by side.

Usage (a subprocess, because TRITON_INTERPRET must be set before triton is imported):
    TRITON_INTERPRET=1 python emulate_nvlink.py '<json list of cases>'
prints a JSON list of {id, ok, max_rel_error, reason}. Each case: world, experts, topk,
hidden, dtype, tokens (per rank), routing, repeats, and optionally "plant": a bug to plant,
and "knobs": LaunchKnobs fields to launch the kernels with (the backends' set_knobs).
One-sided only: "capacity" (the workspace's slots per source; default the most tokens) and
"steps" (slots per source used in each repeat, cycled: the backends' set_step_tokens).
Ranks run each phase in turn (all sends, then all receives), which is one legal schedule
of the real concurrent run, so the flags are already raised when a receiver waits.
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"

import torch  # noqa: E402

from a2a_tune.kernels import MoEShape  # noqa: E402
from a2a_tune.kernels import _low_latency_kernels as ll  # noqa: E402
from a2a_tune.kernels import _one_sided_kernels as k  # noqa: E402
from a2a_tune.kernels._nvlink_common import LaunchKnobs, RankState  # noqa: E402
from a2a_tune.kernels.base import torch_dtype, wire_dtype  # noqa: E402
from a2a_tune.kernels.quant import quantize_fp8_blocks  # noqa: E402
from a2a_tune.kernels.reference import TOLERANCE, expected_output, expert_compute, expert_scales, make_inputs  # noqa: E402


def _aligned(nbytes: int, align: int = 256) -> torch.Tensor:
    """A zeroed CPU byte buffer starting on an `align` boundary, as symmetric memory is."""
    raw = torch.zeros(nbytes + align, dtype=torch.uint8)
    skip = -raw.data_ptr() % align
    return raw[skip : skip + nbytes]


def run_case(case: dict) -> dict:
    w, e, topk, h = case["world"], case["experts"], case["topk"], case["hidden"]
    tokens = case["tokens"]
    dtype = case.get("dtype", "fp32")
    cap = case.get("capacity", max(max(tokens), 1))
    steps = case.get("steps", [None])
    shape = MoEShape(e, topk, h, cap, dtype)
    shape.validate(w)
    epr = e // w
    low_latency = case.get("backend") == "low_latency"
    act, wire = torch_dtype(dtype), wire_dtype(dtype)
    if low_latency:
        layout = ll.workspace(w, cap, h, topk, epr, act, wire)
        outs_buf = [ll.Outputs(epr * w * cap, topk, "cpu") for _ in range(w)]
    else:
        layout = k.workspace(w, cap, h, topk, act, wire)
    bufs = [_aligned(layout.offsets()["total"]) for _ in range(w)]
    states = [RankState.create(r, layout, bufs[r], [b.data_ptr() for b in bufs]) for r in range(w)]
    for st in states:
        st.launch = LaunchKnobs(**case.get("knobs", {}))
    scales = expert_scales(e)
    worst, reason = 0.0, ""
    for rep in range(case.get("repeats", 1)):
        step = steps[rep % len(steps)]
        for st in states:
            st.rows = step
        inputs = [
            make_inputs(shape, tokens[r], rank=r, world_size=w, routing=case.get("routing", "uniform"), seed=rep)
            for r in range(w)
        ]
        kern = ll if low_latency else k
        for r in range(w):
            x, x_scale = quantize_fp8_blocks(inputs[r].x) if wire is not None else (inputs[r].x, None)
            if low_latency:
                ll.dispatch_send(states[r], x, inputs[r].topk_ids, inputs[r].topk_weights, epr, x_scale)
            else:  # every rank sends before any waits: the wait runs as its own kernel here
                k.dispatch_send(states[r], x, inputs[r].topk_ids, inputs[r].topk_weights, epr, x_scale, wait=False)
        if not low_latency:
            for r in range(w):
                k.dispatch_wait(states[r])
        outs = []
        for r in range(w):
            if low_latency:
                rx, rids, rw = ll.dispatch_recv(states[r], outs_buf[r], epr)
            else:
                rx, rids, rw = k.dispatch_recv(states[r])
                if rx.shape[0] != w * (step or cap):
                    return {
                        "id": case["id"],
                        "ok": False,
                        "max_rel_error": float("inf"),
                        "reason": f"rank {r}: {rx.shape[0]} received rows, expected {w * (step or cap)}",
                    }
            lo, hi = r * epr, (r + 1) * epr
            if bool(((rids != -1) & ((rids < lo) | (rids >= hi))).any()):
                return {
                    "id": case["id"],
                    "ok": False,
                    "max_rel_error": float("inf"),
                    "reason": f"rank {r}: non-local ids",
                }
            if case.get("plant") == "off_by_one_slot":
                rx = torch.roll(rx, 1, dims=0)
            xs = states[r].received_scales() if wire is not None else None
            outs.append(expert_compute(rx.view(wire) if wire is not None else rx, rids, rw, scales, xs))
        for r in range(w):
            kern.combine_send(states[r], outs[r].contiguous())
        for r in range(w):
            y = torch.empty(tokens[r], h, dtype=act)
            if low_latency:
                y = ll.combine_recv(states[r], inputs[r].topk_ids, y)
            else:
                y = k.combine_recv(states[r], outs[r].contiguous(), inputs[r].topk_ids, epr, y)
            if tokens[r] == 0:
                continue
            ref = expected_output(inputs[r], scales)
            err = float(((y.float() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max())
            if err > worst:
                worst = err
            if err > TOLERANCE[dtype] and not reason:
                reason = f"rep {rep} rank {r}: relative error {err:.3g}"
    return {"id": case["id"], "ok": not reason, "max_rel_error": worst, "reason": reason}


if __name__ == "__main__":
    print(json.dumps([run_case(c) for c in json.loads(sys.argv[1])]))
