"""The hardware as facts: what the probe learned about GPUs and NVLink, what follows from
it, and the hardware fingerprint that names it.

:class:`Topology` holds one node's facts (from :func:`a2a_tune.tuner.probe.probe`) or a
cluster's (from :func:`a2a_tune.tuner.probe.merge_nodes`); :func:`build_topology` derives the
islands, fabric domains, health and PCIe-only pairs from the per-GPU facts, and
:attr:`Topology.fingerprint` names the result. Reading NVML is :mod:`a2a_tune.tuner.probe`'s.

Rules:

- Islands are NVLink connected components. A link whose remote PCI bus id is another GPU of
  the same node joins the two GPUs directly. A link whose remote is an NVSwitch joins the GPU
  to every switch-connected GPU of its node, and - across nodes - to the switch-connected
  GPUs of its fabric domain.
- A fabric domain is the set of GPUs sharing (clusterUuid, cliqueId) with fabric state
  ``completed`` and a non-zero clusterUuid (an all-zero uuid means "in no domain").
- A GPU is degraded when its active link count is below the expected count: the most active
  links among GPUs of the same SKU in the topology, or the SKU's known count (18 for
  H100/H200 SXM, B200, GB200) when the GPU has any NVLink at all. Its inactive links are
  reported as down.

Design notes: docs/architecture.md, "Module notes", `tuner/topology.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

TOPOLOGY_SCHEMA = 1

# NVLinks per GPU on parts whose count is fixed by the SKU (NVIDIA product specs).
# Used only as a floor for GPUs that have any NVLink, so a lone node where every GPU lost
# the same links is still flagged.
_SKU_NVLINKS = {"h100-sxm": 18, "h200": 18, "b200": 18, "gb200": 18}

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


# ---------------------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkFacts:
    """One present NVLink of a GPU. ``active`` is None when its state could not be read."""

    index: int
    active: bool | None
    version: int | None  # raw nvmlDeviceGetNvLinkVersion answer
    remote_bus_id: str | None
    remote_type: str | None  # "gpu" | "switch" | "ibmnpu" | "unknown"
    speed_mbps: int | None


@dataclass(frozen=True)
class FabricFacts:
    """GPU fabric membership; a field is None when NVML could not say."""

    cluster_uuid: str | None
    clique_id: int | None
    state: str | None
    status: str | None

    @property
    def in_domain(self) -> bool:
        """True when the GPU belongs to a multi-node NVLink domain (see module docstring)."""
        return (
            self.state == "completed"
            and self.cluster_uuid is not None
            and self.cluster_uuid != _ZERO_UUID
            and self.clique_id is not None
        )


@dataclass(frozen=True)
class GpuFacts:
    """What the probe learned about one GPU. Unreadable fields are None."""

    index: int  # position in Topology.gpus: the GPU's id in this (node or cluster) view
    node: int  # ordinal of its host in Topology.hostnames
    local_index: int  # NVML index on its host
    name: str | None
    sku: str  # fingerprint slug of `name`
    compute_capability: tuple[int, int] | None
    memory_total_bytes: int | None
    pci_bus_id: str | None
    uuid: str | None
    links: tuple[LinkFacts, ...]  # present links only, by link index
    fabric: FabricFacts | None
    # The PCIe link at its best (generation, lanes); not in facts_hash: the link speed is a
    # figure's denominator, not the hardware's identity, so tables keep the key they have.
    pcie_generation: int | None = None
    pcie_width: int | None = None

    @property
    def active_links(self) -> list[int]:
        return [link.index for link in self.links if link.active is True]

    @property
    def inactive_links(self) -> list[int]:
        return [link.index for link in self.links if link.active is False]


@dataclass(frozen=True)
class NvlinkPair:
    """Two GPUs joined directly (no switch) by ``links`` active NVLinks."""

    a: int
    b: int
    links: int
    speed_mbps: int | None  # slowest link of the pair


@dataclass(frozen=True)
class Island:
    """An NVLink connected component.

    ``link_counts[i]`` is the number of active NVLinks of ``gpus[i]`` - all of them lead into
    the island, or to a remote NVML could not name (an unreadable remote bus id on one end of
    a link must not make the island look thinner than it is); ``speed_mbps`` is the slowest
    known speed among those links (None when no speed is known).
    """

    gpus: tuple[int, ...]
    nodes: tuple[int, ...]
    via_switch: bool
    link_counts: tuple[int, ...]
    speed_mbps: int | None
    direct_pairs: tuple[NvlinkPair, ...]

    @property
    def links_per_gpu(self) -> int:
        """The healthy link count: the most links any member has (degraded ones have fewer)."""
        return max(self.link_counts, default=0)


@dataclass(frozen=True)
class FabricDomain:
    """GPUs sharing one (clusterUuid, cliqueId): one multi-node NVLink domain."""

    cluster_uuid: str
    clique_id: int
    gpus: tuple[int, ...]
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class DegradedGpu:
    """A GPU with fewer active NVLinks than expected, and which of its links are down."""

    gpu: int
    active_links: int
    expected_links: int
    down_links: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """Facts about one node (from :func:`probe`) or a cluster (from :func:`merge_nodes`).

    ``gpus`` is the primary data; islands, fabric domains, degraded GPUs and PCIe-only pairs
    are derived from it by :func:`build_topology`. GPU references are ``GpuFacts.index``.
    """

    gpus: tuple[GpuFacts, ...]
    islands: tuple[Island, ...]
    fabric_domains: tuple[FabricDomain, ...]
    degraded: tuple[DegradedGpu, ...]
    pcie_only_pairs: tuple[tuple[int, int], ...]
    hostnames: tuple[str, ...]  # by node ordinal
    driver_versions: tuple[str | None, ...]  # by node ordinal
    machine: str  # platform.machine() of the (first) host

    @property
    def node_count(self) -> int:
        return len(self.hostnames)

    @property
    def hostname(self) -> str:
        return self.hostnames[0]

    @property
    def driver_version(self) -> str | None:
        return self.driver_versions[0] if self.driver_versions else None

    @property
    def fingerprint(self) -> str:
        return _fingerprint(self)

    @property
    def facts_hash(self) -> str:
        """sha256 prefix of the stable facts: what the hardware is, not which unit it is.

        Excluded: GPU uuids, fabric cluster uuid and clique id, hostnames, driver versions.
        Included: every GPU's model, CC, total memory, bus id, per-link state/version/remote/
        speed, fabric state, its node ordinal, and the host architecture.
        """
        stable = {
            "machine": self.machine,
            "node_count": self.node_count,
            "gpus": [
                {
                    "node": g.node,
                    "local_index": g.local_index,
                    "name": g.name,
                    "compute_capability": g.compute_capability,
                    "memory_total_bytes": g.memory_total_bytes,
                    "pci_bus_id": g.pci_bus_id,
                    "links": [asdict(link) for link in g.links],
                    "fabric_state": g.fabric.state if g.fabric else None,
                }
                for g in self.gpus
            ],
        }
        canonical = json.dumps(stable, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """All facts plus ``fingerprint`` and ``facts_hash``; JSON-serialisable."""
        data = asdict(self)
        data = json.loads(json.dumps(data))  # tuples -> lists, once and uniformly
        return {
            "schema": TOPOLOGY_SCHEMA,
            "fingerprint": self.fingerprint,
            "facts_hash": self.facts_hash,
            "node_count": self.node_count,
            **data,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        """Inverse of :meth:`to_dict`; fingerprint and facts_hash are recomputed, not read."""
        if data.get("schema") != TOPOLOGY_SCHEMA:
            raise ValueError(f"unsupported topology schema {data.get('schema')!r}")
        return cls(
            gpus=tuple(_gpu_from_dict(g) for g in data["gpus"]),
            islands=tuple(
                Island(
                    gpus=tuple(i["gpus"]),
                    nodes=tuple(i["nodes"]),
                    via_switch=bool(i["via_switch"]),
                    link_counts=tuple(i["link_counts"]),
                    speed_mbps=i["speed_mbps"],
                    direct_pairs=tuple(NvlinkPair(**p) for p in i["direct_pairs"]),
                )
                for i in data["islands"]
            ),
            fabric_domains=tuple(
                FabricDomain(
                    cluster_uuid=d["cluster_uuid"],
                    clique_id=d["clique_id"],
                    gpus=tuple(d["gpus"]),
                    nodes=tuple(d["nodes"]),
                )
                for d in data["fabric_domains"]
            ),
            degraded=tuple(
                DegradedGpu(
                    gpu=d["gpu"],
                    active_links=d["active_links"],
                    expected_links=d["expected_links"],
                    down_links=tuple(d["down_links"]),
                )
                for d in data["degraded"]
            ),
            pcie_only_pairs=tuple((a, b) for a, b in data["pcie_only_pairs"]),
            hostnames=tuple(data["hostnames"]),
            driver_versions=tuple(data["driver_versions"]),
            machine=data["machine"],
        )


def _gpu_from_dict(g: dict[str, Any]) -> GpuFacts:
    cc = g["compute_capability"]
    return GpuFacts(
        index=g["index"],
        node=g["node"],
        local_index=g["local_index"],
        name=g["name"],
        sku=g["sku"],
        compute_capability=None if cc is None else (cc[0], cc[1]),
        memory_total_bytes=g["memory_total_bytes"],
        pci_bus_id=g["pci_bus_id"],
        uuid=g["uuid"],
        links=tuple(LinkFacts(**link) for link in g["links"]),
        fabric=None if g["fabric"] is None else FabricFacts(**g["fabric"]),
        pcie_generation=g.get("pcie_generation"),
        pcie_width=g.get("pcie_width"),
    )


def sku_slug(name: str | None) -> str:
    """Fingerprint slug of an NVML device name (see the grammar in the module docstring).

    "NVIDIA H100 80GB HBM3" -> "h100-sxm" (the HBM-named H100/H200 parts are the SXM ones;
    PCIe/NVL parts say so in their names), "NVIDIA A100-SXM4-80GB" -> "a100-sxm4".
    """
    if not name:
        return "unknown"
    tokens = [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]
    slug: list[str] = []
    for token in tokens:
        if token in ("nvidia", "tesla") or re.fullmatch(r"\d+gb", token):
            continue
        if re.fullmatch(r"hbm\d*e?", token):
            token = "sxm"
        if token not in slug:
            slug.append(token)
    return "-".join(slug) or "unknown"


# ---------------------------------------------------------------------------------------
# Analysis: facts about GPUs -> islands, domains, health
# ---------------------------------------------------------------------------------------


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _fabric_domains(gpus: list[GpuFacts]) -> list[FabricDomain]:
    members: dict[tuple[str, int], list[GpuFacts]] = defaultdict(list)
    for gpu in gpus:
        if gpu.fabric is not None and gpu.fabric.in_domain:
            members[(gpu.fabric.cluster_uuid, gpu.fabric.clique_id)].append(gpu)  # type: ignore[index]
    return [
        FabricDomain(
            cluster_uuid=uuid,
            clique_id=clique,
            gpus=tuple(g.index for g in group),
            nodes=tuple(sorted({g.node for g in group})),
        )
        for (uuid, clique), group in sorted(members.items())
    ]


def _islands(gpus: list[GpuFacts], domains: list[FabricDomain]) -> list[Island]:
    by_bus = {(g.node, g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}
    uf = _UnionFind(len(gpus))
    # (a, b) with a < b -> {gpu: [speeds of its active links to the other]}
    direct: dict[tuple[int, int], dict[int, list[int | None]]] = defaultdict(lambda: defaultdict(list))
    joined: set[int] = set()  # GPUs with at least one NVLink to a named peer or switch
    on_switch: dict[int, set[int]] = defaultdict(set)  # node -> switch-connected gpus
    for gpu in gpus:
        for link in gpu.links:
            if link.active is not True:
                continue
            peer = by_bus.get((gpu.node, link.remote_bus_id))
            if peer is not None and peer != gpu.index:
                direct[(min(gpu.index, peer), max(gpu.index, peer))][gpu.index].append(link.speed_mbps)
                uf.union(gpu.index, peer)
                joined.update((gpu.index, peer))  # the peer is joined even if its side is unreadable
            elif link.remote_type == "switch":
                on_switch[gpu.node].add(gpu.index)
                joined.add(gpu.index)
            # else: remote unknown - the link joins nothing by itself
    for node_members in on_switch.values():
        first, *others = sorted(node_members)
        for other in others:
            uf.union(first, other)
    switch_gpus = {g for node_members in on_switch.values() for g in node_members}
    for domain in domains:  # one NVSwitch fabric across the nodes of a domain
        domain_on_switch = [g for g in domain.gpus if g in switch_gpus]
        for other in domain_on_switch[1:]:
            uf.union(domain_on_switch[0], other)

    components: dict[int, list[int]] = defaultdict(list)
    for index in sorted(joined):
        components[uf.find(index)].append(index)
    islands = []
    for members in sorted(components.values()):
        speeds = [
            link.speed_mbps
            for g in members
            for link in gpus[g].links
            if link.active is True and link.speed_mbps is not None
        ]
        pairs = []
        for (a, b), sides in sorted(direct.items()):
            if a not in members:
                continue
            # Each physical link shows on both ends; take the side that saw more (a failed
            # remote-bus query on one side must not hide the link).
            links = max(len(sides[a]), len(sides[b]))
            pair_speeds = [s for side in sides.values() for s in side if s is not None]
            pairs.append(NvlinkPair(a=a, b=b, links=links, speed_mbps=min(pair_speeds, default=None)))
        islands.append(
            Island(
                gpus=tuple(members),
                nodes=tuple(sorted({gpus[g].node for g in members})),
                via_switch=any(g in switch_gpus for g in members),
                link_counts=tuple(len(gpus[g].active_links) for g in members),
                speed_mbps=min(speeds, default=None),
                direct_pairs=tuple(pairs),
            )
        )
    return islands


def _degraded(gpus: list[GpuFacts]) -> list[DegradedGpu]:
    most_by_sku: dict[str, int] = defaultdict(int)
    for gpu in gpus:
        most_by_sku[gpu.sku] = max(most_by_sku[gpu.sku], len(gpu.active_links))
    degraded = []
    for gpu in gpus:
        expected = most_by_sku[gpu.sku]
        if gpu.links:  # the SKU floor applies only to GPUs that show NVLinks at all
            expected = max(expected, _SKU_NVLINKS.get(gpu.sku, 0))
        active = len(gpu.active_links)
        if active < expected:
            degraded.append(
                DegradedGpu(
                    gpu=gpu.index,
                    active_links=active,
                    expected_links=expected,
                    down_links=tuple(gpu.inactive_links),
                )
            )
    return degraded


def _pcie_only_pairs(gpus: list[GpuFacts], islands: list[Island]) -> list[tuple[int, int]]:
    island_of = {g: n for n, island in enumerate(islands) for g in island.gpus}
    pairs = []
    for a, b in combinations(gpus, 2):
        if a.node != b.node:
            continue  # across nodes the path is the network, not PCIe
        ia, ib = island_of.get(a.index), island_of.get(b.index)
        if ia is None or ia != ib:
            pairs.append((a.index, b.index))
    return pairs


def build_topology(
    gpus: list[GpuFacts],
    *,
    hostnames: list[str],
    driver_versions: list[str | None],
    machine: str,
) -> Topology:
    """Derive islands, fabric domains, health and PCIe-only pairs from per-GPU facts.

    ``gpus[i].index`` must be ``i`` and ``gpus[i].node`` an index into ``hostnames``.
    """
    for position, gpu in enumerate(gpus):
        if gpu.index != position:
            raise ValueError(f"gpus[{position}].index is {gpu.index}")
    domains = _fabric_domains(gpus)
    islands = _islands(gpus, domains)
    return Topology(
        gpus=tuple(gpus),
        islands=tuple(islands),
        fabric_domains=tuple(domains),
        degraded=tuple(_degraded(gpus)),
        pcie_only_pairs=tuple(_pcie_only_pairs(gpus, islands)),
        hostnames=tuple(hostnames),
        driver_versions=tuple(driver_versions),
        machine=machine,
    )


# ---------------------------------------------------------------------------------------
# Fingerprint
# ---------------------------------------------------------------------------------------


def _nodes_part(node_count: int) -> str:
    return "node1" if node_count == 1 else f"nodes{node_count}"


def _fingerprint(topo: Topology) -> str:
    nodes = _nodes_part(topo.node_count)
    if not topo.gpus:
        machine = re.sub(r"[^a-z0-9_+]+", "-", topo.machine.lower()) or "unknown"
        return f"cpu-{machine}.{nodes}"
    sku = "+".join(sorted({g.sku for g in topo.gpus}))

    # (kind, L, N) -> islands of that shape, per node for "nvl", per cluster for "mnnvl"
    shapes: dict[tuple[str, int, int], dict[int | None, int]] = defaultdict(lambda: defaultdict(int))
    for island in topo.islands:
        kind = "mnnvl" if len(island.nodes) > 1 else "nvl"
        scope = island.nodes[0] if kind == "nvl" else None
        shapes[(kind, island.links_per_gpu, len(island.gpus))][scope] += 1
    parts = []
    for kind, links, size in sorted(shapes, key=lambda s: (-s[2], -s[1], s[0])):
        count = max(shapes[(kind, links, size)].values())
        parts.append(f"{kind}{links}x{size}" + (f"x{count}" if count > 1 else ""))

    in_island = {g for island in topo.islands for g in island.gpus}
    loose_per_node: dict[int, int] = defaultdict(int)
    for gpu in topo.gpus:
        if gpu.index not in in_island:
            loose_per_node[gpu.node] += 1
    if loose_per_node:
        parts.append(f"pciex{max(loose_per_node.values())}")

    interconnect = "+".join(parts) + ("-degraded" if topo.degraded else "")
    return f"{sku}.{interconnect}.{nodes}"
