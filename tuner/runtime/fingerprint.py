"""Hardware fingerprints as keys: canonical form, and which fingerprints may share a table.

The grammar is the probe's (:mod:`a2a_tune.tuner.probe`, module docstring)::

    <sku>.<interconnect>.<nodes>        e.g. h200.nvl18x2.node1, gb200.mnnvl18x16.nodes4
    cpu-<machine>.<nodes>               e.g. cpu-x86_64.node1

Standard library only (the runtime lookup imports it).

Levels lookup searches, in this order, when asked for this machine's fingerprint:

1. ``exact``: ``<fingerprint>.json``.
2. ``cluster``: the table of a multi-node job this node took part in: the job wrote it on
   every node, with a pointer ``<node fingerprint>.cluster`` naming the cluster's
   fingerprint (``gb200.nvl18x4.node1`` -> ``gb200.mnnvl18x8.nodes2``).
3. ``same-gpu-domain``: a table whose fingerprint has the same ``<sku>`` (GPU models) and
   the same ``<interconnect>`` -- NVLink island kind, links per GPU, island size (the
   NVLink domain size), island count and health -- and differs only in ``<nodes>``,
   i.e. ``h200.nvl18x2.*``. A table's entries are keyed by EP size, so a table measured
   on one node answers for EP sizes inside one NVLink domain on a multi-node cluster of
   the same machines. A degraded machine never borrows a healthy machine's table or the
   other way round (``-degraded`` is part of the interconnect), and CPU fingerprints have
   no NVLink domain: exact only.
4. ``engine-default``: no table; the engine keeps its own default.

Of the tables found, lookup takes the first with an entry for the requested EP size and
dtype (else the first, whose answer then says what it lacks): a node's own table answers the
EP sizes inside the node, its cluster's table the EP sizes across nodes.
"""

from __future__ import annotations

import re

__all__ = [
    "HW_EXACT",
    "HW_CLUSTER",
    "HW_SAME_DOMAIN",
    "HW_DEFAULT",
    "domain_key",
    "node_count",
    "normalize_fingerprint",
]

HW_EXACT = "exact"
HW_CLUSTER = "cluster"
HW_SAME_DOMAIN = "same-gpu-domain"
HW_DEFAULT = "engine-default"

# Lowercase letters, digits, '.', '_', '-', '+' (the probe joins GPU models and island
# shapes with '+'); must start with a letter or digit so a fingerprint can never name a
# hidden file, '.' or '..'.
_FINGERPRINT_RE = re.compile(r"[a-z0-9][a-z0-9._+-]{0,199}\Z")
_NODES_RE = re.compile(r"node1|nodes([1-9][0-9]*)\Z")
_PART_RE = re.compile(r"(?:(?:nvl|mnnvl)[0-9]+x[0-9]+(?:x[0-9]+)?|pciex[0-9]+)\Z")


def normalize_fingerprint(fingerprint: str) -> str:
    """Return the canonical (lowercase) fingerprint or raise ``ValueError``.

    Case is folded; any character outside ``[a-z0-9._+-]`` is rejected rather than
    rewritten, so two different fingerprints can never share one file.
    """
    if not isinstance(fingerprint, str):
        raise ValueError(f"hardware fingerprint must be a string, got {type(fingerprint).__name__}")
    norm = fingerprint.strip().lower()
    if not _FINGERPRINT_RE.match(norm):
        raise ValueError(
            f"invalid hardware fingerprint {fingerprint!r}: use 1-200 characters "
            "[a-z0-9._+-], starting with a letter or digit"
        )
    return norm


def node_count(fingerprint: str) -> int | None:
    """The ``<nodes>`` part as a number (``node1`` -> 1, ``nodes4`` -> 4), or None."""
    m = _NODES_RE.match(fingerprint.rsplit(".", 1)[-1])
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else 1


def domain_key(fingerprint: str) -> tuple | None:
    """(sku, interconnect) of a GPU fingerprint with at least one NVLink island, else None.

    Two fingerprints with the same key may share a table (level ``same-gpu-domain``).
    """
    parts = fingerprint.rsplit(".", 2)
    if len(parts) != 3 or node_count(fingerprint) is None:
        return None
    sku, interconnect, _ = parts
    if not sku or sku.startswith("cpu-"):
        return None
    body = interconnect[: -len("-degraded")] if interconnect.endswith("-degraded") else interconnect
    islands = body.split("+")
    if not all(_PART_RE.match(p) for p in islands) or not any(p.startswith(("nvl", "mnnvl")) for p in islands):
        return None
    return sku, interconnect
