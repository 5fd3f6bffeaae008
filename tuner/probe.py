"""Topology probe: NVML answers -> facts about GPUs and NVLink (:mod:`a2a_tune.tuner.topology`,
which also names them with the hardware fingerprint).

The selection tables are keyed by hardware, so the probe must say *which* hardware this is
in a form that is stable (same machine model -> same key), human-readable (ops read it in
file names and reports) and honest about health (a node with a dead NVLink must not borrow
the table of a healthy one). The probe never raises: without NVML it reports a CPU host.

Flow: :func:`probe` records the raw answers of an :class:`~a2a_tune.tuner.nvml.NvmlSource`
(:func:`~a2a_tune.tuner.nvml.record`) and :func:`topology_from_record` interprets them, so a
recorded fixture takes exactly the path a live machine takes. ``$A2A_TUNE_NVML_RECORDING``
(a file written by ``a2a-tune probe --record``) makes every probe of the process, and of the
processes it starts, replay that recording instead of the live NVML: each node of a test job
sees its own machine, and an operator can rehearse a cluster's topology on CPU ranks. :func:`merge_nodes` combines
per-node topologies into the cluster view; :func:`render_summary` draws one for humans.

Interpretation rules:

- A link index whose state query answers InvalidArgument / NotSupported / NotFound is *not
  present* (GB200 answers InvalidArgument for indices >= 18; PCIe GPUs answer NotSupported
  for all). A present link answering active=False is inactive; other errors leave it unknown.

Design notes: docs/architecture.md, "Module notes", `tuner/probe.py`.
"""

from __future__ import annotations

import logging
import platform
import re
import socket
import sys
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from a2a_tune.tuner.nvml import NvmlQueryError, NvmlSource, record, record_live
from a2a_tune.tuner.runtime.environ import env_text
from a2a_tune.tuner.runtime.fingerprint import RECORDING_ENV
from a2a_tune.tuner.runtime.text import one_line, quoted
from a2a_tune.tuner.topology import (
    TOPOLOGY_SCHEMA,
    DegradedGpu,
    FabricDomain,
    FabricFacts,
    GpuFacts,
    Island,
    LinkFacts,
    NvlinkPair,
    Topology,
    build_topology,
    sku_slug,
)

__all__ = [
    "RECORDING_ENV",
    "TOPOLOGY_SCHEMA",
    "DegradedGpu",
    "FabricDomain",
    "FabricFacts",
    "GpuFacts",
    "Island",
    "LinkFacts",
    "NvlinkPair",
    "Topology",
    "build_topology",
    "cpu_topology",
    "island_lines",
    "merge_nodes",
    "normalise_bus_id",
    "probe",
    "recorded_source",
    "render_summary",
    "sku_slug",
    "topology_from_record",
]

_log = logging.getLogger("a2a_tune")

# Link-state answers that mean "this index has no link", not "this link is down".
_ABSENT_LINK_ERRORS = frozenset({"InvalidArgument", "NotSupported", "NotFound", "NotRecorded"})


# ---------------------------------------------------------------------------------------
# Probing
# ---------------------------------------------------------------------------------------


def probe(
    source: NvmlSource | None = None,
    *,
    hostname: str | None = None,
    timeout_s: float = 60.0,
    strict: bool = False,
) -> Topology:
    """Probe this node (or ``source``); never raises unless ``strict``.

    With ``source`` None the live NVML is used (or the recording ``$A2A_TUNE_NVML_RECORDING``
    names), in a child process given ``timeout_s`` seconds; when NVML cannot start (no
    library, no driver) the result is a CPU-only topology. Another failure (the child crashed
    or hung) is logged and also reported as CPU-only -- or, with ``strict``, raised as
    :class:`~a2a_tune.tuner.nvml.NvmlQueryError` (the runtime lookup: a GPU host must not
    borrow a CPU fingerprint). ``hostname`` overrides the host name the source reports (e.g.
    the name the launcher uses).
    """
    if source is None:
        source = recorded_source()
    try:
        # The live library is read in a child process: a crash inside NVML must not take
        # the sweep or an engine's start-up with it.
        raw = record_live(timeout_s) if source is None else record(source)
    except NvmlQueryError as exc:
        if exc.code_name not in _NO_NVML_CODES:
            if strict:
                raise
            _log.warning("NVML probe failed (%s); reporting this host as CPU-only", exc)
        return cpu_topology(hostname=hostname)
    return topology_from_record(raw, hostname=hostname)


def recorded_source() -> NvmlSource | None:
    """The recording ``$A2A_TUNE_NVML_RECORDING`` names, or None (unset, or unreadable: then
    a warning, and the live NVML answers)."""
    path = env_text(RECORDING_ENV)
    if path is None:
        return None
    from a2a_tune.tuner.nvml import RecordedNvml

    try:
        return RecordedNvml(path)
    except (OSError, ValueError) as exc:
        _log.warning(
            "%s=%s cannot be replayed (%s); probing the live NVML", RECORDING_ENV, quoted(path, 200), one_line(exc, 300)
        )
        return None


# NVML answers that just mean "no NVIDIA GPU here": not worth a warning.
_NO_NVML_CODES = frozenset({"LibraryNotFound", "DriverNotLoaded", "NoPermission", "Uninitialized", "NotFound"})


def cpu_topology(*, hostname: str | None = None, machine: str | None = None) -> Topology:
    """The topology of a host without usable GPUs: fingerprint ``cpu-<machine>.node1``."""
    return build_topology(
        [],
        hostnames=[hostname or socket.gethostname()],
        driver_versions=[None],
        machine=machine or platform.machine(),
    )


def _answer(raw: Any) -> Any:
    """A recorded answer, or None where the recording holds an error."""
    return None if isinstance(raw, dict) and set(raw) == {"error"} else raw


def normalise_bus_id(bus_id: str | None) -> str | None:
    """NVML bus ids in one spelling, ``DDDDDDDD:BB:DD.F`` upper-case hex.

    Remote PCI info and device PCI info are compared to find direct GPU-GPU links; older
    drivers write the domain with 4 digits (the legacy field), newer ones with 8.
    """
    if bus_id is None:
        return None
    match = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*", bus_id)
    if not match:
        return bus_id.strip().upper() or None
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def _link_from_record(index: int, raw: dict[str, Any]) -> LinkFacts | None:
    state = raw.get("state")
    if isinstance(state, dict) and set(state) == {"error"}:
        if state["error"] in _ABSENT_LINK_ERRORS:
            return None
        active: bool | None = None
    else:
        active = bool(state)
    speed = _answer(raw.get("speed_mbps"))
    version = _answer(raw.get("version"))
    return LinkFacts(
        index=index,
        active=active,
        version=None if version is None else int(version),
        remote_bus_id=normalise_bus_id(_answer(raw.get("remote_pci_bus_id"))),
        remote_type=_answer(raw.get("remote_device_type")),
        speed_mbps=int(speed) if speed else None,
    )


def _fabric_from_record(raw: Any) -> FabricFacts | None:
    info = _answer(raw)
    if not isinstance(info, dict):
        return None
    return FabricFacts(
        cluster_uuid=info.get("cluster_uuid"),
        clique_id=info.get("clique_id"),
        state=info.get("state"),
        status=info.get("status"),
    )


def _gpu_from_record(raw: dict[str, Any], *, index: int, node: int) -> GpuFacts:
    name = _answer(raw.get("name"))
    cc = _answer(raw.get("compute_capability"))
    links = [_link_from_record(i, link) for i, link in enumerate(raw.get("nvlinks", []))]
    pcie = _answer(raw.get("pcie_link"))
    pcie = tuple(pcie) if isinstance(pcie, list) and len(pcie) == 2 and all(isinstance(v, int) for v in pcie) else None
    return GpuFacts(
        index=index,
        node=node,
        local_index=int(raw.get("index", index)),
        name=name,
        sku=sku_slug(name),
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
        memory_total_bytes=_answer(raw.get("memory_total_bytes")),
        pci_bus_id=normalise_bus_id(_answer(raw.get("pci_bus_id"))),
        uuid=_answer(raw.get("uuid")),
        links=tuple(link for link in links if link is not None),
        fabric=_fabric_from_record(raw.get("fabric_info")),
        pcie_generation=pcie[0] if pcie else None,
        pcie_width=pcie[1] if pcie else None,
    )


def topology_from_record(recording: dict[str, Any], *, hostname: str | None = None) -> Topology:
    """Interpret one node's recording (see :mod:`a2a_tune.tuner.nvml`) as a Topology."""
    host = hostname or _answer(recording.get("hostname")) or socket.gethostname()
    machine = _answer(recording.get("machine")) or platform.machine()
    gpus = [_gpu_from_record(raw, index=i, node=0) for i, raw in enumerate(recording.get("devices", []))]
    return build_topology(
        gpus,
        hostnames=[host],
        driver_versions=[_answer(recording.get("driver_version"))],
        machine=machine,
    )


def merge_nodes(topologies: Iterable[Topology]) -> Topology:
    """The cluster view from per-node topologies (each node probes itself, rank 0 merges).

    Nodes are identified by hostname: a host reported twice (several ranks per node) counts
    once. Nodes are ordered by hostname so the result does not depend on rank order.
    """
    nodes: dict[str, tuple[str | None, list[GpuFacts], str]] = {}
    for topo in topologies:
        for ordinal, host in enumerate(topo.hostnames):
            if host in nodes:
                continue
            driver = topo.driver_versions[ordinal] if ordinal < len(topo.driver_versions) else None
            gpus = [g for g in topo.gpus if g.node == ordinal]
            nodes[host] = (driver, gpus, topo.machine)
    if not nodes:
        raise ValueError("merge_nodes needs at least one topology")
    hostnames = sorted(nodes)
    merged: list[GpuFacts] = []
    for ordinal, host in enumerate(hostnames):
        for gpu in sorted(nodes[host][1], key=lambda g: g.local_index):
            merged.append(replace(gpu, index=len(merged), node=ordinal))
    machines = sorted({nodes[h][2] for h in hostnames})
    return build_topology(
        merged,
        hostnames=hostnames,
        driver_versions=[nodes[h][0] for h in hostnames],
        machine="+".join(machines),
    )


# ---------------------------------------------------------------------------------------
# Rendering (kept apart from probing: rich is imported only here)
# ---------------------------------------------------------------------------------------


def _gbps(mbps: float) -> str:
    """MB/s as GB/s the way nvidia-smi prints link speeds: 26562 -> "26.562"."""
    return f"{mbps / 1000:.3f}".rstrip("0").rstrip(".")


def _gpu_span(indices: Iterable[int]) -> str:
    """GPU0-7 for a contiguous run, else GPU0,GPU2,..."""
    ordered = sorted(indices)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"GPU{ordered[0]}-{ordered[-1]}"
    return ",".join(f"GPU{i}" for i in ordered)


def island_lines(topo: Topology) -> list[str]:
    """One line per direct pair / switch island, with link count, speed and bandwidth."""
    lines = []
    for island in topo.islands:
        if island.via_switch:
            links = island.links_per_gpu
            where = f" over {len(island.nodes)} nodes" if len(island.nodes) > 1 else ""
            line = f"{_gpu_span(island.gpus)} via NVSwitch{where}: {links} links/GPU"
            if island.speed_mbps:
                line += f" x {_gbps(island.speed_mbps)} GB/s = {round(links * island.speed_mbps / 1000)} GB/s per GPU"
            lines.append(line)
        for pair in island.direct_pairs:
            line = f"GPU{pair.a}<->GPU{pair.b}: {pair.links} links"
            if pair.speed_mbps:
                line += f" x {_gbps(pair.speed_mbps)} GB/s = {round(pair.links * pair.speed_mbps / 1000)} GB/s"
            lines.append(line)
    return lines


def _shown(text: str) -> str:
    """``text`` from the machine (host names, GPU names, bus ids) through the one escaping
    function, line by line: a terminal escape in a host name is shown, never obeyed."""
    return "\n".join(one_line(line, None) for line in str(text).split("\n"))


def render_summary(topo: Topology) -> Any:
    """A rich renderable (Group of tables and lines) describing ``topo`` for humans."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    multi_node = topo.node_count > 1
    gpu_table = Table(title="GPUs", title_justify="left")
    if multi_node:
        gpu_table.add_column("node")
    for column in ("GPU", "name", "memory GiB", "CC", "bus id", "active links"):
        gpu_table.add_column(column, justify="right" if column in ("GPU", "memory GiB") else "left")
    for gpu in topo.gpus:
        memory = "?" if gpu.memory_total_bytes is None else f"{gpu.memory_total_bytes / 2**30:.1f}"
        cc = "?" if gpu.compute_capability is None else "{}.{}".format(*gpu.compute_capability)
        row = [
            str(gpu.index),
            gpu.name or "?",
            memory,
            cc,
            gpu.pci_bus_id or "?",
            f"{len(gpu.active_links)}/{len(gpu.links)}" if gpu.links else "-",
        ]
        cells = ([topo.hostnames[gpu.node]] if multi_node else []) + row
        gpu_table.add_row(*(Text(_shown(cell)) for cell in cells))  # Text: no markup/emoji (":AB:")

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()

    def add_fact(label: str, value: str) -> None:
        facts.add_row(label, Text(_shown(value)))  # Text: host names and bus ids are not markup

    add_fact("fingerprint", topo.fingerprint)
    add_fact("facts hash", topo.facts_hash)
    add_fact("nodes", f"{topo.node_count} ({', '.join(topo.hostnames)})")
    add_fact("driver", ", ".join(sorted({d or "?" for d in topo.driver_versions})))
    add_fact("NVLink islands", "\n".join(island_lines(topo)) or "none")
    domains = [
        f"cluster {d.cluster_uuid} clique {d.clique_id}: {len(d.gpus)} GPUs on {len(d.nodes)} node(s)"
        for d in topo.fabric_domains
    ]
    add_fact("fabric domain", "\n".join(domains) or "none")
    degraded = [
        f"GPU{d.gpu}: {d.active_links}/{d.expected_links} links active; down: "
        + (", ".join(str(link) for link in d.down_links) or "not reported")
        for d in topo.degraded
    ]
    add_fact("degraded", "\n".join(degraded) or "none")
    pcie = ", ".join(f"GPU{a}-GPU{b}" for a, b in topo.pcie_only_pairs)
    add_fact("PCIe-only pairs", pcie or "none")

    parts: list[Any] = [Text(f"a2a-tune topology: {topo.fingerprint}", style="bold")]
    if topo.gpus:
        parts.append(gpu_table)
    parts.append(facts)
    return Group(*parts)


def _main(argv: list[str]) -> int:
    """``python -m a2a_tune.tuner.probe --fingerprint``: the fingerprint on stdout, else one line on
    stderr and exit code 1. The runtime runs it as a bounded child
    (:func:`~a2a_tune.tuner.runtime.fingerprint.probed_fingerprint`), so NVML is read right here."""
    from a2a_tune.tuner.nvml import RealNvml

    if argv != ["--fingerprint"]:
        print("usage: python -m a2a_tune.tuner.probe --fingerprint", file=sys.stderr)
        return 2
    try:
        print(probe(recorded_source() or RealNvml(), strict=True).fingerprint)
    except Exception as exc:  # strict: a GPU host must not borrow a CPU fingerprint
        print(one_line(exc, None), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
