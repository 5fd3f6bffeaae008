"""What the FlashInfer backends share: finding FlashInfer without importing it, the lazy
import of its all2all modules, and the MNNVL setup over torch.distributed.

FlashInfer is optional (`pip install 'a2a-tune[flashinfer]'`). Importing it costs seconds
(its package imports every kernel family), so nothing here imports it before a backend is
constructed: `availability()` reads the installed version from package metadata or, for a
trimmed copy staged by `scripts/stage_flashinfer.py`, from `flashinfer/version.py`.

Both backends use FlashInfer's `flashinfer.comm` classes, present in 0.6.x and 0.7.x (0.7.1
deprecates them in favour of `flashinfer.moe_ep`, whose NVLink classes still wrap them):
one-sided `MoeAlltoAll`, two-sided `MnnvlMoe`. Their peer memory is exchanged over a
torch.distributed communicator (no MPI); on one node without multi-node NVLink fabric,
FlashInfer >= 0.6.16 passes POSIX file descriptors (GB200 NVL72 uses fabric handles).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import warnings
from pathlib import Path
from types import ModuleType

from .base import Availability, BackendEnv
from .errors import KernelsError

MIN_VERSION = (0, 6, 16)  # first release whose MNNVL memory runs without fabric (POSIX fds)
MIN_CAPABILITY = (9, 0)  # the TensorRT-LLM kernels it builds target Hopper and newer


def flashinfer_version() -> str | None:
    """The installed FlashInfer version, or None; never imports flashinfer."""
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    for source in ("_build_meta.py", "version.py"):  # 0.7.x writes the version into _build_meta
        path = package / source
        found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", path.read_text()) if path.is_file() else None
        if found:
            return found.group(1)
    return "unknown"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def flashinfer_availability(env: BackendEnv) -> Availability:
    """Whether FlashInfer's NVLink all2all can run in `env`; the reason names what is missing."""
    if env.device_type != "cuda":
        return Availability(False, env.needs_cuda("FlashInfer's NVLink kernels"))
    version = flashinfer_version()
    if version is None:
        return Availability(False, "flashinfer not installed (pip install 'a2a-tune[flashinfer]')")
    if version != "unknown" and _release(version) < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return Availability(False, f"flashinfer {version} is too old (needs >= {need} for single-node NVLink)")
    if env.compute_capability is not None and tuple(env.compute_capability) < MIN_CAPABILITY:
        cc = ".".join(map(str, env.compute_capability))
        return Availability(False, f"FlashInfer's NVLink all2all needs compute capability >= 9.0, found {cc}")
    if env.world_size > 1 and not env.peer_access:
        return Availability(False, "needs peer access between every pair of GPUs (one NVLink island)")
    if importlib.util.find_spec("cuda") is None:
        return Availability(False, "cuda-python not installed (FlashInfer's MNNVL memory needs cuda.bindings)")
    return Availability(True)


def comm_module(name: str) -> ModuleType:
    """`flashinfer.comm.<name>`, imported on first use; an import failure is one line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 0.7.1+: MoeAlltoAll, MnnvlMoe
            return importlib.import_module(f"flashinfer.comm.{name}")
    except Exception as exc:  # noqa: BLE001 - FlashInfer's import can fail in many ways
        raise KernelsError(f"cannot import flashinfer.comm.{name}: {type(exc).__name__}: {exc}") from exc


def ep_mapping(group, rank: int, world_size: int):
    """(Mapping, MnnvlConfig) of a pure expert-parallel group of `world_size` ranks on one node,
    exchanging memory handles over torch.distributed `group`."""
    mapping_mod, mnnvl = comm_module("mapping"), comm_module("mnnvl")
    # 0.7.x keeps the torch.distributed adapter in comm_backend; earlier releases in mnnvl.
    adapter = getattr(mnnvl, "TorchDistBackend", None) or comm_module("comm_backend").TorchDistBackend
    backend = adapter(group=group)
    mapping = mapping_mod.Mapping(
        world_size=world_size, rank=rank, gpus_per_node=world_size, tp_size=world_size, moe_ep_size=world_size
    )
    return mapping, mnnvl.MnnvlConfig(comm_backend=backend)
