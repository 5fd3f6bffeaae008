"""Backends that declare a narrow reach but run anywhere gloo does, so a CPU job can show which
EP groups leave them (imported through A2A_TUNE_BACKEND_MODULES=reach_backends)."""

from __future__ import annotations

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv


@register_backend
class IslandOnly(NcclAll2Allv):
    """Stands for a CUDA IPC backend: one NVLink island on one node."""

    name = "planted_island_reach"
    reach = "island"


@register_backend
class DomainOnly(NcclAll2Allv):
    """Stands for a fabric-memory backend: one NVLink domain, also across nodes."""

    name = "planted_domain_reach"
    reach = "domain"
