"""Hardware fingerprints as keys: canonical form, and which fingerprints may share a table.

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

Design notes: docs/architecture.md, "Module notes", `tuner/runtime/fingerprint.py`.
"""

from __future__ import annotations

import os
import re

from a2a_tune.tuner.runtime.environ import env_text, xdg_dir
from a2a_tune.tuner.runtime.text import one_line

__all__ = [
    "HW_EXACT",
    "HW_CLUSTER",
    "HW_SAME_DOMAIN",
    "HW_DEFAULT",
    "CACHE_MAX_AGE_S",
    "PROBE_TIMEOUT_S",
    "ProbeError",
    "RECORDING_ENV",
    "domain_key",
    "node_count",
    "normalize_fingerprint",
    "probed_fingerprint",
    "remember_fingerprint",
]

HW_EXACT = "exact"
HW_CLUSTER = "cluster"
HW_SAME_DOMAIN = "same-gpu-domain"
HW_DEFAULT = "engine-default"
# A recording (``a2a-tune probe --record FILE``) that stands in for this node's live NVML.
RECORDING_ENV = "A2A_TUNE_NVML_RECORDING"

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
            f"invalid hardware fingerprint {one_line(repr(fingerprint), 80)}: use 1-200 characters "
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


# --------------------------------------------------------------------------- this machine

PROBE_TIMEOUT_S = 5.0
CACHE_MAX_AGE_S = 24 * 3600.0
_NVIDIA_PROC = "/proc/driver/nvidia"
_PROBE_MODULE = "a2a_tune.tuner.probe"  # run as a child, never imported here
_MAX_REASON = 300  # characters of the child's last error line kept in ProbeError


class ProbeError(RuntimeError):
    """The probe's child failed, hung or printed no fingerprint (the message is one line)."""


def _cache_dir() -> str:
    return os.path.join(xdg_dir("XDG_CACHE_HOME", ".cache"), "a2a-tune")


def _host_key() -> str | None:
    """What this machine's fingerprint depends on and could change without a new probe; None
    where it cannot be told (no Linux boot id): then nothing is cached."""
    from a2a_tune.tuner.runtime.files import MAX_CACHE_BYTES, read_capped

    try:
        boot = read_capped("/proc/sys/kernel/random/boot_id", MAX_CACHE_BYTES).decode().strip()
    except (OSError, ValueError):
        return None
    try:
        driver = read_capped(os.path.join(_NVIDIA_PROC, "version"), MAX_CACHE_BYTES).decode(errors="replace")
        driver = driver.strip().splitlines()[0] if driver.strip() else "?"
        gpus = ",".join(sorted(os.listdir(os.path.join(_NVIDIA_PROC, "gpus"))))
    except (OSError, ValueError):
        driver, gpus = "none", ""
    recording = env_text(RECORDING_ENV) or ""
    if recording:  # a replayed machine is another machine; ascii(): the key is one line of ASCII
        try:
            st = os.stat(recording)
            recording = f"{ascii(os.path.abspath(recording))}:{st.st_size}:{st.st_mtime_ns}"
        except (OSError, ValueError):
            recording = f"{ascii(recording)}:?"
    tuner = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = []
    for name in ("probe.py", "nvml.py"):
        try:
            st = os.stat(os.path.join(tuner, name))
            code.append(f"{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            code.append("?")
    return "|".join([boot, os.uname().nodename if hasattr(os, "uname") else "", driver, gpus, recording, *code])


def _cache_path(key: str) -> str:
    import zlib  # not hashlib: ~5 ms to import; a clash only costs a probe (the key is checked)

    return os.path.join(_cache_dir(), f"fingerprint-{zlib.crc32(key.encode()):08x}")


_CACHE_FORMAT = "a2a-tune fingerprint cache 1"  # then: key, fingerprint, probed at (epoch s); one a line


def _cached(key: str) -> str | None:
    import time

    from a2a_tune.tuner.runtime.files import MAX_CACHE_BYTES, read_capped

    try:
        fmt, stored_key, fingerprint, probed_at = (
            read_capped(_cache_path(key), MAX_CACHE_BYTES).decode().split("\n")[:4]
        )
        if fmt != _CACHE_FORMAT or stored_key != key or not 0 <= time.time() - float(probed_at) <= CACHE_MAX_AGE_S:
            return None
        return normalize_fingerprint(fingerprint)
    except (OSError, ValueError):
        return None  # missing, stale, foreign or damaged: probe again


def remember_fingerprint(fingerprint: str, key: str | None = None) -> None:
    """Cache ``fingerprint`` as this machine's (``a2a-tune probe`` and the lookup's probe do).
    Best effort: an unwritable cache directory only costs the next start-up a probe."""
    import tempfile
    import time

    key = key or _host_key()
    if key is None:
        return
    path = _cache_path(key)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".fingerprint-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{_CACHE_FORMAT}\n{key}\n{normalize_fingerprint(fingerprint)}\n{time.time()!r}\n")
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, ValueError):
        pass


def probed_fingerprint(timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """This machine's fingerprint: cached (see the module docstring), else probed (the probe's
    child given ``timeout_s`` seconds) and cached. Raises :class:`ProbeError` on a failed or
    hung probe."""
    key = _host_key()
    if key is not None:
        hit = _cached(key)
        if hit is not None:
            return hit
    fingerprint = _probe_child(timeout_s)
    remember_fingerprint(fingerprint, key)
    return fingerprint


def _probe_child(timeout_s: float) -> str:
    """The fingerprint ``python -m a2a_tune.tuner.probe --fingerprint`` prints, given
    ``timeout_s`` seconds (then killed). NVML is read in that child, so a crash or a hang there
    costs the engine only the wait."""
    import subprocess
    import sys

    try:
        child = subprocess.run(
            [sys.executable, "-m", _PROBE_MODULE, "--fingerprint"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ProbeError(f"NVML probe did not answer within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise ProbeError(f"the probe could not start: {one_line(exc, _MAX_REASON)}") from None
    if child.returncode != 0:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"the probe exited with code {child.returncode}: {one_line(last, _MAX_REASON)}")
    try:
        return normalize_fingerprint((child.stdout.strip().splitlines() or [""])[-1])
    except ValueError as exc:
        raise ProbeError(f"the probe printed no fingerprint ({one_line(str(exc), _MAX_REASON)})") from None
