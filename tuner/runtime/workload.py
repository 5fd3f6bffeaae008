"""Workload histograms: how many tokens per rank an engine step carries, and how often.

An engine keeps one all2all backend for its life, so the right backend is the one with the
lowest *expected* time over the steps it will serve. A workload file says what those steps
look like: tokens per rank per step -> weight (a count or a probability; only ratios
matter). Read by ``lookup(workload=...)`` and ``a2a-tune lookup --workload FILE``.

Formats (chosen by content: a first non-blank character ``{`` or ``[`` means JSON)::

    JSON  {"1": 120, "8": 40, "256": 3}        object: tokens -> weight
          [[1, 120], [8, 40], [256, 3]]         array of [tokens, weight] pairs
    CSV   tokens,weight                         one pair per line; a first line that is
          1,120                                 not numeric is a header; '#' starts a
          8,40                                  comment; blank lines are skipped

Rules: tokens are integers >= 0 (an integral float such as ``8.0`` is accepted), weights
finite numbers >= 0 with at least one > 0, a token count listed twice adds its weights, at
most :data:`MAX_POINTS` distinct token counts (keeps a lookup's cost bounded); the file is a
regular file of at most ``files.MAX_WORKLOAD_BYTES`` (4 MiB), never a FIFO or device. Anything else
is a :class:`WorkloadError` whose ``str()`` is one line naming the file and the line or
field. Standard library only: the runtime lookup imports this module when asked for a
workload.
"""

from __future__ import annotations

import math
import os

from a2a_tune.tuner.runtime.text import one_line

__all__ = [
    "MAX_POINTS",
    "Workload",
    "WorkloadError",
    "clear_cache",
    "load_workload",
    "parse_workload",
    "parse_workload_text",
]

MAX_POINTS = 65536

#: A parsed workload: ((tokens, weight), ...) ascending by tokens, weights summing to 1.
Workload = tuple


class WorkloadError(ValueError):
    """A workload that cannot be used. ``str()`` is one line: ``[file: ][where: ]problem``."""

    def __init__(self, problem: str, *, where: str | None = None, path: str | None = None):
        self.problem = one_line(problem)
        self.where = where
        self.path = path
        super().__init__(self.problem)

    def __str__(self) -> str:
        return ": ".join([p for p in (self.path, self.where) if p] + [self.problem])


def _tokens(v, where: str) -> int:
    if isinstance(v, bool):
        raise WorkloadError(f"tokens must be an integer >= 0, got {v!r}", where=where)
    if isinstance(v, str):
        try:
            v = float(v.strip()) if any(c in v for c in ".eE") else int(v.strip())
        except ValueError:
            raise WorkloadError(f"tokens must be an integer >= 0, got {v!r}", where=where) from None
    if isinstance(v, float):
        if not (math.isfinite(v) and v == int(v)):
            raise WorkloadError(f"tokens must be an integer >= 0, got {v!r}", where=where)
        v = int(v)
    if not isinstance(v, int) or v < 0:
        raise WorkloadError(f"tokens must be an integer >= 0, got {v!r}", where=where)
    return v


def _weight(v, where: str) -> float:
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise WorkloadError(f"weight must be a number >= 0, got {v!r}", where=where) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise WorkloadError(f"weight must be a finite number >= 0, got {v!r}", where=where)
    return float(v)


def _finish(pairs) -> Workload:
    """[(tokens, weight, where)] -> normalised, merged, ascending Workload."""
    merged: dict = {}
    for t, w, _ in pairs:
        merged[t] = merged.get(t, 0.0) + w
    if not merged:
        raise WorkloadError("empty workload (no token counts)")
    if len(merged) > MAX_POINTS:
        raise WorkloadError(f"too many distinct token counts ({len(merged)} > {MAX_POINTS})")
    total = sum(merged.values())
    if not total > 0 or not math.isfinite(total):
        raise WorkloadError("every weight is 0 (or they overflow)")
    return tuple((t, merged[t] / total) for t in sorted(merged) if merged[t] > 0)


def parse_workload(data) -> Workload:
    """A decoded JSON value or a ``{tokens: weight}`` mapping -> :data:`Workload`."""
    pairs = []
    if isinstance(data, dict):
        for k, v in data.items():
            pairs.append((_tokens(k, f"key {k!r}"), _weight(v, f"[{k!r}]"), k))
    elif isinstance(data, (list, tuple)):
        for i, item in enumerate(data):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise WorkloadError("expected a [tokens, weight] pair", where=f"[{i}]")
            pairs.append((_tokens(item[0], f"[{i}][0]"), _weight(item[1], f"[{i}][1]"), i))
    else:
        raise WorkloadError(
            f"expected an object {{tokens: weight}} or an array of [tokens, weight] pairs, got {type(data).__name__}"
        )
    return _finish(pairs)


def _parse_csv(text: str) -> Workload:
    pairs = []
    first = True
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [c.strip() for c in line.replace(";", ",").replace("\t", ",").split(",")]
        if len(cells) != 2:
            raise WorkloadError(f"expected 2 columns (tokens,weight), got {len(cells)}", where=f"line {n}")
        if first:
            first = False
            try:
                float(cells[0]), float(cells[1])
            except ValueError:
                continue  # a header line
        pairs.append((_tokens(cells[0], f"line {n}"), _weight(cells[1], f"line {n}"), n))
    return _finish(pairs)


def parse_workload_text(text: str) -> Workload:
    """JSON or CSV text (see the module docstring) -> :data:`Workload`."""
    head = text.lstrip()[:1]
    if head in ("{", "["):
        from a2a_tune.tuner.runtime.files import FileRefused, parse_json

        try:
            data = parse_json(text)  # the one JSON reader of the files a user points at
        except FileRefused as exc:
            raise WorkloadError(str(exc)) from None
        return parse_workload(data)
    return _parse_csv(text)


# path -> ((mtime_ns, size, inode), Workload or WorkloadError): engines ask once, the CLI
# once, a caller looping over shapes many times.
_CACHE: dict = {}


def clear_cache() -> None:
    _CACHE.clear()


def load_workload(path) -> Workload:
    """Read and parse a workload file (cached by path + mtime); raises :class:`WorkloadError`."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc.strerror or exc}", path=path) from None
    ident = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _CACHE.get(path)
    if hit is None or hit[0] != ident:
        from a2a_tune.tuner.runtime.files import MAX_WORKLOAD_BYTES, FileRefused, read_capped

        try:
            raw = read_capped(path, MAX_WORKLOAD_BYTES)
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise WorkloadError(f"not UTF-8 text (bad byte at offset {exc.start})") from None
            result = parse_workload_text(text)
        except OSError as exc:
            result = WorkloadError(f"cannot read: {exc.strerror or exc}")
        except FileRefused as exc:
            result = WorkloadError(str(exc))
        except WorkloadError as exc:
            result = exc
        except Exception as exc:  # defensive: still one line, still a WorkloadError
            result = WorkloadError(f"unexpected {one_line(exc)}")
        if isinstance(result, WorkloadError):
            result.path = path
        hit = _CACHE[path] = (ident, result)
    if isinstance(hit[1], WorkloadError):
        e = hit[1]
        raise WorkloadError(e.problem, where=e.where, path=e.path)
    return hit[1]
