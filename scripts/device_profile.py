"""Where a round trip's time goes on GPUs: torch.profiler tables and bare-collective floors.

python scripts/device_profile.py [--tokens 1,8192]   (2+ GPUs; prints from rank 0)
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from a2a_tune.kernels import MoEShape, get_backend, list_backends
from a2a_tune.kernels.reference import make_inputs
from a2a_tune.tuner.launch import run_ranks


def _loop_us(fn, n: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def _rank(ctx, tokens_list):
    lines = []
    one = torch.ones(1, 64, device=ctx.device)
    gathered = torch.empty(ctx.world_size, 64, device=ctx.device)
    lines.append(
        f"bare all_gather 256 B: {_loop_us(lambda: dist.all_gather_into_tensor(gathered, one)):.1f} us/call (back to back)"
    )
    a2a_in = torch.ones(ctx.world_size * 64, device=ctx.device)
    a2a_out = torch.empty_like(a2a_in)
    lines.append(f"bare all_to_all_single: {_loop_us(lambda: dist.all_to_all_single(a2a_out, a2a_in)):.1f} us/call")
    lines.append(
        f"tensor.tolist() of 2 ints: {_loop_us(lambda: torch.ones(2, device=ctx.device).tolist()):.1f} us/call"
    )
    lines.append(f"dist.barrier: {_loop_us(lambda: dist.barrier(), 50):.1f} us/call")
    shape = MoEShape(256, 8, 7168, max(tokens_list), "bf16")
    for name in list_backends():
        b = get_backend(name)(ctx.group, shape, ctx.device)
        for t in tokens_list:
            inp = make_inputs(shape, t, rank=ctx.rank, world_size=ctx.world_size, device=ctx.device)

            def rt():
                d = b.dispatch(inp.x, inp.topk_ids, inp.topk_weights)  # noqa: B023
                b.combine(d.x, d)  # noqa: B023

            lines.append(
                f"{name} T={t}: {_loop_us(rt, 50):.1f} us/round trip back to back (host loop, synced at the end)"
            )
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            ) as prof:
                for _ in range(10):
                    rt()
                torch.cuda.synchronize()
            if ctx.rank == 0:
                lines.append(
                    prof.key_averages().table(sort_by="cpu_time_total", row_limit=18, max_name_column_width=40)
                )
        b.close()
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8192")
    args = ap.parse_args()
    print(run_ranks(_rank, torch.cuda.device_count(), "cuda", [int(t) for t in args.tokens.split(",")])[0])


if __name__ == "__main__":
    main()
