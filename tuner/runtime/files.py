"""The only way the start-up path reads a file: a regular file under a size cap, or an error.

An engine's start-up must not hang or run out of memory on whatever sits at a path it was
given (``profile=``, ``workload=``, ``$A2A_TUNE_WORKLOAD``, the table search path, the
fingerprint cache): a FIFO would block a plain ``open()`` forever, ``/dev/zero`` would be
read until memory runs out, and a 100 MB table costs seconds in every engine process.

:func:`read_capped` opens without blocking (``O_NONBLOCK``: opening a FIFO returns at once),
checks the opened descriptor with ``fstat`` -- a regular file, at most ``cap`` bytes -- and
only then reads, at most ``cap`` bytes (a file growing meanwhile is refused, not truncated).
Anything else raises :class:`FileRefused`, a ``ValueError`` whose message is one line without
the path (callers add it). Standard library only.
"""

from __future__ import annotations

import os
import stat

__all__ = [
    "MAX_TABLE_BYTES",
    "MAX_WORKLOAD_BYTES",
    "MAX_CACHE_BYTES",
    "MAX_JSON_BYTES",
    "FileRefused",
    "parse_json",
    "read_capped",
    "read_head",
    "read_json",
]

#: A selection table, with room over the shipped one (sizes and parse time: BENCHMARKS.md,
#: "Figures moved from the code").
MAX_TABLE_BYTES = 16 * 1024 * 1024
#: A workload histogram: MAX_POINTS lines of "tokens,weight" fit several times over.
MAX_WORKLOAD_BYTES = 4 * 1024 * 1024
#: The fingerprint cache (a few hundred bytes).
MAX_CACHE_BYTES = 64 * 1024
#: A JSON file a user points at that is not a table (a model's config.json, an NVML recording,
#: a vLLM --config file): a model config is a few KiB, a recording of 72 GPUs well under 1 MiB.
MAX_JSON_BYTES = 16 * 1024 * 1024

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(ValueError):
    """A file the start-up path will not read; ``str()`` is one line."""


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.3g} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def read_capped(path: str | os.PathLike, cap: int) -> bytes:
    """The content of ``path`` if it is a regular file of at most ``cap`` bytes.

    Raises :class:`FileRefused` for anything else (a FIFO, a device, a directory, a larger
    file) and ``OSError`` when it cannot be opened or read.
    """
    fd, st = _open_regular(path)
    try:
        if st.st_size > cap:
            raise FileRefused(f"{_mib(st.st_size)}, over the {_mib(cap)} cap: not read")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(cap + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                raise FileRefused(f"grew past the {_mib(cap)} cap while being read: not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_head(path: str | os.PathLike, n: int) -> bytes:
    """The first ``n`` bytes of ``path`` (fewer if it is shorter), opened as :func:`read_capped`
    opens: FileRefused at once for a FIFO, a device, a directory (e.g. an SQLite file's magic)."""
    fd, _ = _open_regular(path)
    try:
        return os.read(fd, n)
    finally:
        os.close(fd)


def _open_regular(path: str | os.PathLike) -> tuple[int, os.stat_result]:
    """An open descriptor of ``path`` and its stat, if it is a regular file; FileRefused else."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise FileRefused(f"not a regular file ({kind}): not read")
    return fd, st


def parse_json(raw: bytes | str, *, bom: bool = False) -> object:
    """``raw`` (bytes, or text already decoded) as JSON, or :class:`FileRefused` (one line, no
    path): not UTF-8, invalid JSON, nested too deeply, an integer beyond Python's digit limit.
    ``bom``: a UTF-8 byte-order mark is allowed (files written by editors on Windows)."""
    import json

    try:
        text = raw.decode("utf-8-sig" if bom else "utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise FileRefused(f"not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileRefused(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise FileRefused("invalid JSON: nested too deeply") from None
    except ValueError:  # int("9" * 5000): beyond sys.get_int_max_str_digits
        raise FileRefused("invalid JSON: an integer with too many digits") from None


def read_json(path: str | os.PathLike, cap: int = MAX_JSON_BYTES, *, bom: bool = False) -> object:
    """The JSON in ``path`` (:func:`read_capped`, then :func:`parse_json`): FileRefused or
    OSError (one line, no path: callers add it)."""
    return parse_json(read_capped(path, cap), bom=bom)
