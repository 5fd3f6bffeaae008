"""The job's view of its nodes: where each rank runs, whether the nodes match, how far the EP
group reaches.

Every rank probes its own node (:func:`probe_for_device`) and reports it with its local rank
and library versions; :func:`gather_cluster` collects the reports on every rank (one
``all_gather_object``), so every rank takes the same decisions from the same data without
further collectives:

* the cluster's topology (:func:`~a2a_tune.tuner.probe.merge_nodes`): its fingerprint names one
  NVLink domain spanning nodes (``gb200.mnnvl18x8.nodes2``) or islands joined by the network
  (``h200.nvl18x2.nodes2``);
* :meth:`ClusterView.mixed`: one line per node whose hardware (GPU model, NVLink shape and
  health, as its own fingerprint says), driver, NCCL, CUDA, torch or FlashInfer differs from
  the others'. The sweep refuses such a job before any timing unless told to tune it anyway
  (``--allow-mixed``), and then the run and its table record the mix;
* :meth:`ClusterView.span`: what joins the EP group's ranks (one NVLink island, one NVLink
  domain across nodes, or the network), compared with each backend's ``reach``
  (``a2a_tune.kernels.base``): a backend the group leaves is not applicable, with the reason.

After a completed run the table goes to every node: :mod:`a2a_tune.tuner.publish`.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
import torch.distributed as dist

from a2a_tune.kernels._flashinfer import flashinfer_version

from .groups import group_ranks
from .launch import RankContext
from .probe import RECORDING_ENV, Topology, cpu_topology, merge_nodes, probe
from .runtime.environ import env_text
from .runtime.table import FABRICS

# Library versions that must agree across nodes (the driver is a probe fact of each node).
COMPARED_VERSIONS = ("nccl", "cuda", "torch", "flashinfer")

SPAN_TEXT = {
    "island": "one NVLink island",
    "domain": "one NVLink domain across nodes",
    "network": "no NVLink between all its ranks",
}


class MixedClusterError(RuntimeError):
    """The job's nodes differ (hardware or versions) and the user did not allow it."""


@dataclass(frozen=True)
class RankReport:
    """What one rank says about itself: its node's probe, its local rank, its libraries."""

    rank: int
    local_rank: int
    topology: dict[str, Any]  # Topology.to_dict() of the rank's node
    versions: dict[str, str | None]

    @property
    def host(self) -> str:
        return self.topology["hostnames"][0]


@dataclass(frozen=True)
class ClusterView:
    """The gathered reports of every rank (index = rank) and the cluster they make up."""

    reports: tuple[RankReport, ...]
    topology: Topology  # merged over the nodes

    @classmethod
    def from_reports(cls, reports: list[RankReport]) -> ClusterView:
        return cls(tuple(reports), merge_nodes([Topology.from_dict(r.topology) for r in reports]))

    @property
    def hosts(self) -> list[str]:
        """Node host names, in the order their first rank appears."""
        return list(dict.fromkeys(r.host for r in self.reports))

    def node(self, host: str) -> RankReport:
        """The report of the first rank on `host` (every rank of a node probes the same node)."""
        return next(r for r in self.reports if r.host == host)

    def _node_facts(self, host: str) -> dict[str, str | None]:
        report = self.node(host)
        topo = Topology.from_dict(report.topology)
        facts: dict[str, str | None] = {"hardware": topo.fingerprint, "driver": topo.driver_version}
        facts.update({name: report.versions.get(name) for name in COMPARED_VERSIONS})
        return facts

    def mixed(self) -> list[str]:
        """One line per node that differs from the others; [] for a uniform cluster.

        Per fact the reference is the value most nodes share (on a draw: a healthy NVLink
        over a degraded one, then the node of rank 0), so with two nodes the odd one out is
        the degraded one, or else rank 1's."""
        hosts = self.hosts
        facts = {h: self._node_facts(h) for h in hosts}
        odd: dict[str, list[str]] = {}
        for name in facts[hosts[0]]:
            counts = Counter(facts[h][name] for h in hosts)
            if len(counts) == 1:
                continue
            first_seen = {v: i for i, v in reversed(list(enumerate(facts[h][name] for h in hosts)))}
            reference = min(
                counts, key=lambda v: (-counts[v], name == "hardware" and "-degraded" in str(v), first_seen[v])
            )
            for h in hosts:
                if facts[h][name] != reference:
                    detail = self._degraded_text(h) if name == "hardware" else ""
                    odd.setdefault(h, []).append(f"{name} {facts[h][name]}{detail} (others: {reference})")
        return [f"node {h} differs: {'; '.join(odd[h])}" for h in hosts if h in odd]

    def _degraded_text(self, host: str) -> str:
        topo = Topology.from_dict(self.node(host).topology)
        down = [f"GPU{d.gpu} {d.active_links}/{d.expected_links} NVLinks active" for d in topo.degraded]
        return f" [{', '.join(down)}]" if down else ""

    def span(self, ranks: Sequence[int] | None = None) -> tuple[str, str]:
        """(kind, text): what joins every rank of the EP group `ranks` (default: the job's),
        kind one of ``a2a_tune.kernels.base.SPANS``. A rank's GPU is the one at its local rank
        on its node; a rank without one (CPU ranks) shares no NVLink with anybody."""
        topo = self.topology
        island_of = {g: i for i, island in enumerate(topo.islands) for g in island.gpus}
        islands = set()
        reports = self.reports if ranks is None else [self.reports[r] for r in ranks]
        for r in reports:
            node = topo.hostnames.index(r.host)
            gpu = next((g.index for g in topo.gpus if g.node == node and g.local_index == r.local_rank), None)
            islands.add(island_of.get(gpu) if gpu is not None else None)
        nodes = len({r.host for r in reports})
        where = f"{nodes} nodes" if nodes > 1 else "one node"
        if None in islands or len(islands) > 1:
            joined = "joined by the network" if nodes > 1 else "without NVLink between all of them"
            return "network", f"{len(reports)} ranks on {where} {joined}"
        island = topo.islands[islands.pop()]
        if len(island.nodes) > 1:
            return "domain", f"{len(reports)} ranks in one NVLink domain over {where}"
        return "island", f"{len(reports)} ranks in one NVLink island on {where}"

    def widest_span(self, ep_size: int) -> tuple[str, str]:
        """(kind, text) of the widest of the groups of `ep_size` consecutive ranks
        (:func:`~a2a_tune.tuner.groups.group_ranks`), by where each rank really runs."""
        groups = (self.span(group_ranks(ep_size, g)) for g in range(len(self.reports) // ep_size))
        return max(groups, key=lambda s: FABRICS.index(s[0]))

    def fabrics(self, ep_sizes: Sequence[int]) -> dict[str, str]:
        """EP size (as text: a JSON key) -> what its groups span (the table's ``fabric``): what
        a run on GPUs records, so that select need not assume rank r is the probe's GPU r."""
        return {str(size): self.widest_span(size)[0] for size in ep_sizes}

    def summary(self) -> dict[str, Any]:
        """What the run and its table record about the job's nodes (JSON-able)."""
        span, text = self.span()
        nodes = []
        for host in self.hosts:
            facts = self._node_facts(host)
            ranks = [r.rank for r in self.reports if r.host == host]
            nodes.append({"host": host, "ranks": ranks, "fingerprint": facts.pop("hardware"), **facts})
        out: dict[str, Any] = {"nodes": nodes, "ep_span": span, "ep_span_text": text}
        if mixed := self.mixed():
            out["mixed"] = mixed
        return out


def probe_for_device(device_type: str) -> Topology:
    """The hardware the sweep measures: the GPUs for cuda ranks; the CPU for gloo ranks, even on
    a GPU host -- unless $A2A_TUNE_NVML_RECORDING names a recorded machine: then the gloo ranks
    rehearse that machine's topology (fingerprint, islands, reach, heterogeneity)."""
    return probe() if device_type == "cuda" or env_text(RECORDING_ENV) else cpu_topology()


def library_versions(device_type: str, topology: Topology) -> dict[str, str | None]:
    def dist_version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    nccl = None
    if device_type == "cuda" and torch.cuda.is_available():
        nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
    return {
        "a2a_tune": dist_version("a2a-tune"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "driver": topology.driver_version,
        "triton": dist_version("triton"),
        "flashinfer": flashinfer_version(),  # also a staged copy (scripts/stage_flashinfer.py), no metadata
    }


def gather(ctx: RankContext, topology: Topology, versions: dict[str, str | None]) -> ClusterView:
    """Collective: every rank's report, on every rank."""
    mine = RankReport(ctx.rank, ctx.local_rank, topology.to_dict(), dict(versions))
    reports: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(reports, mine, group=ctx.group)
    return ClusterView.from_reports(reports)


def gather_cluster(ctx: RankContext) -> ClusterView:
    """Collective: every rank's node (its probe, the rank's local rank, its libraries), on every rank."""
    node = probe_for_device(ctx.device.type)
    return gather(ctx, node, library_versions(ctx.device.type, node))


def gather_topology(ctx: RankContext) -> Topology:
    """Collective: every rank's hardware, merged into the job's (its fingerprint names the table)."""
    return gather_cluster(ctx).topology


def check_mixed(view: ClusterView, allow: bool) -> list[str]:
    """The mix lines; raises MixedClusterError (one line, the same on every rank) unless allowed."""
    lines = view.mixed()
    if lines and not allow:
        raise MixedClusterError(
            f"mixed cluster: {' | '.join(lines)}; fix the node(s) or pass --allow-mixed to tune "
            "anyway (the table then records the mix)"
        )
    return lines
