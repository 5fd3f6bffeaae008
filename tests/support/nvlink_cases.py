"""The NVLink backends' CPU cases, shared by their two CPU harnesses: ranks as processes over
shared files (tests/kernels/test_nvlink_emulated.py) and virtual ranks of one process
(tests/kernels/test_virtual.py). The backend is filled in per NVLink backend (`per_backend`);
the world size is len(tokens)."""

from __future__ import annotations

from dataclasses import replace

from invariant_cases import Case

from a2a_tune.kernels import get_backend

NVLINK = ["nvlink_one_sided", "nvlink_low_latency"]
SMALL_BLOCKS = {
    "row_block_bytes": 2048,  # rows copied in several steps (N_HB > 1)
    "recv_block_h": 512,  # combine_recv over several H blocks
    "recv_block_rows": 16,  # low latency: dispatch_recv over several row blocks
    "send_num_warps": 1,
    "recv_num_warps": 8,
}
LARGE_BLOCKS = {"row_block_bytes": 32768, "recv_block_h": 4096, "recv_block_rows": 256, "send_num_warps": 16}
BASE = [
    Case("w2-fp32", "", (3, 2), experts=8, topk=2, hidden=16),
    Case("w2-bf16-odd-hidden", "", (4, 5), experts=8, topk=3, hidden=33, dtype="bf16"),
    Case("w2-zero-tokens", "", (0, 4), experts=8, topk=2, hidden=8),
    Case("w2-fp8-block-scales", "", (3, 2), experts=8, topk=2, hidden=256, dtype="fp8_e4m3"),
    Case("w2-knobs-small-blocks", "", (5, 3), experts=8, topk=2, hidden=1100, repeats=2, knobs=SMALL_BLOCKS),
    Case("w2-knobs-fp8", "", (3, 2), experts=8, topk=2, hidden=2176, dtype="fp8_e4m3", knobs=SMALL_BLOCKS),
    Case("w2-more-tokens-than-the-step", "", (5, 5), experts=8, topk=2, hidden=8, capacity=8, step=4),
    Case("w2-nvfp4-packed-rows", "", (3, 2), experts=8, topk=2, hidden=64, dtype="nvfp4"),
    Case("w3-mxfp8-packed-rows", "", (2, 0, 3), experts=6, topk=2, hidden=96, dtype="mxfp8"),
    Case("w3-skewed", "", (5, 1, 3), experts=12, topk=3, hidden=8, routing="skewed"),
    Case("w3-all-local", "", (2, 2, 2), experts=12, topk=2, hidden=8, routing="local"),
    Case("w3-fp8-odd-hidden", "", (2, 0, 3), experts=6, topk=2, hidden=136, dtype="fp8_e4m3"),
    Case("w3-knobs-bf16-large-blocks", "", (2, 0, 3), experts=6, topk=2, hidden=40, dtype="bf16", knobs=LARGE_BLOCKS),
    Case("w4-bf16", "", (2, 3, 0, 1), experts=16, topk=4, hidden=8, dtype="bf16"),
    # EP 8, an HGX node: every rank a peer of every other
    Case("w8-skewed", "", (3, 0, 1, 2, 4, 1, 0, 2), experts=16, topk=4, hidden=8, routing="skewed"),
    Case("w8-fp8", "", (1, 2, 0, 1, 1, 2, 1, 1), experts=32, topk=8, hidden=128, dtype="fp8_e4m3"),
]


def per_backend(base: list[Case], backends: list[str] = NVLINK) -> list[Case]:
    """Each case for each backend (a case's backend, e.g. "planted_", prefixes the name), with the
    knobs that backend declares."""
    return [
        replace(
            c,
            id=f"{b}-{c.id}",
            backend=c.backend + b,
            knobs={k: v for k, v in c.knobs.items() if k in get_backend(b).knob_space},
        )
        for b in backends
        for c in base
    ]
