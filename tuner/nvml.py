"""Raw NVML answers behind one small interface, so the probe can run on recordings.

This is the only module in a2a-tune that imports ``pynvml`` (package nvidia-ml-py), and
it does so lazily inside :class:`RealNvml`: importing this module costs nothing and works
on machines without the NVIDIA driver, the NVML library, or a GPU.

Three pieces:

- :class:`NvmlSource` - the raw queries the topology probe needs. Every query returns a
  plain Python value or raises :class:`NvmlQueryError` carrying NVML's error name
  (``"InvalidArgument"``, ``"NotSupported"``, ``"Unknown"`` ...). Nothing else escapes, so
  a caller can degrade field by field: one failing query costs one field, never the probe.
- :class:`RealNvml` (live, through pynvml) and :class:`RecordedNvml` (replays a recording).
- :func:`record` walks a source exactly the way the probe reads it and returns the answers
  as a JSON-serialisable dict - the fixture format. A user on a new machine records it once
  and contributes the file; the probe then behaves on CI exactly as on that machine.

Design notes: docs/architecture.md, "Module notes", `tuner/nvml.py`.
"""

from __future__ import annotations

import ctypes
import json
import platform
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypedDict, runtime_checkable

RECORD_FORMAT = "a2a-tune/nvml-record"
RECORD_VERSION = 1

# NVML's header bound (NVML_NVLINK_MAX_LINKS in nvidia-ml-py 13.x). Hopper and Blackwell
# use 18; the probe still asks every index so a driver that answers a valid state beyond 18
# is not silently cut off. Absent indices answer InvalidArgument / NotSupported.
MAX_NVLINKS = 36

# nvmlNvLinkDeviceType_t -> our names.
_REMOTE_DEVICE_TYPES = {0x00: "gpu", 0x01: "ibmnpu", 0x02: "switch", 0xFF: "unknown"}
# nvmlGpuFabricState_t -> our names.
_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


class NvmlQueryError(Exception):
    """One NVML query failed; ``code_name`` is NVML's error name without the prefix.

    Examples: ``"InvalidArgument"`` (GB200 for link indices >= 18), ``"NotSupported"``
    (PCIe GPUs for every NVLink query), ``"LibraryNotFound"`` / ``"DriverNotLoaded"``
    (no NVML on this host), ``"NotRecorded"`` (a recording lacks the answer).
    """

    def __init__(self, code_name: str, detail: str = "") -> None:
        self.code_name = code_name
        self.detail = detail
        super().__init__(f"{code_name}: {detail}" if detail else code_name)


class FabricInfo(TypedDict):
    """GPU fabric (multi-node NVLink) membership, as nvmlDeviceGetGpuFabricInfo reports it."""

    cluster_uuid: str  # 8-4-4-4-12 hex; all zeros when the GPU is in no NVLink domain
    clique_id: int
    state: str  # "not_supported" | "not_started" | "in_progress" | "completed"
    status: str  # NVML return name of the fabric registration, "Success" when healthy


@runtime_checkable
class NvmlSource(Protocol):
    """The raw answers the topology probe needs, one method per NVML query.

    Contract: each query returns a plain value or raises :class:`NvmlQueryError`; no other
    exception type escapes. ``init`` is called once before any query and ``shutdown`` once
    after the last. Device and link indices are NVML's (0-based).
    """

    # -- lifetime --
    def init(self) -> None: ...
    def shutdown(self) -> None: ...

    # -- host identity: not NVML, but a recording must replay which host it describes --
    def hostname(self) -> str: ...
    def machine(self) -> str: ...

    # -- system --
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...

    # -- per device --
    def name(self, device: int) -> str: ...
    def compute_capability(self, device: int) -> tuple[int, int]: ...
    def memory_total_bytes(self, device: int) -> int: ...
    def pci_bus_id(self, device: int) -> str: ...
    def uuid(self, device: int) -> str: ...
    def fabric_info(self, device: int) -> FabricInfo: ...

    # -- per (device, link) --
    def nvlink_state(self, device: int, link: int) -> bool: ...
    def nvlink_version(self, device: int, link: int) -> int: ...
    def nvlink_remote_pci_bus_id(self, device: int, link: int) -> str: ...
    def nvlink_remote_device_type(self, device: int, link: int) -> str: ...
    def nvlink_speed_mbps(self, device: int, link: int) -> int | None: ...
    def pcie_link(self, device: int) -> tuple[int, int]: ...


# ---------------------------------------------------------------------------------------
# Live source
# ---------------------------------------------------------------------------------------


def _nvml_error_name(exc: BaseException) -> str:
    """NVML error name of a pynvml exception: NVMLError_InvalidArgument -> InvalidArgument."""
    cls_name = type(exc).__name__
    if cls_name.startswith("NVMLError_"):
        return cls_name[len("NVMLError_") :]
    if cls_name == "NVMLLibraryMismatchError":
        return "FunctionNotFound"
    # A bare NVMLError carries an unmapped numeric code.
    value = getattr(exc, "value", None)
    return f"Code{value}" if isinstance(value, int) else "Unknown"


def _return_code_name(pynvml: Any, code: int) -> str:
    """Name of an nvmlReturn_t found inside a struct (e.g. the fabric status field)."""
    if code == 0:
        return "Success"
    cls = pynvml.NVMLError._valClassMapping.get(code)
    return cls.__name__[len("NVMLError_") :] if cls is not None else f"Code{code}"


def _format_fabric_uuid(raw: Any) -> str:
    hexs = bytes(raw).hex()
    return f"{hexs[0:8]}-{hexs[8:12]}-{hexs[12:16]}-{hexs[16:20]}-{hexs[20:32]}"


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealNvml:
    """:class:`NvmlSource` over the live NVML library, through pynvml.

    Each query runs whole - NVML call and conversion to a plain value - inside
    :meth:`_query`, which turns any failure (an NVML error, a pynvml too old to know a
    function or struct, a pynvml/driver mismatch) into :class:`NvmlQueryError`. The probe
    therefore degrades one field at a time, the way gpustat does.
    """

    def __init__(self) -> None:
        self._pynvml: Any = None
        self._handles: dict[int, Any] = {}

    @staticmethod
    def _query(answer: Callable[[], Any]) -> Any:
        try:
            return answer()
        except NvmlQueryError:
            raise
        except Exception as exc:  # pynvml raises NVMLError subclasses; old bindings, more
            try:
                detail = str(exc)
            except Exception:  # NVMLError.__str__ may itself call into NVML
                detail = type(exc).__name__
            raise NvmlQueryError(_nvml_error_name(exc), detail) from exc

    def _nvml(self) -> Any:
        if self._pynvml is None:
            raise NvmlQueryError("Uninitialized", "RealNvml.init() was not called")
        return self._pynvml

    def _handle(self, device: int) -> Any:
        if device not in self._handles:
            nvml = self._nvml()
            self._handles[device] = self._query(lambda: nvml.nvmlDeviceGetHandleByIndex(device))
        return self._handles[device]

    # -- lifetime --
    def init(self) -> None:
        if self._pynvml is not None:
            return
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlQueryError("LibraryNotFound", f"pynvml not importable: {exc}") from exc
        self._query(pynvml.nvmlInit)
        self._pynvml = pynvml

    def shutdown(self) -> None:
        if self._pynvml is None:
            return
        pynvml, self._pynvml = self._pynvml, None
        self._handles.clear()
        self._query(pynvml.nvmlShutdown)

    # -- host identity --
    def hostname(self) -> str:
        return socket.gethostname()

    def machine(self) -> str:
        return platform.machine()

    # -- system --
    def driver_version(self) -> str:
        nvml = self._nvml()
        return self._query(lambda: _as_str(nvml.nvmlSystemGetDriverVersion()))

    def device_count(self) -> int:
        nvml = self._nvml()
        return self._query(lambda: int(nvml.nvmlDeviceGetCount()))

    # -- per device --
    def name(self, device: int) -> str:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: _as_str(nvml.nvmlDeviceGetName(handle)))

    def compute_capability(self, device: int) -> tuple[int, int]:
        nvml, handle = self._nvml(), self._handle(device)

        def answer() -> tuple[int, int]:
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            return int(major), int(minor)

        return self._query(answer)

    def memory_total_bytes(self, device: int) -> int:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total))

    def memory_free_bytes(self, device: int) -> int:
        """Device memory free now (not part of NvmlSource: a recording has no "now")."""
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).free))

    def pci_bus_id(self, device: int) -> str:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: _as_str(nvml.nvmlDeviceGetPciInfo(handle).busId))

    def uuid(self, device: int) -> str:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: _as_str(nvml.nvmlDeviceGetUUID(handle)))

    def fabric_info(self, device: int) -> FabricInfo:
        """Fabric info through the versioned API (driver >= 550), else the deprecated one."""
        nvml, handle = self._nvml(), self._handle(device)

        def read(struct_name: str, function_name: str) -> Any:
            info = getattr(nvml, struct_name)()  # the versioned struct sets its own version field
            # pynvml forwards the argument to C as is: the struct must go by reference, or
            # NVML writes through its first bytes as a pointer (a segfault on H200 / driver 580).
            getattr(nvml, function_name)(handle, ctypes.byref(info))
            return info

        try:
            info = self._query(lambda: read("c_nvmlGpuFabricInfo_v2_t", "nvmlDeviceGetGpuFabricInfoV"))
        except NvmlQueryError as first:
            if first.code_name == "NotSupported":
                raise
            try:
                info = self._query(lambda: read("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"))
            except NvmlQueryError:
                raise first from None

        def convert() -> FabricInfo:
            state = int(info.state)
            return FabricInfo(
                cluster_uuid=_format_fabric_uuid(info.clusterUuid),
                clique_id=int(info.cliqueId),
                state=_FABRIC_STATES.get(state, f"state{state}"),
                status=_return_code_name(nvml, int(info.status)),
            )

        return self._query(convert)

    # -- per (device, link) --
    def nvlink_state(self, device: int, link: int) -> bool:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: bool(nvml.nvmlDeviceGetNvLinkState(handle, link)))

    def nvlink_version(self, device: int, link: int) -> int:
        """Raw nvmlNvlinkVersion_t: an enum, not the marketing number (6 = NVLink 4.0)."""
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: int(nvml.nvmlDeviceGetNvLinkVersion(handle, link)))

    def nvlink_remote_pci_bus_id(self, device: int, link: int) -> str:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(lambda: _as_str(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))

    def nvlink_remote_device_type(self, device: int, link: int) -> str:
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(
            lambda: _REMOTE_DEVICE_TYPES.get(int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)), "unknown")
        )

    def nvlink_speed_mbps(self, device: int, link: int) -> int | None:
        """Per-link speed in MB/s from NVML field values; None when no field answers.

        Tried in order: the per-link field (NVML_FI_DEV_NVLINK_SPEED_MBPS_L0..L11 exist only
        for links 0-11), the link-scoped NVML_FI_DEV_NVLINK_GET_SPEED, then the common speed.
        A value of 0 means "unknown" (inactive links) and is reported as None.
        """
        nvml, handle = self._nvml(), self._handle(device)
        candidates: list[Any] = []
        per_link = getattr(nvml, f"NVML_FI_DEV_NVLINK_SPEED_MBPS_L{link}", None)
        if per_link is not None:
            candidates.append(per_link)
        if hasattr(nvml, "NVML_FI_DEV_NVLINK_GET_SPEED"):
            candidates.append((nvml.NVML_FI_DEV_NVLINK_GET_SPEED, link))
        candidates.append(nvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)

        def read(field: Any) -> int | None:
            (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field])
            if int(value.nvmlReturn) != 0:
                raise NvmlQueryError(_return_code_name(nvml, int(value.nvmlReturn)))
            return int(_field_value(nvml, value)) or None

        errors: list[str] = []
        for field in candidates:
            try:
                speed = self._query(lambda: read(field))  # noqa: B023
            except NvmlQueryError as exc:
                errors.append(exc.code_name)
                continue
            if speed is not None:
                return speed
        real_errors = [code for code in errors if code != "NotSupported"]
        if real_errors:
            raise NvmlQueryError(real_errors[0], "no NVLink speed field answered")
        return None

    def pcie_link(self, device: int) -> tuple[int, int]:
        """(generation, width) of the GPU's PCIe link at its best (the device and the slot
        together): the current ones drop while the GPU idles."""
        nvml, handle = self._nvml(), self._handle(device)
        return self._query(
            lambda: (
                int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
            )
        )


def _field_value(nvml: Any, value: Any) -> float | int:
    """Read the member of an nvmlValue_t union that the field's valueType says is filled."""
    member = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(int(value.valueType), "uiVal")
    return getattr(value.value, member)


# ---------------------------------------------------------------------------------------
# Recorded source
# ---------------------------------------------------------------------------------------


def _is_error(answer: Any) -> bool:
    return isinstance(answer, dict) and set(answer) == {"error"}


class RecordedNvml:
    """:class:`NvmlSource` that replays a recording made by :func:`record`.

    ``recording`` is a path to a JSON file or the already-loaded dict. An answer recorded
    as ``{"error": name}`` raises ``NvmlQueryError(name)``; an answer the recording does not
    hold raises ``NvmlQueryError("NotRecorded")``. ``init`` fails the same way if the
    recording holds ``"init": {"error": ...}`` (a host where NVML could not start).
    """

    def __init__(self, recording: str | Path | dict[str, Any]) -> None:
        if isinstance(recording, (str, Path)):  # read as every file a user points at (runtime.files)
            from .runtime.files import read_json

            recording = read_json(recording)
        if not isinstance(recording, dict):
            raise ValueError(f"not an NVML recording (a JSON {type(recording).__name__}, not an object)")
        if recording.get("format") != RECORD_FORMAT:
            raise ValueError(f"not an NVML recording (format != {RECORD_FORMAT!r})")
        if recording.get("version") != RECORD_VERSION:
            raise ValueError(f"unsupported NVML recording version {recording.get('version')!r}")
        self._rec = recording

    @staticmethod
    def _answer(answer: Any, what: str) -> Any:
        if answer is _MISSING:
            raise NvmlQueryError("NotRecorded", what)
        if _is_error(answer):
            raise NvmlQueryError(str(answer["error"]), what)
        return answer

    def _top(self, key: str) -> Any:
        return self._answer(self._rec.get(key, _MISSING), key)

    def _device(self, device: int) -> dict[str, Any]:
        devices = self._rec.get("devices", [])
        if not 0 <= device < len(devices):
            raise NvmlQueryError("InvalidArgument", f"device {device} not recorded")
        return devices[device]

    def _dev(self, device: int, key: str) -> Any:
        return self._answer(self._device(device).get(key, _MISSING), f"device {device} {key}")

    def _link(self, device: int, link: int, key: str) -> Any:
        links = self._device(device).get("nvlinks", [])
        entry = links[link] if 0 <= link < len(links) else {}
        return self._answer(entry.get(key, _MISSING), f"device {device} link {link} {key}")

    # -- lifetime --
    def init(self) -> None:
        if "init" in self._rec:
            self._answer(self._rec["init"], "init")

    def shutdown(self) -> None:
        return None

    # -- host identity --
    def hostname(self) -> str:
        return str(self._top("hostname"))

    def machine(self) -> str:
        return str(self._top("machine"))

    # -- system --
    def driver_version(self) -> str:
        return str(self._top("driver_version"))

    def device_count(self) -> int:
        return int(self._top("device_count"))

    # -- per device --
    def name(self, device: int) -> str:
        return str(self._dev(device, "name"))

    def compute_capability(self, device: int) -> tuple[int, int]:
        major, minor = self._dev(device, "compute_capability")
        return int(major), int(minor)

    def memory_total_bytes(self, device: int) -> int:
        return int(self._dev(device, "memory_total_bytes"))

    def pci_bus_id(self, device: int) -> str:
        return str(self._dev(device, "pci_bus_id"))

    def uuid(self, device: int) -> str:
        return str(self._dev(device, "uuid"))

    def fabric_info(self, device: int) -> FabricInfo:
        raw = self._dev(device, "fabric_info")
        return FabricInfo(
            cluster_uuid=str(raw["cluster_uuid"]),
            clique_id=int(raw["clique_id"]),
            state=str(raw["state"]),
            status=str(raw["status"]),
        )

    # -- per (device, link) --
    def nvlink_state(self, device: int, link: int) -> bool:
        return bool(self._link(device, link, "state"))

    def nvlink_version(self, device: int, link: int) -> int:
        return int(self._link(device, link, "version"))

    def nvlink_remote_pci_bus_id(self, device: int, link: int) -> str:
        return str(self._link(device, link, "remote_pci_bus_id"))

    def nvlink_remote_device_type(self, device: int, link: int) -> str:
        return str(self._link(device, link, "remote_device_type"))

    def nvlink_speed_mbps(self, device: int, link: int) -> int | None:
        speed = self._link(device, link, "speed_mbps")
        return None if speed is None else int(speed)

    def pcie_link(self, device: int) -> tuple[int, int]:
        generation, width = self._dev(device, "pcie_link")
        return int(generation), int(width)


_MISSING: Any = object()


# ---------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------


def _ask(query: Callable[..., Any], *args: Any) -> Any:
    """One query's answer in recording form: the value, or {"error": name}."""
    try:
        answer = query(*args)
    except NvmlQueryError as exc:
        return {"error": exc.code_name}
    return list(answer) if isinstance(answer, tuple) else answer


def _record_link(source: NvmlSource, device: int, link: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"state": _ask(source.nvlink_state, device, link)}
    if _is_error(entry["state"]):
        return entry  # absent link (or unreadable): the probe asks nothing more about it
    entry["version"] = _ask(source.nvlink_version, device, link)
    entry["remote_pci_bus_id"] = _ask(source.nvlink_remote_pci_bus_id, device, link)
    entry["remote_device_type"] = _ask(source.nvlink_remote_device_type, device, link)
    entry["speed_mbps"] = _ask(source.nvlink_speed_mbps, device, link)
    return entry


_NOT_RECORDED = {"error": "NotRecorded"}


def _record_device(source: NvmlSource, device: int, max_links: int) -> dict[str, Any]:
    fabric = _ask(source.fabric_info, device)
    entry = {
        "index": device,
        "name": _ask(source.name, device),
        "compute_capability": _ask(source.compute_capability, device),
        "memory_total_bytes": _ask(source.memory_total_bytes, device),
        "pci_bus_id": _ask(source.pci_bus_id, device),
        "uuid": _ask(source.uuid, device),
        "fabric_info": dict(fabric) if isinstance(fabric, dict) else fabric,
        "nvlinks": [_record_link(source, device, link) for link in range(max_links)],
    }
    pcie = _ask(source.pcie_link, device) if hasattr(source, "pcie_link") else _NOT_RECORDED
    if pcie != _NOT_RECORDED:  # a recording from before the PCIe query replays without it
        entry["pcie_link"] = pcie
    return entry


def record(source: NvmlSource, *, max_links: int = MAX_NVLINKS) -> dict[str, Any]:
    """Every answer the probe reads from ``source``, in the recording format.

    Raises :class:`NvmlQueryError` only when ``source.init()`` fails (there is nothing to
    record then); every other failing query is recorded as ``{"error": name}``.
    """
    source.init()
    try:
        recording: dict[str, Any] = {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "hostname": _ask(source.hostname),
            "machine": _ask(source.machine),
            "driver_version": _ask(source.driver_version),
            "device_count": _ask(source.device_count),
        }
        count = recording["device_count"]
        count = count if isinstance(count, int) else 0
        recording["devices"] = [_record_device(source, i, max_links) for i in range(count)]
    finally:
        try:
            source.shutdown()
        except NvmlQueryError:
            pass  # the answers are already in hand; a failing shutdown changes none of them
    return recording


def free_memory_bytes(visible: str | None) -> list[int] | None:
    """Free memory of each GPU the ranks may use, read through NVML so that this process
    holds no CUDA context: the devices ``visible`` (CUDA_VISIBLE_DEVICES: NVML indices or
    UUIDs) names, every GPU when it is None. None when NVML cannot say."""
    source = RealNvml()
    try:
        source.init()
    except NvmlQueryError:
        return None
    try:
        count = source.device_count()
        if visible is None:
            devices = list(range(count))
        else:
            uuids = {source.uuid(d): d for d in range(count)}
            devices = []
            for item in (v.strip() for v in visible.split(",") if v.strip()):
                if item.isdigit():
                    devices.append(int(item))
                else:  # a UUID, or the unique prefix of one
                    devices += [d for u, d in uuids.items() if u.startswith(item)][:1]
        return [source.memory_free_bytes(d) for d in devices if 0 <= d < count] or None
    except NvmlQueryError:
        return None
    finally:
        try:
            source.shutdown()
        except NvmlQueryError:
            pass


def record_live(timeout_s: float = 60.0) -> dict[str, Any]:
    """Record the live NVML answers in a child process and return them.

    NVML is a C library reached through ctypes: a wrong struct or a driver quirk ends the
    process with a signal instead of an exception. The child takes that risk, so the sweep,
    an engine's start-up lookup, or the CLI survive it. Raises NvmlQueryError (one line)
    when the child finds no NVML, dies, or hangs.
    """
    import subprocess
    import sys

    try:
        child = subprocess.run(
            [sys.executable, "-m", __name__], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise NvmlQueryError("Timeout", f"NVML probe did not answer within {timeout_s:.0f} s") from None
    if child.returncode == 0:
        return json.loads(child.stdout)
    if child.returncode == _EXIT_NO_NVML:
        raise NvmlQueryError(child.stdout.strip() or "LibraryNotFound", "NVML not available")
    last = (child.stderr.strip().splitlines() or ["no output"])[-1]
    raise NvmlQueryError("ProbeCrashed", f"NVML probe process exited with code {child.returncode}: {last}")


_EXIT_NO_NVML = 3


def _main() -> int:
    import sys

    try:
        recording = record(RealNvml())
    except NvmlQueryError as exc:
        print(exc.code_name)
        return _EXIT_NO_NVML
    json.dump(recording, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
