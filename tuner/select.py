"""Selection: turn one sweep run's measurements into a profile (the default-selection table).

Flow position: probe -> sweep -> store -> **select** -> lookup. This module works on
plain data (mappings, or objects with the same attribute names) so it is testable
without a database; :func:`profile_from_store` at the bottom is the thin adapter to
``a2a_tune.db``.

Rules:

* One entry per shape (ep_size, hidden, topk, num_experts, dtype, routing). Its
  ``tokens`` are every token count per rank measured for that shape; each backend's
  ``median_us`` / ``p10_us`` / ``p90_us`` arrays align with them, null where the backend
  has no measurement (an "error" / "timeout" at that point, or never run there).
* A backend that failed the correctness check ("incorrect") at ANY token count of a
  shape is listed in that entry's ``failed`` and is never a winner for that shape --
  a backend that gives wrong answers is never selected. Its timings stay in the table
  for inspection; lookup ignores them too.
* "unavailable" failures without a shape go into every entry's ``failed``; with a
  (partial) shape, into the matching entries (a None shape key matches anything).
* A backend with no measurement at all for a shape and only "error"/"timeout"
  failures there is listed in ``failed`` as well, so the table says why it is absent.
* ``winners``: per token count the fastest non-failed backend by median, the
  runner-up and ``margin = runner_up / winner - 1``.
* A point measured twice (e.g. a resumed sweep) keeps the lower median.
* All measurements of a table share one timing mode (``run["timing"]``).

The file is ``profile_filename(fingerprint)`` from :mod:`a2a_tune.tuner.lookup` -- the
one key function shared with the reader -- and is written atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from a2a_tune.tuner.lookup import SCHEMA_VERSION, ProfileError, parse_profile, profile_filename

__all__ = [
    "SHAPE_KEYS",
    "build_profile",
    "validate_profile",
    "write_profile",
    "profile_from_store",
    "ProfileError",
]

log = logging.getLogger("a2a_tune")

#: Keys that identify an entry, in table order.
SHAPE_KEYS = ("ep_size", "hidden", "topk", "num_experts", "dtype", "routing")

_US_DECIMALS = 3
_MARGIN_DECIMALS = 4
# Precedence when one backend has several failures for one entry (lower wins).
_FAILURE_RANK = {"incorrect": 0, "unavailable": 1, "error": 2, "timeout": 3}


def _get(obj, key, default=None):
    """Mapping lookup with an attribute fallback (ORM rows, dataclasses)."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _one_line(text) -> str:
    return " ".join(str(text).split())


def _round_us(v: float) -> float:
    r = round(float(v), _US_DECIMALS)
    return r if r > 0 else float(v)  # never round a tiny positive time to 0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("a2a-tune")
    except Exception:
        return "unknown"


def _timestamp(v):
    """datetime -> 'YYYY-MM-DDTHH:MM:SS[.ffffff]Z' (naive datetimes are taken as UTC)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, _dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return v.isoformat() + "Z"
    return str(v)


def _shape_of(m) -> tuple:
    return tuple(_get(m, k) for k in SHAPE_KEYS)


def build_profile(
    measurements: Iterable,
    failures: Iterable,
    *,
    hardware: Mapping,
    run: Mapping,
    backend_names: Mapping,
    generated_at: _dt.datetime | str | None = None,
) -> dict:
    """Build a schema-1 profile dict from one run's measurements and failures.

    ``measurements``: mappings (or objects) with backend, num_experts, topk, hidden,
    dtype, ep_size, tokens_per_rank, routing, timing, median_us, p10_us, p90_us (extra
    keys ignored). ``failures``: backend, kind ("incorrect" | "unavailable" | "error" |
    "timeout"), reason, and shape keys / tokens_per_rank, any of which may be None.
    ``hardware``: fingerprint, facts_hash, facts. ``run``: id, device_type, world_size,
    versions, timing (derived from the measurements when absent), started_at,
    finished_at. ``backend_names``: backend -> {vllm_name, sglang_name} (mapping or
    object); a backend missing there gets nulls (with a warning).

    With no usable measurement the result has ``entries == []`` (callers check;
    :func:`write_profile` refuses it). Raises ``ValueError`` when the measurements mix
    timing modes. The result is not validated; :func:`write_profile` does that.
    """
    # shape -> backend -> tokens -> (median, p10, p90)
    points: dict = {}
    timings = set()
    seen_backends = set()
    for m in measurements:
        backend = _get(m, "backend")
        shape = _shape_of(m)
        t = _get(m, "tokens_per_rank")
        med = _get(m, "median_us")
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ValueError(f"measurement of {backend} at {shape}: tokens_per_rank={t!r} is not a positive integer")
        if med is None or not math.isfinite(med) or med <= 0:
            log.warning("a2a-tune select: ignoring %s %s at %s tokens/rank: median_us=%r", backend, shape, t, med)
            continue
        timing = _get(m, "timing")
        if timing is not None:
            timings.add(timing)
        seen_backends.add(backend)
        stats = (float(med), _opt_us(_get(m, "p10_us")), _opt_us(_get(m, "p90_us")))
        per_t = points.setdefault(shape, {}).setdefault(backend, {})
        if t not in per_t or stats[0] < per_t[t][0]:
            per_t[t] = stats
    run_out = _run_section(run, timings)

    failures = list(failures)
    seen_backends.update(_get(f, "backend") for f in failures)

    entries = []
    for shape in sorted(points, key=_shape_sort_key):
        entries.append(_build_entry(shape, points[shape], failures))

    backends_out = {}
    for b in sorted(seen_backends):
        spec = backend_names.get(b) if isinstance(backend_names, Mapping) else None
        if spec is None:
            log.warning("a2a-tune select: no engine names for backend %r; writing null literals", b)
        backends_out[b] = {
            "vllm_name": _get(spec, "vllm_name") if spec is not None else None,
            "sglang_name": _get(spec, "sglang_name") if spec is not None else None,
        }

    if generated_at is None:
        generated_at = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    return {
        "schema": SCHEMA_VERSION,
        "generated_by": f"a2a-tune {_version()}",
        "generated_at": _timestamp(generated_at),
        "hardware": {
            "fingerprint": _get(hardware, "fingerprint"),
            "facts_hash": _get(hardware, "facts_hash"),
            "facts": _get(hardware, "facts"),
        },
        "run": run_out,
        "backends": backends_out,
        "entries": entries,
    }


def _opt_us(v):
    if v is None or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def _shape_sort_key(shape: tuple) -> tuple:
    ep, hidden, topk, ne, dtype, routing = shape
    return (ep, str(dtype), hidden, topk, ne, str(routing))


def _run_section(run, timings: set) -> dict:
    out = {}
    if isinstance(run, Mapping):
        out.update(run)  # keep extra keys (git sha, status, ...)
    for key in ("id", "device_type", "world_size", "versions", "timing", "started_at", "finished_at"):
        if key not in out:
            out[key] = _get(run, key)
    out["versions"] = {str(k): (None if v is None else str(v)) for k, v in dict(out.get("versions") or {}).items()}
    for key, value in out.items():
        if isinstance(value, _dt.datetime) or key in ("started_at", "finished_at"):
            out[key] = _timestamp(value)
    timing = out.get("timing")
    if timing is None:
        if len(timings) > 1:
            raise ValueError(f"measurements mix timing modes {sorted(timings)}; select one mode per table")
        timing = next(iter(timings), None)
    elif timings - {timing}:
        raise ValueError(f"run timing is {timing!r} but measurements include {sorted(timings - {timing})}")
    out["timing"] = timing
    return out


def _failure_applies(f, shape: tuple) -> bool:
    return all(_get(f, k) is None or _get(f, k) == v for k, v in zip(SHAPE_KEYS, shape))


def _failure_text(f) -> str:
    kind = _get(f, "kind") or "error"
    t = _get(f, "tokens_per_rank")
    at = f" at {t} tokens/rank" if t is not None else ""
    reason = _one_line(_get(f, "reason") or "no reason recorded")
    return f"{kind}{at}: {reason}"


def _build_entry(shape: tuple, per_backend: dict, failures: list) -> dict:
    tokens = sorted({t for per_t in per_backend.values() for t in per_t})

    failed: dict = {}  # backend -> (rank, text)
    for f in failures:
        if not _failure_applies(f, shape):
            continue
        b, kind = _get(f, "backend"), _get(f, "kind")
        if kind in ("error", "timeout") and b in per_backend:
            continue  # just a null at that point
        rank = _FAILURE_RANK.get(kind, len(_FAILURE_RANK))
        if b not in failed or rank < failed[b][0]:
            failed[b] = (rank, _failure_text(f))

    backends = {}
    for b in sorted(per_backend):
        per_t = per_backend[b]
        cols = [per_t.get(t) for t in tokens]
        backends[b] = {
            "median_us": [None if c is None else _round_us(c[0]) for c in cols],
            "p10_us": [None if c is None or c[1] is None else _round_us(c[1]) for c in cols],
            "p90_us": [None if c is None or c[2] is None else _round_us(c[2]) for c in cols],
        }

    winners = []
    for j, t in enumerate(tokens):
        ranked = sorted(
            (backends[b]["median_us"][j], b)
            for b in backends
            if b not in failed and backends[b]["median_us"][j] is not None
        )
        if not ranked:
            continue
        (w_us, w), rest = ranked[0], ranked[1:]
        winners.append(
            {
                "tokens": t,
                "backend": w,
                "median_us": w_us,
                "runner_up": rest[0][1] if rest else None,
                "margin": round(rest[0][0] / w_us - 1, _MARGIN_DECIMALS) if rest else None,
            }
        )

    entry = dict(zip(SHAPE_KEYS, shape))
    entry.update(
        source="measured",
        tokens=tokens,
        backends=backends,
        winners=winners,
        failed={b: text for b, (_, text) in sorted(failed.items())},
    )
    return entry


# ----------------------------------------------------------------- validate / write


@lru_cache(maxsize=1)
def _validator():
    import jsonschema
    from importlib.resources import files

    schema = json.loads(files("a2a_tune.profiles").joinpath("schema-v1.json").read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _json_path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "top level"


def validate_profile(profile: dict) -> None:
    """Check ``profile`` against profiles/schema-v1.json, then the reader's own checks.

    Raises :class:`ProfileError` naming the JSON path of the first error, e.g.
    ``entries[0].backends.nccl_all2allv.median_us[2]: -1.0 is not valid under any of the given schemas``.
    """
    from jsonschema.exceptions import best_match

    err = best_match(_validator().iter_errors(profile))
    if err is not None:
        raise ProfileError(_one_line(err.message), field=_json_path(err.absolute_path))
    # Cross-field rules JSON Schema cannot state (array lengths, known backends...):
    # whatever is written must load in lookup.
    parse_profile(profile)


def _scalar(v) -> str:
    return json.dumps(v, allow_nan=False, ensure_ascii=False)


def _dumps(v, level: int = 0) -> str:
    """Pretty JSON with sorted keys, one line per curve / winner / flat object.

    Same data as ``json.dumps(indent=2, sort_keys=True)`` but a curve such as
    ``"median_us": [41.2, 43.0, null]`` stays on one line, so profiles stay short and
    ``diff`` between two profiles shows one changed line per changed curve.
    """
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        keys = sorted(v, key=str)
        if all(not isinstance(v[k], (Mapping, list, tuple)) for k in keys):
            return "{" + ", ".join(f"{_scalar(str(k))}: {_scalar(v[k])}" for k in keys) + "}"
        body = ",\n".join(f"{inner}{_scalar(str(k))}: {_dumps(v[k], level + 1)}" for k in keys)
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        if all(not isinstance(x, (Mapping, list, tuple)) for x in v):
            return "[" + ", ".join(_scalar(x) for x in v) + "]"
        body = ",\n".join(f"{inner}{_dumps(x, level + 1)}" for x in v)
        return "[\n" + body + "\n" + pad + "]"
    return _scalar(v)


def write_profile(profile: dict, directory: Path) -> Path:
    """Validate, then atomically write ``directory / profile_filename(fingerprint)``.

    The JSON is pretty-printed with sorted keys (curves one per line). The temporary file lives in the same
    directory and is moved into place with ``os.replace``, so a reader (an engine
    starting up) sees either the old file or the new one, never a partial one.
    """
    validate_profile(profile)
    directory = Path(directory)
    target = directory / profile_filename(profile["hardware"]["fingerprint"])
    try:
        text = _dumps(profile) + "\n"
    except ValueError as exc:  # NaN / inf slipped past validation
        raise ProfileError(str(exc)) from None
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; engines often run as another user than the tuner.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename durable too (best effort; not all filesystems allow it)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return target


# ------------------------------------------------------------------ store adapter
# Kept apart on purpose: the only place that knows the store's API (a2a_tune.db).


def profile_from_store(store, run_id, *, backend_names: Mapping) -> dict:
    """Build the profile for ``run_id`` from a store.

    Assumes ``store.measurements(run_id)``, ``store.failures(run_id)``,
    ``store.get_run(run_id)`` and ``store.hardware_for_run(run_id)`` returning objects
    (or mappings) whose attribute names are the keys :func:`build_profile` documents.
    """
    run = store.get_run(run_id)
    hw = store.hardware_for_run(run_id)
    run_section = {
        "id": _get(run, "id", run_id),
        "device_type": _get(run, "device_type"),
        "world_size": _get(run, "world_size"),
        "versions": _get(run, "versions") or {},
        "timing": _get(run, "timing"),
        "started_at": _get(run, "started_at"),
        "finished_at": _get(run, "finished_at"),
    }
    hardware = {
        "fingerprint": _get(hw, "fingerprint"),
        "facts_hash": _get(hw, "facts_hash"),
        "facts": _get(hw, "facts"),
    }
    return build_profile(
        store.measurements(run_id),
        store.failures(run_id),
        hardware=hardware,
        run=run_section,
        backend_names=backend_names,
    )
