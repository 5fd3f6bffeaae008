"""Out-of-tree backends whose classmethods misbehave before any case starts (issue 31.2): the
sweep, `backends` and `check` must name them in one line and go on without them.

Imported through A2A_TUNE_BACKEND_MODULES=unruly_backends (tests/support on the path).
"""

from __future__ import annotations

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv


@register_backend
class AvailabilityRaises(NcclAll2Allv):
    name = "planted_availability_raises"

    @classmethod
    def availability(cls, env):
        raise RuntimeError("planted: probing the fabric failed")


@register_backend
class AvailabilityBlocks(NcclAll2Allv):
    """availability() waits on something that never answers (a lock, a socket, a device)."""

    name = "planted_availability_blocks"

    @classmethod
    def availability(cls, env):
        import time

        time.sleep(3600)


@register_backend
class FeasibilityRaises(NcclAll2Allv):
    name = "planted_feasibility_raises"

    @classmethod
    def feasibility(cls, shape, world_size):
        raise ZeroDivisionError("planted: division by zero")


@register_backend
class AvailabilityNonsense(NcclAll2Allv):
    """Returns a bare bool instead of (ok, reason)."""

    name = "planted_availability_nonsense"

    @classmethod
    def availability(cls, env):
        return True
