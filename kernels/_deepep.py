"""What the DeepEP backends share: finding DeepEP without importing it, the reasons it cannot
run, and building its communication buffer.

DeepEP (deepseek-ai/DeepEP, the V1 API: `deep_ep.Buffer` with `dispatch`/`combine` and
`low_latency_dispatch`/`low_latency_combine`) is optional and has no wheel that fits every
torch: it is built from source for the GPU's arch (`scripts/stage_deepep.py`, README
"DeepEP") and found on `sys.path`. `availability()` never imports it (its extension links
CUDA and NVSHMEM): it finds the package and its extension module, and reads from the
extension file whether it was built with NVSHMEM (the low-latency kernels need it).

One `deep_ep.Buffer` per backend instance: built (collectively) in the backend's constructor
and destroyed (collectively, `Buffer.destroy`) in `close()`, which every rank calls in turn.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .base import Availability, BackendEnv
from .errors import import_failure

MIN_CAPABILITY = (9, 0)  # the SM90 build (FP8, TMA); an SM80 build has no low-latency kernels
INTRANODE_RANKS = (2, 4, 8)  # the rank counts DeepEP's intranode kernels are instantiated for
NVSHMEM_HOST = b"libnvshmem_host.so"  # what an extension built with NVSHMEM is linked against
STAGE_HINT = "python scripts/stage_deepep.py --source DIR; README 'DeepEP'"


@dataclass(frozen=True)
class DeepEPInstall:
    package: Path  # the deep_ep package folder
    extension: Path | None  # deep_ep_cpp's shared object, None when not built
    nvshmem: bool  # the extension was built with NVSHMEM (internode and low-latency kernels)


def find_deepep() -> DeepEPInstall | None:
    """Where DeepEP is, or None; never imports it."""
    spec = importlib.util.find_spec("deep_ep")
    if spec is None or not spec.submodule_search_locations:
        return None
    ext = importlib.util.find_spec("deep_ep_cpp")
    path = Path(ext.origin) if ext is not None and ext.origin else None
    path = path if path is not None and path.is_file() else None
    return DeepEPInstall(Path(next(iter(spec.submodule_search_locations))), path, path is not None and _links(path))


def _links(path: Path) -> bool:
    stat = path.stat()
    return _links_nvshmem(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _links_nvshmem(path: str, _mtime: int, _size: int) -> bool:
    """Whether the shared object names NVSHMEM's host library (a DT_NEEDED string)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(NVSHMEM_HOST) >= 0


def nvshmem_library() -> Path | None:
    """NVSHMEM's host library where the loader or DeepEP's build would find it, or None:
    `$NVSHMEM_DIR/lib`, the nvidia-nvshmem wheel, then `$LD_LIBRARY_PATH`."""
    dirs = [Path(os.environ["NVSHMEM_DIR"]) / "lib"] if os.environ.get("NVSHMEM_DIR") else []
    try:
        spec = importlib.util.find_spec("nvidia.nvshmem")
    except ImportError:  # no `nvidia` namespace at all
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(d) / "lib" for d in spec.submodule_search_locations]
    dirs += [Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for d in dirs:
        found = sorted(d.glob("libnvshmem_host.so*")) if d.is_dir() else []
        if found:
            return found[0]
    return None


def deepep_availability(env: BackendEnv, *, low_latency: bool) -> Availability:
    """Whether DeepEP's high-throughput (intranode) or low-latency kernels can run in `env`."""
    if env.device_type != "cuda":
        return Availability(False, env.needs_cuda("DeepEP"))
    install = find_deepep()
    if install is None:
        return Availability(False, f"deep_ep not installed (build it from source: {STAGE_HINT})")
    if install.extension is None:
        return Availability(False, f"deep_ep found at {install.package} but not its extension deep_ep_cpp (not built?)")
    if low_latency and not install.nvshmem:
        return Availability(False, "DeepEP was built without NVSHMEM: its low-latency kernels are disabled")
    if install.nvshmem and nvshmem_library() is None:
        return Availability(
            False, "NVSHMEM missing: deep_ep_cpp needs libnvshmem_host (pip install nvidia-nvshmem-cu13)"
        )
    cc = env.compute_capability
    if cc is not None and tuple(cc) < MIN_CAPABILITY:
        return Availability(False, f"DeepEP needs compute capability >= 9.0 (its SM90 build), found {cc[0]}.{cc[1]}")
    w = env.world_size
    if w < 2:  # what one rank does, seen on an H200 (BENCHMARKS.md, "The peers at one rank")
        seen = "low-latency kernels run at one rank, exchanging nothing" if low_latency else "refuses one rank"
        return Availability(False, f"needs at least 2 ranks (DeepEP's {seen})")
    if not low_latency and w not in INTRANODE_RANKS:
        more = " (more ranks need its internode RDMA kernels, not wrapped here)" if w > max(INTRANODE_RANKS) else ""
        return Availability(False, f"DeepEP's intranode kernels run 2, 4 or 8 ranks, not {w}{more}")
    if not env.peer_access:
        return Availability(False, "no NVLink peer access between every pair of GPUs (DeepEP needs one NVLink island)")
    return Availability(True)


def import_deepep() -> ModuleType:
    """`deep_ep`, imported on first use; an import failure is one line."""
    try:
        return importlib.import_module("deep_ep")
    except Exception as exc:  # noqa: BLE001 - a missing symbol, a missing NVSHMEM library...
        raise import_failure("deep_ep", exc) from exc


def world_group(group):
    """DeepEP needs a ProcessGroup object; the contract's None means the default group."""
    import torch.distributed as dist

    return group if group is not None else dist.group.WORLD
