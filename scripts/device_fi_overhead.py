#!/usr/bin/env python3
"""Where the FlashInfer one-sided adapter's round trip goes: the adapter as the sweep runs it,
then with the parts our contract adds taken away one by one, beside our own one-sided kernels.
CUDA-graph replay, DeepSeek-V3 shape, bf16, 2 GPUs. Not a correctness check: the variants
without the masking return ids our contract forbids.

    python scripts/device_fi_overhead.py [--tokens 1,128,8192] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from a2a_tune.kernels import Dispatched, MoEShape, get_backend
from a2a_tune.kernels.flashinfer_nvlink_one_sided import FlashInferNvlinkOneSided
from a2a_tune.kernels.reference import RankInputs, make_inputs
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.timing import summarize, time_graph_round_trips


class _Unmasked(FlashInferNvlinkOneSided):
    """FlashInfer's dispatch + combine with only what an engine integration needs."""

    sanitize = True

    def dispatch(self, x, topk_ids, topk_weights) -> Dispatched:
        w, cap, s = self.world_size, self.shape.max_tokens_per_rank, self.shape
        invalid = dict(invalid_token_expert_id=-1, expert_id_payload_index=1) if self.sanitize else {}
        received = self._a2a.dispatch(topk_ids, [x, topk_ids, topk_weights], cap, **invalid)
        buffer = self._a2a.get_combine_payload_tensor_in_workspace(cap, s.hidden, self.dtype).view(w * cap, s.hidden)
        rows = [
            received[0].view(w * cap, s.hidden),
            received[1].view(w * cap, s.topk),
            received[2].view(w * cap, s.topk),
        ]
        return Dispatched(*rows, handle=buffer)


class _UnmaskedUnsanitized(_Unmasked):
    sanitize = False


VARIANTS = {
    "adapter (int64 ids in)": (FlashInferNvlinkOneSided, torch.int64),
    "adapter, int32 ids in": (FlashInferNvlinkOneSided, torch.int32),
    "no -1 masking": (_Unmasked, torch.int32),
    "no masking, no sanitize": (_UnmaskedUnsanitized, torch.int32),
    "ours: nvlink_one_sided": (get_backend("nvlink_one_sided"), torch.int64),
}


def _rank(ctx, tokens_list):
    rows = []
    for t in tokens_list:
        shape = MoEShape(256, 8, 7168, t, "bf16")
        row = {"tokens": t}
        for label, (cls, ids_dtype) in VARIANTS.items():
            inputs = []
            for seed in range(3):
                inp = make_inputs(shape, t, rank=ctx.rank, world_size=ctx.world_size, seed=seed, device=ctx.device)
                inputs.append(RankInputs(inp.x, inp.topk_ids.to(ids_dtype), inp.topk_weights))
            backend = cls(ctx.group, shape, ctx.device)
            device_us, _ = time_graph_round_trips(backend, inputs, warmup=10, iters=50)
            backend.close()
            row[label] = summarize(device_us).median_us
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,128,8192")
    ap.add_argument("--json")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = run_ranks(_rank, 2, "cuda", tokens)[0]
    print("µs per round trip, CUDA-graph replay, median of 50; E256 k8 H7168 bf16, 2 GPUs")
    print(f"{'variant':28s} " + " ".join(f"{'T=' + str(t):>10s}" for t in tokens))
    for label in VARIANTS:
        print(f"{label:28s} " + " ".join(f"{r[label]:10.1f}" for r in rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
