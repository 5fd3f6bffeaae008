"""One way to plant a misbehaving out-of-tree backend: a registered NcclAll2Allv (correct on
gloo ranks) of which a few members are replaced, so each planted module says only what is
wrong with its backends."""

from __future__ import annotations

from typing import Any

from a2a_tune.kernels import register_backend
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv


def planted_backend(name: str, doc: str, **members: Any) -> type[NcclAll2Allv]:
    """Register NcclAll2Allv as `name`, `members` (methods, classmethods, attributes) replaced."""
    return register_backend(type(name, (NcclAll2Allv,), {"name": name, "__doc__": doc, **members}))
