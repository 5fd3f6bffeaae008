"""The job's view of its nodes: where each rank runs, whether the nodes match, how far the EP
group reaches, and the table on every node.

Every rank probes its own node (``probe_for_device``) and reports it with its local rank and
library versions; :func:`gather` collects the reports on every rank (one ``all_gather_object``),
so every rank takes the same decisions from the same data without further collectives:

* the cluster's topology (:func:`~a2a_tune.tuner.probe.merge_nodes`): its fingerprint names one
  NVLink domain spanning nodes (``gb200.mnnvl18x8.nodes2``) or islands joined by the network
  (``h200.nvl18x2.nodes2``);
* :meth:`ClusterView.mixed`: one line per node whose hardware (GPU model, NVLink shape and
  health, as its own fingerprint says), driver, NCCL, CUDA, torch or FlashInfer differs from
  the others'. The sweep refuses such a job before any timing unless told to tune it anyway
  (``--allow-mixed``), and then the run and its table record the mix;
* :meth:`ClusterView.span`: what joins the EP group's ranks (one NVLink island, one NVLink
  domain across nodes, or the network), compared with each backend's ``reach``
  (``a2a_tune.kernels.base``): a backend the group leaves is not applicable, with the reason;
* :func:`publish`: after a completed run, rank 0 builds the table and every node writes it
  where ``lookup`` looks on that node, with a pointer from the node's own fingerprint to the
  cluster's (:data:`~a2a_tune.tuner.runtime.profiles.CLUSTER_POINTER_SUFFIX`), so an engine
  on any node, probing only its own node, finds the cluster's table.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .launch import RankContext, one_line
from .probe import Topology, merge_nodes

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

    def span(self) -> tuple[str, str]:
        """(kind, text): what joins every rank of the job (the EP group), kind one of
        ``a2a_tune.kernels.base.SPANS``. A rank's GPU is the one at its local rank on its node;
        a rank without one (CPU ranks) shares no NVLink with anybody."""
        topo = self.topology
        island_of = {g: i for i, island in enumerate(topo.islands) for g in island.gpus}
        islands = set()
        for r in self.reports:
            node = topo.hostnames.index(r.host)
            gpu = next((g.index for g in topo.gpus if g.node == node and g.local_index == r.local_rank), None)
            islands.add(island_of.get(gpu) if gpu is not None else None)
        nodes = len(self.hosts)
        where = f"{nodes} nodes" if nodes > 1 else "one node"
        if None in islands or len(islands) > 1:
            joined = "joined by the network" if nodes > 1 else "without NVLink between all of them"
            return "network", f"{len(self.reports)} ranks on {where} {joined}"
        island = topo.islands[islands.pop()]
        if len(island.nodes) > 1:
            return "domain", f"{len(self.reports)} ranks in one NVLink domain over {where}"
        return "island", f"{len(self.reports)} ranks in one NVLink island on {where}"

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


def gather(ctx: RankContext, topology: Topology, versions: dict[str, str | None]) -> ClusterView:
    """Collective: every rank's report, on every rank."""
    mine = RankReport(ctx.rank, ctx.local_rank, topology.to_dict(), dict(versions))
    reports: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(reports, mine, group=ctx.group)
    return ClusterView.from_reports(reports)


def check_mixed(view: ClusterView, allow: bool) -> list[str]:
    """The mix lines; raises MixedClusterError (one line, the same on every rank) unless allowed."""
    lines = view.mixed()
    if lines and not allow:
        raise MixedClusterError(
            f"mixed cluster: {' | '.join(lines)}; fix the node(s) or pass --allow-mixed to tune "
            "anyway (the table then records the mix)"
        )
    return lines


# ---------------------------------------------------------------------------- the table everywhere


def table_dir(out_dir: str | None) -> Path:
    """Where this node writes tables: `out_dir`, else the first $A2A_TUNE_PROFILE_DIR entry,
    else the user's profile directory (both searched by lookup on this node)."""
    from .runtime.profiles import PROFILE_DIR_ENV, user_profile_dir

    first = os.environ.get(PROFILE_DIR_ENV, "").split(os.pathsep)[0]
    return Path(out_dir or first or user_profile_dir()).expanduser()


def write_node_table(profile: dict, directory: Path, node_fingerprint: str) -> Path:
    """Write `profile` into `directory` and, when it is a cluster's table (another fingerprint
    than this node's own), point this node's fingerprint at it for lookup."""
    from .runtime.profiles import add_cluster_pointer
    from .select import write_profile

    path = write_profile(profile, directory)
    cluster = profile["hardware"]["fingerprint"]
    if cluster != node_fingerprint:
        add_cluster_pointer(directory, node_fingerprint, cluster)
    return path


def publish(ctx: RankContext, db_url: str | None, run_id: int, out_dir: str | None, view: ClusterView) -> dict:
    """Collective, after a completed run: rank 0 builds the table from the store, every node
    (its local rank 0) writes it. Returns, on every rank: {"tables": host -> path written,
    "errors": host -> why not, "entries": shapes in the table, "kept_knobs", "note"}."""
    from .select import profile_for_run

    payload: list[Any] = [None]
    if ctx.rank == 0:
        try:
            profile, kept, note = profile_for_run(db_url, run_id)
            payload[0] = {"profile": profile, "kept": kept, "note": note}
        except Exception as exc:  # every rank must learn of it, or they wait forever
            payload[0] = {"error": one_line(exc)}
    dist.broadcast_object_list(payload, src=0, group=ctx.group)
    built = payload[0]
    answer = None  # (written?, path or reason), from the ranks that write
    if "error" in built:
        answer = (False, built["error"])
    elif ctx.local_rank == 0:
        node = Topology.from_dict(view.reports[ctx.rank].topology).fingerprint
        try:
            answer = (True, str(write_node_table(built["profile"], table_dir(out_dir), node)))
        except Exception as exc:
            answer = (False, one_line(exc))
    answers: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(answers, answer, group=ctx.group)
    mine = [(view.reports[r].host, a) for r, a in enumerate(answers) if a is not None]
    return {
        "tables": {host: text for host, (ok, text) in mine if ok},
        "errors": {host: text for host, (ok, text) in mine if not ok},
        "entries": len(built.get("profile", {}).get("entries", [])),
        "kept_knobs": built.get("kept", 0),
        "note": built.get("note"),
    }
