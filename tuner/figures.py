"""What the figures beside a round trip count: bytes a point moves, GB/s, share of the link.

The rules (README, "What each figure counts"), counted from the inputs actually timed:

* **logical bytes**: every (token, destination rank) pair, the token's own rank included
  (DeepEP's convention), times the row size;
* **link bytes**: only the pairs whose destination is another rank;
* both per rank per direction, averaged over the ranks (and over the rotated input sets):
  what the ranks send on average is what they receive on average;
* a dispatch row is what the payload packs (``runtime.point.Payload.row_bytes``): H x the
  element size, plus the block scales of a quantized payload: block-FP8 H + 4 x ceil(H/128),
  MXFP8 H + H/32, NVFP4 H/2 + H/16 (its FP32 global scale is per layer, not per row); a
  combine row is H x the activation (model) dtype's size;
* GB/s = bytes / time, 1e9 bytes per GB;
* % of link = link bytes / time / the rank's link bandwidth per direction, from the probe
  facts (:func:`link_bandwidth`): NVLink = active links x per-link speed, PCIe = the per-lane
  rate of its generation x its width; CPU ranks have no link.

Standard library at import time (the views use it); the counting from tensors imports torch
where it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "NO_LINK",
    "LinkBandwidth",
    "Traffic",
    "destination_pairs",
    "gbps",
    "is_cpu",
    "link_bandwidth",
    "link_pct",
    "link_text",
    "mib",
    "row_bytes",
    "traffic_from_pairs",
]

#: What the views say where the ranks have no link to share (CPU ranks over gloo).
NO_LINK = "no link"
# PCIe per-lane payload rate per direction, GB/s: transfer rate x line-code efficiency / 8
# (8b/10b up to gen 2, 128b/130b for gen 3-5, 242/256 FLIT efficiency for gen 6).
PCIE_LANE_GBPS = {
    1: 2.5 * 0.8 / 8,
    2: 5.0 * 0.8 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}


class Traffic(NamedTuple):
    """Bytes one point moves, per rank per direction, averaged over ranks (see the module)."""

    dispatch_logical: float
    dispatch_link: float
    combine_logical: float
    combine_link: float


class LinkBandwidth(NamedTuple):
    """A rank's link bandwidth per direction and how it was derived, e.g. "18 NVLinks x 26.562 GB/s"."""

    gbps: float
    how: str


def row_bytes(dtype: str, hidden: int) -> tuple[int, int]:
    """(dispatch row, combine row) in bytes for payload `dtype` (runtime.point.PAYLOADS)."""
    from .runtime.point import PAYLOADS

    payload = PAYLOADS[dtype]
    return payload.row_bytes(hidden), payload.combine_row_bytes(hidden)


def destination_pairs(topk_ids: Any, num_experts: int, world_size: int, rank: int) -> tuple[int, int]:
    """(pairs, pairs to other ranks) of one rank's tokens: `topk_ids` [T, k] -> the distinct
    destination ranks of each token (rank r owns experts [r*E/W, (r+1)*E/W)), summed over T."""
    import torch

    if topk_ids.numel() == 0:
        return 0, 0
    ids = topk_ids.long()
    dest = torch.where(ids >= 0, ids // (num_experts // world_size), world_size)  # -1 (no expert) -> a spare column
    hit = torch.zeros(ids.shape[0], world_size + 1, dtype=torch.bool, device=ids.device)
    hit.scatter_(1, dest, True)
    pairs = int(hit[:, :world_size].sum())
    return pairs, pairs - int(hit[:, rank].sum())


def traffic_from_pairs(pairs: float, link_pairs: float, dtype: str, hidden: int) -> Traffic:
    """The point's :class:`Traffic` from its pairs per rank (averaged over ranks and input sets)."""
    dispatch_row, combine_row = row_bytes(dtype, hidden)
    return Traffic(pairs * dispatch_row, link_pairs * dispatch_row, pairs * combine_row, link_pairs * combine_row)


def gbps(nbytes: float | None, us: float | None) -> float | None:
    """GB/s (1e9 bytes) of `nbytes` moved in `us` microseconds; None when either is unknown."""
    if nbytes is None or us is None or us <= 0:
        return None
    return nbytes / us / 1e3


def link_pct(link_bytes: float | None, us: float | None, link: LinkBandwidth | None) -> float | None:
    """Link bytes over `us` as a percentage of `link`'s bandwidth per direction; None when unknown."""
    rate = gbps(link_bytes, us)
    if rate is None or link is None or link.gbps <= 0:
        return None
    return rate / link.gbps * 100


def mib(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / 2**20


def _gpus(facts: Mapping) -> list:
    return [g for g in facts.get("gpus") or [] if isinstance(g, Mapping)]


def link_bandwidth(facts: Mapping | None, ep_size: int) -> LinkBandwidth | None:
    """The bandwidth per direction one rank of an EP group of `ep_size` GPUs has to the others,
    from probe facts (a :meth:`~a2a_tune.tuner.probe.Topology.to_dict`), or None when unknown:

    * an NVLink island (or multi-node NVLink domain) holding `ep_size` GPUs: its fewest active
      links per GPU x the slowest per-link speed;
    * otherwise, on one node, PCIe: the slowest GPU's per-lane rate of its generation x width;
    * otherwise (CPU ranks, nodes joined by a network, facts without the numbers): None.
    """
    if not isinstance(facts, Mapping):
        return None
    best = None
    for isl in facts.get("islands") or []:
        if not isinstance(isl, Mapping):
            continue
        counts = [c for c in isl.get("link_counts") or [] if isinstance(c, int) and c > 0]
        speed = isl.get("speed_mbps")
        if len(isl.get("gpus") or []) < ep_size or not counts or not isinstance(speed, (int, float)) or speed <= 0:
            continue
        links = min(counts)
        gb = links * speed / 1000
        if best is None or gb > best.gbps:
            how = "NVSwitch" if isl.get("via_switch") else "direct NVLink"
            best = LinkBandwidth(gb, f"{links} NVLinks x {speed / 1000:g} GB/s ({how})")
    if best is not None:
        return best
    gpus = _gpus(facts)
    if len(gpus) < ep_size or (facts.get("node_count") or 1) > 1:
        return None
    lanes = []
    for g in gpus[:ep_size]:
        gen, width = g.get("pcie_generation"), g.get("pcie_width")
        if gen not in PCIE_LANE_GBPS or not isinstance(width, int) or width < 1:
            return None
        lanes.append((PCIE_LANE_GBPS[gen] * width, gen, width))
    gb, gen, width = min(lanes)
    return LinkBandwidth(gb, f"PCIe gen{gen} x{width}")


def link_text(facts: Mapping | None, ep_size: int) -> str:
    """How a view names the link of an EP group: "478 GB/s (18 NVLinks x 26.562 GB/s ...)",
    NO_LINK for CPU ranks, or why it is unknown."""
    link = link_bandwidth(facts, ep_size)
    if link is not None:
        return f"{link.gbps:.0f} GB/s per direction ({link.how}, from the probe facts)"
    if not isinstance(facts, Mapping) or "gpus" not in facts:
        return "link bandwidth unknown (no probe facts)"
    if is_cpu(facts):
        return NO_LINK
    return "link bandwidth unknown (no NVLink island of the EP group, no PCIe numbers in the probe facts)"


def is_cpu(facts: Mapping | None) -> bool:
    """Whether probe facts describe CPU ranks (a probe that found no GPU)."""
    return isinstance(facts, Mapping) and "gpus" in facts and not _gpus(facts)
