"""`nccl_ep_low_latency` / `nccl_ep_high_throughput`: NCCL EP (`nccl.ep` of nccl-extensions 0.1.0,
NVIDIA/nccl contrib/nccl_ep) in its two algorithms; TensorRT-LLM's `NCCL_EP` runs the first.

NCCL EP builds on NCCL's device API (LSA loads and stores over NVLink, GIN puts over RDMA: one
node's GPUs and across nodes, as it documents), so it needs NCCL >= 2.30 in the process, and it
compiles its kernels at run time with nvcc (`NCCL_EP_JIT_NVCC`). The group is made on a fresh
NCCL communicator mirroring the torch group (`nccl.ep.interop.torch`); one `Handle` per backend,
re-bound to each step's routing (`Handle.update`; HT exchanges its metadata there).

Layouts, chosen to hand out rows as the contract has them (TensorRT-LLM's choice for LL):
  LL rank-major: [W, capacity] slots, each a source token with its top-k global ids (-1 where
  the expert is not here) and weights; filled up to `src_rank_counters[r]`.
  HT flat: W x capacity slots (static: `max_recv_tokens_per_rank`), filled up to the handle's
  `recv_total_counter`, with global ids and weights.
Both take expert outputs already weighted and summed per slot and return each token's sum.
Slots past the counts get ids -1 (masked on the device: no host read in dispatch). HT refuses a
token count per rank that times the NVLink team's ranks is no multiple of 4 (the library asserts).

Payloads: bf16 (recipe NONE); fp8_e4m3 and mxfp8 quantized before the dispatch (kernels/quant)
and forwarded with their scales (recipe FWD: rows 16-byte aligned, so hidden % 512 == 0). The
LL-only DS_FP8E3M4 recipe (quantized inside the kernel) and the experimental NVFP4 combine are
not wrapped. Graph capture of the handle update is not checked yet: timed eagerly.
"""

from __future__ import annotations

import functools
import importlib.util
import mmap
import os
import re
import shutil
from pathlib import Path
from typing import ClassVar

import torch

from .base import All2AllBackend, Availability, BackendEnv, Dispatched, MoEShape
from .errors import ShapeError, import_failure
from .registry import register_backend

NCCL_MIN = (2, 30, 0)  # NCCL's device API as NCCL EP and DeepEP V2 use it
MIN_CAPABILITY = (9, 0)  # Hopper or Blackwell, as NCCL EP documents
STAGE_HINT = "python scripts/stage_nccl_ep.py; docs/backends.md 'NCCL EP and DeepEP V2'"
_VERSION = re.compile(rb"NCCL version (\d+)\.(\d+)\.(\d+)")


@functools.lru_cache(maxsize=8)
def _nccl_version_of(path: str, _mtime: int, _size: int) -> tuple[int, int, int] | None:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        found = _VERSION.search(m)
        return tuple(int(v) for v in found.groups()) if found else None


def nccl_version(path: Path) -> tuple[int, int, int] | None:
    """The version a libnccl.so file says it is (its "NCCL version X.Y.Z" string), or None."""
    try:
        stat = path.stat()
        return _nccl_version_of(str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return None


def loaded_nccl() -> Path | None:
    """The libnccl.so.2 this process loads, found without loading it: one preloaded
    (LD_PRELOAD), else the one beside torch (its nvidia-nccl wheel), else any on sys.path."""
    for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if "libnccl.so" in Path(entry).name and Path(entry).is_file():
            return Path(entry)
    torch_spec = importlib.util.find_spec("torch")
    dirs = []
    if torch_spec is not None and torch_spec.origin:
        dirs.append(Path(torch_spec.origin).parent.parent / "nvidia" / "nccl" / "lib")
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(d) / "lib" for d in spec.submodule_search_locations]
    for d in dirs:
        if (d / "libnccl.so.2").is_file():
            return d / "libnccl.so.2"
    return None


def nccl_requirement(what: str) -> str:
    """Why `what` cannot run on the NCCL this process loads (needs >= 2.30), or ""."""
    lib = loaded_nccl()
    if lib is None:
        return f"{what} needs NCCL >= 2.30; no libnccl.so.2 found (stage one: {STAGE_HINT})"
    version = nccl_version(lib)
    if version is None or version < NCCL_MIN:
        seen = ".".join(map(str, version)) if version else "of unknown version"
        return (
            f"{what} needs NCCL >= 2.30 in the process; it would load NCCL {seen} ({lib}): "
            "preload a newer one (LD_PRELOAD=<staged>/nvidia/nccl/lib/libnccl.so.2)"
        )
    return ""


def nvcc_missing(what: str, variable: str) -> str:
    """Why `what`'s run-time kernel compiler is missing, or ""."""
    nvcc = os.environ.get(variable) or shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if nvcc or (Path(home) / "bin" / "nvcc").is_file():
        return ""
    return f"{what} compiles its kernels at run time: no nvcc ({variable}, PATH or CUDA_HOME)"


def nccl_ep_package() -> Path | None:
    """The `nccl.ep` package folder, found without importing `nccl`."""
    spec = importlib.util.find_spec("nccl")
    for d in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(d) / "ep" / "__init__.py").is_file():
            return Path(d) / "ep"
    return None


def cuda_library_availability(env: BackendEnv, what: str, installed: str, nvcc_variable: str) -> Availability:
    """What NCCL EP and DeepEP V2 share: CUDA ranks of compute capability >= 9.0, `installed`
    ("" when the package is there), NCCL >= 2.30, nvcc (`nvcc_variable` names the library's own
    setting for it), at least 2 ranks."""
    if env.device_type != "cuda":
        return Availability(False, env.needs_cuda(what))
    if installed:
        return Availability(False, installed)
    cc = env.compute_capability
    if cc is not None and tuple(cc) < MIN_CAPABILITY:
        return Availability(False, f"{what} needs compute capability >= 9.0, found {cc[0]}.{cc[1]}")
    why = nccl_requirement(what) or nvcc_missing(what, nvcc_variable)
    if why:
        return Availability(False, why)
    if env.world_size < 2:  # what one rank does: BENCHMARKS.md, "NCCL EP and DeepEP V2 at one rank"
        return Availability(
            False, f"needs at least 2 ranks ({what} not yet timed at 2+: BENCHMARKS.md, 'NCCL EP and DeepEP V2')"
        )
    return Availability(True)


def import_nccl_ep():
    """`nccl.ep`, imported on first use; an import failure is one line."""
    try:
        import nccl.ep as ep
        import nccl.ep.interop.torch as interop
    except Exception as exc:  # noqa: BLE001 - a missing libnccl symbol, cuda.bindings...
        raise import_failure("nccl.ep", exc) from exc
    return ep, interop


class _NcclEP(All2AllBackend):
    """The two algorithms: the group, the handle, the slots and their masks."""

    algorithm: ClassVar[str]  # "LOW_LATENCY" or "HIGH_THROUGHPUT"
    reach = "anywhere"  # LSA over NVLink within a node, GIN over RDMA between nodes (NCCL EP's README)
    payloads = frozenset({"bf16", "fp8_e4m3", "mxfp8"})
    capacity_bound = True
    reads_host = False  # counts masked on the device; eager only as its capture is not checked

    @classmethod
    def availability(cls, env: BackendEnv) -> Availability:
        missing = "" if nccl_ep_package() else f"nccl.ep not installed (nccl-extensions; {STAGE_HINT})"
        return cuda_library_availability(env, "NCCL EP", missing, "NCCL_EP_JIT_NVCC")

    @classmethod
    def feasibility(cls, shape: MoEShape, world_size: int) -> Availability:
        if shape.dtype != "bf16" and shape.hidden % 512:
            return Availability(
                False, f"NCCL EP forwards scale rows 16-byte aligned: hidden % 512 == 0, not {shape.hidden}"
            )
        if (shape.hidden * 2) % 16:
            return Availability(False, f"NCCL EP moves rows of a multiple of 16 bytes: hidden {shape.hidden}")
        return super().feasibility(shape, world_size)

    def __init__(self, group, shape: MoEShape, device: torch.device) -> None:
        super().__init__(group, shape, device)
        self._ep, interop = import_nccl_ep()
        ep, s, w = self._ep, shape, self.world_size
        self._comm = interop.get_nccl_comm_from_group(group)
        self._slots = w * s.max_tokens_per_rank
        config = ep.GroupConfig(
            algorithm=getattr(ep.Algorithm, self.algorithm),
            num_experts=s.num_experts,
            max_dispatch_tokens_per_rank=s.max_tokens_per_rank,
            max_recv_tokens_per_rank=self._slots if self.algorithm == "HIGH_THROUGHPUT" else 0,
            max_token_bytes=-(-s.hidden * 2 // 16) * 16,  # bf16 rows bound every payload's row + scales
            num_topk=s.topk,
        )
        self._group = ep.Group.create(self._comm, config)
        self._handle = None
        k, dev = s.topk, device
        wire = self.wire_dtype or self.dtype
        self._rows = torch.empty(self._slots, s.hidden, dtype=wire, device=dev)
        self._scales = None  # fp8_e4m3: [slots, H / 128] fp32; mxfp8: [slots, H / 32] e8m0 bytes
        if self.wire_dtype is not None:
            from .quant import empty_wire, scale_blocks

            fp8 = s.dtype == "fp8_e4m3"
            self._scales = (
                torch.empty(self._slots, scale_blocks(s.hidden), dtype=torch.float32, device=dev)
                if fp8
                else empty_wire(s.dtype, self._slots, s.hidden, dev)[1]
            )
        # Received ids: ncclEpDispatch asserts int32 in LL (`recv_topk_idx->datatype == ncclInt32`)
        # and int64 in HT (`... == ncclInt64`), aborting the process on the other (both seen on an H100).
        ids_dtype = torch.int32 if self.algorithm == "LOW_LATENCY" else torch.int64
        self._ids = torch.empty(self._slots, k, dtype=ids_dtype, device=dev)
        self._weights = torch.empty(self._slots, k, dtype=torch.float32, device=dev)
        self._count = torch.zeros(w if self.algorithm == "LOW_LATENCY" else 1, dtype=torch.int32, device=dev)
        self._slot = torch.arange(self._slots, device=dev)
        self._live: tuple = ()  # what the library holds pointers to until the combine
        # HT's flat layout asserts (aborting the process) that the tokens per rank times the ranks in
        # the NVLink (LSA) team are a multiple of 4 (`ht_ep_adapter.cu`: "requires even
        # num_tokens_per_rank" with 2 ranks, and T = 2 aborted at 1 rank on an H100); 0: LL, no limit
        self._ht_team = min(w, max(torch.cuda.device_count(), 1)) if self.algorithm == "HIGH_THROUGHPUT" else 0

    def _shaped(self, t: torch.Tensor) -> torch.Tensor:
        """A [slots, ...] buffer in the layout's shape: LL [W, capacity, ...], HT [slots, ...]."""
        if self.algorithm == "LOW_LATENCY":
            return t.view(self.world_size, self.shape.max_tokens_per_rank, *t.shape[1:])
        return t

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        t = self.check_inputs(x, topk_ids, topk_weights)
        team = self._ht_team
        if team and (t * team) % 4:
            raise ShapeError(
                f"NCCL EP's high-throughput flat layout takes tokens per rank x ranks per NVLink team in "
                f"multiples of 4, not {t} x {team} (its assertion in ht_ep_adapter.cu; the library would abort)"
            )
        ep, stream = self._ep, self._stream()
        idx = topk_ids.to(torch.int64).contiguous()
        weights = topk_weights.to(torch.float32).contiguous()
        ht = self.algorithm == "HIGH_THROUGHPUT"
        kind = ep.ExpertIdKind.GLOBAL
        counter = ep.Tensor(self._count)
        handle_info = ep.LayoutInfo(recv_total_counter=counter, recv_topk_idx_kind=kind) if ht else None
        idx_t = ep.Tensor(idx)
        if self._handle is None:
            layout = ep.Layout.FLAT if ht else ep.Layout.RANK_MAJOR
            self._handle = self._group.create_handle(layout, idx_t, layout_info=handle_info, stream=stream)
        else:
            self._handle.update(idx_t, layout_info=handle_info, stream=stream)
        config = None
        if self.wire_dtype is not None:
            from .quant import quantize

            q, sc = quantize(self.shape.dtype, x)
            inputs = ep.DispatchInputs(tokens=ep.Tensor(q), topk_weights=ep.Tensor(weights), scales=ep.Tensor(sc))
            config = ep.DispatchConfig(quantization_recipe=ep.DispatchQuantizationRecipe.FWD)
            keep = (q, sc)
        else:
            inputs = ep.DispatchInputs(tokens=ep.Tensor(x.contiguous()), topk_weights=ep.Tensor(weights))
            keep = (x.contiguous(),)
        outputs = ep.DispatchOutputs(
            tokens=ep.Tensor(self._shaped(self._rows)),
            topk_weights=ep.Tensor(self._shaped(self._weights)),
            topk_idx=ep.Tensor(self._shaped(self._ids)),
            scales=None if self._scales is None else ep.Tensor(self._shaped(self._scales)),
        )
        info = None if ht else ep.LayoutInfo(src_rank_counters=counter, recv_topk_idx_kind=kind)
        self._handle.dispatch(inputs, outputs, layout_info=info, config=config, stream=stream)
        self._live = (idx, idx_t, weights, inputs, outputs, info, handle_info, counter, keep)
        if ht:
            filled = self._slot < self._count[0]
        else:
            cap = self.shape.max_tokens_per_rank
            filled = ((self._slot % cap) < self._count.repeat_interleave(cap)).view(-1)
        ids = torch.where(filled.unsqueeze(1) & (self._ids >= 0), self._ids, -1)
        weights_out = torch.where(filled.unsqueeze(1), self._weights, 0.0)
        return Dispatched(x=self._rows, topk_ids=ids, topk_weights=weights_out, handle=None, x_scale=self._scales)

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        ep, stream = self._ep, self._stream()
        t = self._live[0].shape[0]
        y = torch.empty(t, self.shape.hidden, dtype=self.dtype, device=self.device)
        rows = self._shaped(expert_out.to(self.dtype).contiguous())
        inputs, outputs = ep.CombineInputs(tokens=ep.Tensor(rows)), ep.CombineOutputs(tokens=ep.Tensor(y))
        self._handle.combine(inputs, outputs, stream=stream)
        self._live = (*self._live, rows, inputs, outputs)
        return y

    def close(self) -> None:
        for name in ("_handle", "_group"):
            obj = getattr(self, name, None)
            setattr(self, name, None)
            if obj is not None:
                obj.destroy()
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None and hasattr(comm, "destroy"):
            comm.destroy()


@register_backend
class NcclEPLowLatency(_NcclEP):
    name = "nccl_ep_low_latency"
    algorithm = "LOW_LATENCY"
    engine_names = {"trtllm": "NCCL_EP"}  # TensorRT-LLM's NcclEP: LL, rank-major (fused_moe/communication)


@register_backend
class NcclEPHighThroughput(_NcclEP):
    name = "nccl_ep_high_throughput"
    algorithm = "HIGH_THROUGHPUT"
