"""a2a_tune.kernels: the all2all backends, their contract, and the reference semantics.

Layering (docs/architecture.md; tests/test_layout.py checks it): this package imports
a2a_tune.tuner.runtime (the standard-library foundation) and nothing else of a2a_tune:

    __init__            public API: MoEShape, list_backends, get_backend, ...
      registry              @register_backend, list_backends, get_backend, engine_names
      <backend>.py          one file per backend, registered on import
        _wire               metadata packing + collective wrappers (the torch.distributed backends)
        _flashinfer         FlashInfer found without importing it; its MNNVL setup (flashinfer_*.py)
        _deepep             DeepEP found without importing it, why it cannot run (deepep_*.py)
        nccl_ep             NCCL EP; the NCCL >= 2.30 check it shares with deepep_v2 (DeepEP V2)
        _symmetric_backend  driver of the NVLink backends (workspace rendezvous, quantize, send, receive)
          _one_sided_kernels / _low_latency_kernels   their Triton kernels, one host API
            _nvlink_common  geometry, workspace layout, per-rank state, flag/epoch helpers, launchers
        base                the contract (read its docstring first), MoEShape, BackendEnv, Dispatched
          errors            typed one-line errors
    quant                   block-FP8 quantization of payloads
    reference               plain-torch inputs, expert compute and the invariant check (CPU-capable)
    virtual                 W ranks of a symmetric-memory backend in one process on one device,
                            run phase by phase (reference's checks over all of them)

Backends are imported here so that registration happens once; a backend module must not
import optional packages (FlashInfer, DeepEP...) at import time: `availability()` looks.
"""

from .base import PAYLOADS, All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape
from .errors import KernelsError, KnobError, ShapeError, UnknownBackendError
from .registry import availability_of, engine_names, feasibility_of, get_backend, list_backends, register_backend

# isort: off
# Registration order is the tie-break preference: simplest / the engines' default first, then
# what engines already ship (FlashInfer), then our own kernels, then DeepEP and torch's NVSHMEM
# all-to-all (optional builds, added later).
from . import allgather_reducescatter as _allgather_reducescatter  # noqa: E402,F401
from . import nccl_all2allv as _nccl_all2allv  # noqa: E402,F401
from . import flashinfer_nvlink_one_sided as _flashinfer_one_sided  # noqa: E402,F401
from . import flashinfer_nvlink_two_sided as _flashinfer_two_sided  # noqa: E402,F401
from . import nvlink_one_sided as _nvlink_one_sided  # noqa: E402,F401
from . import nvlink_low_latency as _nvlink_low_latency  # noqa: E402,F401
from . import deepep_high_throughput as _deepep_high_throughput  # noqa: E402,F401
from . import deepep_low_latency as _deepep_low_latency  # noqa: E402,F401
from . import torch_nvshmem_all2all as _torch_nvshmem_all2all  # noqa: E402,F401
from . import nccl_ep as _nccl_ep  # noqa: E402,F401
from . import deepep_v2 as _deepep_v2  # noqa: E402,F401
# isort: on

__all__ = [
    "All2AllBackend",
    "Availability",
    "BackendEnv",
    "Dispatched",
    "KernelsError",
    "KnobError",
    "MoEShape",
    "PAYLOADS",
    "ShapeError",
    "UnknownBackendError",
    "availability_of",
    "engine_names",
    "feasibility_of",
    "get_backend",
    "list_backends",
    "register_backend",
]
