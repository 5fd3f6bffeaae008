"""What each figure counts (tuner.figures): bytes of a planted routing, row sizes, link bandwidth.

The planted routing: W = 2 ranks, E = 4 experts (rank 0 owns 0-1, rank 1 owns 2-3), top-2.
  rank 0: [0, 1] -> {0}, [0, 2] -> {0, 1}, [2, 3] -> {1}, [1, 3] -> {0, 1}: 6 pairs, 3 to rank 1
  rank 1: [2, 3] -> {1}, [0, 3] -> {0, 1}: 3 pairs, 1 to rank 0
so per rank per direction, averaged over the ranks: 4.5 logical pairs, 2 over the link.
"""

from __future__ import annotations

import json

import paths
import pytest
import torch

from a2a_tune.kernels import MoEShape
from a2a_tune.kernels.reference import RankInputs
from a2a_tune.tuner.figures import (
    NO_LINK,
    PCIE_LANE_GBPS,
    LinkBandwidth,
    Traffic,
    destination_pairs,
    gbps,
    link_bandwidth,
    link_pct,
    link_text,
    row_bytes,
    traffic_from_pairs,
)
from a2a_tune.tuner.launch import run_ranks

PLANTED = {
    0: [[0, 1], [0, 2], [2, 3], [1, 3]],
    1: [[2, 3], [0, 3]],
}


def test_destination_pairs_count_every_token_rank_pair_and_those_to_other_ranks():
    assert destination_pairs(torch.tensor(PLANTED[0]), 4, 2, 0) == (6, 3)
    assert destination_pairs(torch.tensor(PLANTED[1]), 4, 2, 1) == (3, 1)
    assert destination_pairs(torch.zeros((0, 2), dtype=torch.int32), 4, 2, 0) == (0, 0)  # T_r = 0
    # a slot without an expert (-1) goes nowhere; two experts on one rank are one pair
    assert destination_pairs(torch.tensor([[-1, 3], [2, 3]]), 4, 2, 0) == (2, 2)


@pytest.mark.parametrize(
    "dtype, hidden, rows",
    [
        ("bf16", 7168, (14336, 14336)),
        ("fp16", 100, (200, 200)),
        ("fp32", 64, (256, 256)),
        # FP8: 1 byte per element + one fp32 scale per 128 elements; combine in bf16
        ("fp8_e4m3", 7168, (7168 + 56 * 4, 14336)),
        ("fp8_e4m3", 200, (200 + 2 * 4, 400)),
        # NVFP4: two e2m1 a byte + one e4m3 scale per 16: H/2 + H/16 (Qwen3.5-397B's H = 4096)
        ("nvfp4", 4096, (2048 + 256, 8192)),
        ("nvfp4", 7168, (3584 + 448, 14336)),
        # MXFP8: one e4m3 a byte + one E8M0 scale per 32: H + H/32
        ("mxfp8", 4096, (4096 + 128, 8192)),
        ("mxfp8", 2880, (2880 + 90, 5760)),
    ],
)
def test_a_dispatch_row_is_the_payload_and_its_scales_a_combine_row_the_activation(dtype, hidden, rows):
    assert row_bytes(dtype, hidden) == rows


def _planted_traffic(ctx, dtype):
    shape = MoEShape(4, 2, 64, 4, dtype)
    ids = torch.tensor(PLANTED[ctx.rank], dtype=torch.int32)
    inputs = RankInputs(torch.zeros(ids.shape[0], 64, dtype=torch.bfloat16), ids, torch.full(ids.shape, 0.5))
    from a2a_tune.tuner.measure import traffic

    # Two input sets: the same routing, and one where every token stays home (1 pair, 0 to the link).
    home = torch.tensor([[0, 1]] * 3 if ctx.rank == 0 else [[2, 3]] * 3, dtype=torch.int32)
    stay = RankInputs(torch.zeros(3, 64, dtype=torch.bfloat16), home, torch.full(home.shape, 0.5))
    return traffic(ctx, shape, [inputs]), traffic(ctx, shape, [inputs, stay])


def test_traffic_of_a_planted_routing_on_two_ranks_is_exact():
    (one, two), again = run_ranks(_planted_traffic, 2, "cpu", "fp8_e4m3")
    assert one == again[0] and two == again[1]  # every rank agrees
    # 4.5 logical pairs, 2 link pairs per rank; fp8 dispatch rows 64 + 4 B, bf16 combine rows 128 B
    assert one == Traffic(4.5 * 68, 2 * 68, 4.5 * 128, 2 * 128)
    # with the stay-home set: (9 + 6) pairs / (2 ranks x 2 sets), (4 + 0) / 4 over the link
    assert two == Traffic(3.75 * 68, 1.0 * 68, 3.75 * 128, 1.0 * 128)
    bf16 = traffic_from_pairs(4.5, 2, "bf16", 64)
    assert bf16 == Traffic(576.0, 256.0, 576.0, 256.0)


def test_gbps_and_share_of_the_link():
    assert gbps(1e9, 1e6) == pytest.approx(1.0)  # 1 GB in 1 s
    assert gbps(478_116, 1.0) == pytest.approx(478.116)  # bytes per µs = MB/s x ... = GB/s x 1e3
    assert gbps(None, 1.0) is None and gbps(1.0, None) is None and gbps(1.0, 0.0) is None
    link = LinkBandwidth(478.116, "18 NVLinks x 26.562 GB/s (NVSwitch)")
    assert link_pct(239_058, 1.0, link) == pytest.approx(50.0)
    assert link_pct(239_058, 1.0, None) is None


def _facts(name: str) -> dict:
    from a2a_tune.tuner.nvml import RecordedNvml
    from a2a_tune.tuner.probe import probe

    return probe(RecordedNvml(paths.FIXTURES / "nvml" / name)).to_dict()


def test_link_bandwidth_from_the_probe_nvlink_pcie_and_none():
    h200 = link_bandwidth(_facts("h200_nv18x2.json"), 2)
    assert h200.gbps == pytest.approx(18 * 26.562) and h200.how.startswith("18 NVLinks x 26.562 GB/s")
    # PCIe gen 4 x16 (L40S): 16 GT/s x 128/130 / 8 per lane x 16 lanes
    l40s = link_bandwidth(_facts("l40s_pcie4.json"), 4)
    assert l40s == LinkBandwidth(PCIE_LANE_GBPS[4] * 16, "PCIe gen4 x16")
    assert l40s.gbps == pytest.approx(31.51, abs=0.01)
    # an NVSwitch node: its island's links, at any EP size up to its GPUs
    h100 = _facts("h100_hgx8.json")
    assert link_bandwidth(h100, 8).how.startswith("18 NVLinks") and link_bandwidth(h100, 16) is None
    # no NVLink and a recording from before the PCIe answer: unknown, and said so
    old = _facts("l40s_pcie4.json")
    for g in old["gpus"]:
        g.pop("pcie_generation"), g.pop("pcie_width")
    assert link_bandwidth(old, 4) is None and link_text(old, 4).startswith("link bandwidth unknown")
    # CPU ranks: no link
    cpu = json.loads(json.dumps({"gpus": [], "islands": [], "node_count": 1}))
    assert link_bandwidth(cpu, 2) is None and link_text(cpu, 2) == NO_LINK == "no link"
    # PCIe numbers across nodes say nothing about the network between them
    assert link_bandwidth({**_facts("l40s_pcie4.json"), "node_count": 2}, 4) is None
