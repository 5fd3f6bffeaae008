"""Runtime lookup: which all2all backend should this engine use on this machine?

Called by serving engines at start-up (directly, through the ``a2a-tune lookup`` CLI,
or through the vLLM plugin). Three promises shape this module:

* **Standard library only.** Importing it must not pull in torch, SQLAlchemy, pynvml,
  jsonschema, rich or ``a2a_tune.kernels``; the import takes a few milliseconds and a
  warm :func:`lookup` a few microseconds (profiles are cached by path + mtime, and
  answers are cached per profile).
* **Never raises.** Any problem -- no profile, unreadable file, truncated or garbled
  JSON, another schema version, a field of the wrong type, a NaN / negative / missing
  timing, an empty table, a table for other hardware, a shape the table does not
  cover -- yields the documented fallback :data:`FALLBACK_BACKEND`
  (``allgather_reducescatter``, vLLM's own default) and ONE warning on the
  ``"a2a_tune"`` logger: a single line naming the file and the problem. The same
  problem is not reported twice in one process.
* **One key function.** :func:`profile_filename` names the file for both the writer
  (``a2a_tune.tuner.select``) and this reader.

Search order for ``<fingerprint>.json`` (first file found is used; a broken file is
reported, not skipped, so an override never hides silently behind the packaged one)::

    $A2A_TUNE_PROFILE_DIR   (several directories allowed, separated by os.pathsep)
    packaged a2a_tune/profiles/

Lookup rule, for a request (ep_size, hidden, topk, num_experts, dtype, routing, tokens):

1. **Shape.** An entry with exactly this shape is used ("exact"). Otherwise only
   entries with the same ``ep_size`` and ``dtype`` are candidates (no candidate ->
   fallback) and the nearest one by::

       distance = |log2(hidden/hidden')| + |log2(topk/topk')|
                + |log2(num_experts/num_experts')| + (0.5 if routing differs)

   is used ("nearest-shape"); ties go to the larger hidden, then the larger
   num_experts, then the larger topk, then the earlier entry.
2. **Tokens** (per rank). Each backend's measured median curve is interpolated
   piecewise-linearly in log(tokens)-log(µs) between the two measured token counts
   that bracket the request; below the first / above the last token count of the
   entry the end value is used (clamped). A backend competes only where the
   point(s) it needs were measured for it: both bracketing points, the point itself
   when the request is on the grid, the end point when clamped -- so beyond its last
   measured point it does not compete. Backends listed in the entry's ``failed``
   (e.g. failed the correctness check) never compete.
3. The smallest predicted time wins (ties: backend name). Engine literals
   (``vllm_name`` / ``sglang_name``) come from the profile's top-level ``backends``
   section, not from code. With ``engine="vllm"`` / ``"sglang"`` only backends that
   engine has a literal for compete.

Fingerprint: ``lookup(fingerprint=...)``, else ``$A2A_TUNE_FINGERPRINT``, else the
topology probe (``a2a_tune.tuner.probe``, imported lazily; it imports pynvml). Engines
that want a torch/pynvml-free start-up pass the fingerprint or set the variable.
"""

from __future__ import annotations

import bisect
import json
import math
import operator
import os
import re
from collections import namedtuple
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

# logging and pathlib are imported where used: together they are about half of this
# module's import time in a fresh interpreter, and the happy path needs neither.

__all__ = [
    "FALLBACK_BACKEND",
    "SCHEMA_VERSION",
    "PROFILE_DIR_ENV",
    "FINGERPRINT_ENV",
    "Choice",
    "Profile",
    "ProfileEntry",
    "ProfileError",
    "Shape",
    "clear_cache",
    "find_profile",
    "load_profile",
    "lookup",
    "normalize_fingerprint",
    "parse_profile",
    "profile_filename",
    "profile_search_paths",
    "shape_distance",
]

#: vLLM's own default (``--all2all-backend``); used whenever the table cannot answer.
FALLBACK_BACKEND = "allgather_reducescatter"
#: The only profile schema version this reader understands.
SCHEMA_VERSION = 1
PROFILE_DIR_ENV = "A2A_TUNE_PROFILE_DIR"
FINGERPRINT_ENV = "A2A_TUNE_FINGERPRINT"

# Lowercase letters, digits, '.', '_', '-'; must start with a letter or digit so a
# fingerprint can never name a hidden file, '.' or '..'.
_FINGERPRINT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,199}\Z")


class ProfileError(ValueError):
    """A profile that cannot be used. ``str()`` is one line: ``[file: ][field: ]problem``."""

    def __init__(self, problem: str, *, field: str | None = None, path: str | None = None):
        self.problem = " ".join(str(problem).split())  # force one line
        self.field = field
        self.path = path
        super().__init__(self.problem)

    def __str__(self) -> str:
        parts = [p for p in (self.path, self.field) if p]
        return ": ".join(parts + [self.problem])


#: Model shape of one table entry (everything but the token count).
Shape = namedtuple("Shape", "ep_size hidden topk num_experts dtype routing")


def _describe_shape(s: Shape) -> str:
    return (
        f"ep_size={s.ep_size} hidden={s.hidden} topk={s.topk} "
        f"num_experts={s.num_experts} dtype={s.dtype} routing={s.routing}"
    )


@dataclass(frozen=True)
class ProfileEntry:
    """One validated table entry: a shape and each backend's median curve over tokens."""

    shape: Shape
    source: str  # "measured" or "predicted"
    tokens: tuple  # ascending token counts per rank
    median_us: MappingProxyType  # backend -> tuple[float | None, ...] aligned with tokens
    failed: MappingProxyType  # backend -> one-line reason; never selected


@dataclass(frozen=True)
class Profile:
    """A validated profile: only what lookup needs (see ``load_profile``)."""

    path: str | None
    fingerprint: str
    backends: MappingProxyType  # backend -> (vllm_name, sglang_name)
    entries: tuple  # tuple[ProfileEntry, ...]
    by_shape: MappingProxyType = field(repr=False, compare=False)  # Shape -> ProfileEntry


@dataclass(frozen=True)
class Choice:
    """The answer of :func:`lookup`.

    ``match`` is ``"exact"``, ``"nearest-shape"`` or ``"fallback"``; ``reason`` is one
    line saying which profile, shape and token rule produced it (or what went wrong);
    ``source`` the profile path or None; ``expected_us`` each competing backend's
    predicted median µs at the requested token count (empty on fallback);
    ``entry_shape`` the table shape that was used, or None.
    """

    backend: str
    vllm_name: str | None
    sglang_name: str | None
    match: str
    reason: str
    source: str | None = None
    expected_us: MappingProxyType = field(default_factory=dict, hash=False)
    entry_shape: Shape | None = None

    def __post_init__(self) -> None:
        # Choices are cached and shared between callers: keep them read-only.
        if not isinstance(self.expected_us, MappingProxyType):
            object.__setattr__(self, "expected_us", MappingProxyType(dict(self.expected_us)))

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (used by ``a2a-tune lookup --format json``)."""
        return {
            "backend": self.backend,
            "vllm_name": self.vllm_name,
            "sglang_name": self.sglang_name,
            "match": self.match,
            "reason": self.reason,
            "source": self.source,
            "expected_us": dict(self.expected_us),
            "entry_shape": dict(self.entry_shape._asdict()) if self.entry_shape else None,
        }


# --------------------------------------------------------------------------- naming


def normalize_fingerprint(fingerprint: str) -> str:
    """Return the canonical (lowercase) fingerprint or raise ``ValueError``.

    Case is folded; any character outside ``[a-z0-9._-]`` is rejected rather than
    rewritten, so two different fingerprints can never share one file.
    """
    if not isinstance(fingerprint, str):
        raise ValueError(f"hardware fingerprint must be a string, got {type(fingerprint).__name__}")
    norm = fingerprint.strip().lower()
    if not _FINGERPRINT_RE.match(norm):
        raise ValueError(
            f"invalid hardware fingerprint {fingerprint!r}: use 1-200 characters "
            "[a-z0-9._-], starting with a letter or digit"
        )
    return norm


def profile_filename(fingerprint: str) -> str:
    """THE file name of a fingerprint's profile, shared by the writer and the reader."""
    return f"{normalize_fingerprint(fingerprint)}.json"


@lru_cache(maxsize=None)
def _packaged_dir() -> str | None:
    """Directory of the packaged profiles (``a2a_tune.profiles``), or None."""
    try:
        from importlib.resources import files

        return os.fspath(files("a2a_tune.profiles"))
    except Exception:  # not installed as plain files (zip, namespace package...)
        here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")
        return here if os.path.isdir(here) else None


def user_profile_dir() -> str:
    """Where `a2a-tune select` / `run` write by default: this machine's own measured tables."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "a2a-tune", "profiles")


def _search_dirs() -> list:
    dirs = []
    env = os.environ.get(PROFILE_DIR_ENV)
    if env:
        dirs.extend(os.path.expanduser(d) for d in env.split(os.pathsep) if d.strip())
    dirs.append(user_profile_dir())
    packaged = _packaged_dir()
    if packaged:
        dirs.append(packaged)
    return dirs


def profile_search_paths() -> list:
    """Directories searched for profiles, in order: ``$A2A_TUNE_PROFILE_DIR`` entries, the
    user's own (``user_profile_dir()``, where ``a2a-tune run`` writes), the packaged ones."""
    from pathlib import Path

    return [Path(d) for d in _search_dirs()]


def _find(fingerprint: str) -> tuple:
    """(path or None, list of every path tried) for an already normalised fingerprint."""
    name = f"{fingerprint}.json"
    tried = []
    for d in _search_dirs():
        p = os.path.join(d, name)
        tried.append(p)
        if os.path.isfile(p):
            return p, tried
    return None, tried


def _miss_message(fingerprint: str, tried: list) -> str:
    return f"no profile for fingerprint {fingerprint!r}; searched: {', '.join(tried) or '(no directories)'}"


def find_profile(fingerprint: str) -> Path | None:
    """Path of the profile for ``fingerprint`` in search order; None (and a warning) on a miss."""
    try:
        fp = normalize_fingerprint(fingerprint)
    except ValueError as exc:
        _warn_once(str(exc))
        return None
    path, tried = _find(fp)
    if path is None:
        _warn_once(_fallback_message(_miss_message(fp, tried)))
        return None
    from pathlib import Path

    return Path(path)


# ----------------------------------------------------------------------- validation


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_pos_finite(v) -> bool:
    return _is_num(v) and math.isfinite(v) and v > 0


def _is_pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _obj(v, where: str) -> dict:
    if not isinstance(v, dict):
        raise ProfileError(f"expected a JSON object, got {_jtype(v)}", field=where)
    return v


def _jtype(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if _is_num(v):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _opt_str(v, where: str):
    if v is not None and not isinstance(v, str):
        raise ProfileError(f"expected a string or null, got {_jtype(v)}", field=where)
    return v


def parse_profile(data, path: str | None = None) -> Profile:
    """Validate decoded profile JSON (exactly the fields lookup relies on) -> :class:`Profile`.

    Raises :class:`ProfileError` naming the first bad field, e.g.
    ``entries[3].backends.nccl_all2allv.median_us[2]: not a positive finite number``.
    Hand-written on purpose: jsonschema is too slow and heavy for engine start-up; the
    writer checks the full JSON Schema (profiles/schema-v1.json) as well as this.
    """
    try:
        return _parse(data, path)
    except ProfileError as exc:
        if exc.path is None and path is not None:
            exc.path = path
        raise


def _parse(data, path) -> Profile:
    top = _obj(data, "top level")
    if "schema" not in top:
        raise ProfileError("missing", field="schema")
    schema = top["schema"]
    if schema != SCHEMA_VERSION or not _is_num(schema):
        raise ProfileError(
            f"unsupported version {schema!r} (this a2a-tune reads schema {SCHEMA_VERSION})", field="schema"
        )
    hw = _obj(top.get("hardware"), "hardware")
    fp = hw.get("fingerprint")
    if not isinstance(fp, str):
        raise ProfileError(f"expected a string, got {_jtype(fp)}", field="hardware.fingerprint")
    try:
        fp = normalize_fingerprint(fp)
    except ValueError as exc:
        raise ProfileError(str(exc), field="hardware.fingerprint") from None

    backends = {}
    for name, spec in _obj(top.get("backends"), "backends").items():
        where = f"backends.{name}"
        spec = _obj(spec, where)
        backends[name] = (
            _opt_str(spec.get("vllm_name"), f"{where}.vllm_name"),
            _opt_str(spec.get("sglang_name"), f"{where}.sglang_name"),
        )

    raw_entries = top.get("entries")
    if not isinstance(raw_entries, list):
        raise ProfileError(f"expected an array, got {_jtype(raw_entries)}", field="entries")
    if not raw_entries:
        raise ProfileError("empty table (no entries)", field="entries")

    entries = []
    by_shape = {}
    for i, raw in enumerate(raw_entries):
        entry = _parse_entry(raw, f"entries[{i}]", backends)
        if entry.shape in by_shape:
            j = entries.index(by_shape[entry.shape])
            raise ProfileError(f"same shape as entries[{j}]", field=f"entries[{i}]")
        by_shape[entry.shape] = entry
        entries.append(entry)
    return Profile(
        path=path,
        fingerprint=fp,
        backends=MappingProxyType(backends),
        entries=tuple(entries),
        by_shape=MappingProxyType(by_shape),
    )


def _parse_entry(raw, where: str, backends: dict) -> ProfileEntry:
    e = _obj(raw, where)
    ints = []
    for key in ("ep_size", "hidden", "topk", "num_experts"):
        v = e.get(key)
        if not _is_pos_int(v):
            raise ProfileError(f"not a positive integer ({v!r})", field=f"{where}.{key}")
        ints.append(v)
    strs = []
    for key in ("dtype", "routing"):
        v = e.get(key)
        if not isinstance(v, str) or not v:
            raise ProfileError(f"not a non-empty string ({v!r})", field=f"{where}.{key}")
        strs.append(v)
    shape = Shape(*ints, *strs)

    source = e.get("source", "measured")
    if source not in ("measured", "predicted"):
        raise ProfileError(f"expected 'measured' or 'predicted', got {source!r}", field=f"{where}.source")

    tokens = e.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ProfileError("expected a non-empty array of token counts", field=f"{where}.tokens")
    for j, t in enumerate(tokens):
        if not _is_pos_int(t):
            raise ProfileError(f"not a positive integer ({t!r})", field=f"{where}.tokens[{j}]")
        if j and t <= tokens[j - 1]:
            raise ProfileError("token counts must be strictly ascending", field=f"{where}.tokens[{j}]")
    n = len(tokens)

    medians = {}
    for name, curve in _obj(e.get("backends"), f"{where}.backends").items():
        bwhere = f"{where}.backends.{name}"
        if name not in backends:
            raise ProfileError("backend not declared in the top-level 'backends'", field=bwhere)
        med = _obj(curve, bwhere).get("median_us")
        if not isinstance(med, list) or len(med) != n:
            raise ProfileError(f"expected an array of {n} values (one per token count)", field=f"{bwhere}.median_us")
        for j, v in enumerate(med):
            if v is not None and not _is_pos_finite(v):
                raise ProfileError("not a positive finite number", field=f"{bwhere}.median_us[{j}]")
        medians[name] = tuple(None if v is None else float(v) for v in med)

    failed = {}
    for name, reason in _obj(e.get("failed", {}), f"{where}.failed").items():
        if not isinstance(reason, str):
            raise ProfileError(f"expected a string reason, got {_jtype(reason)}", field=f"{where}.failed.{name}")
        failed[name] = reason

    # Winners are informational for lookup (it re-derives them from the curves), but a
    # table whose winners name unknown backends or token counts is corrupt: refuse it.
    winners = e.get("winners", [])
    if not isinstance(winners, list):
        raise ProfileError(f"expected an array, got {_jtype(winners)}", field=f"{where}.winners")
    token_set = set(tokens)
    for j, w in enumerate(winners):
        wwhere = f"{where}.winners[{j}]"
        w = _obj(w, wwhere)
        if not _is_pos_int(w.get("tokens")) or w.get("tokens") not in token_set:
            raise ProfileError(f"{w.get('tokens')!r} is not one of the entry's token counts", field=f"{wwhere}.tokens")
        b = w.get("backend")
        if not isinstance(b, str) or b not in medians:
            raise ProfileError(f"unknown backend {b!r}", field=f"{wwhere}.backend")
        if b in failed:
            raise ProfileError(f"backend {b!r} is listed in 'failed'", field=f"{wwhere}.backend")
        if not _is_pos_finite(w.get("median_us")):
            raise ProfileError("not a positive finite number", field=f"{wwhere}.median_us")
        ru = w.get("runner_up")
        if ru is not None and (not isinstance(ru, str) or ru not in medians):
            raise ProfileError(f"unknown backend {ru!r}", field=f"{wwhere}.runner_up")
        margin = w.get("margin")
        if margin is not None and not (_is_num(margin) and math.isfinite(margin) and margin >= 0):
            raise ProfileError("not a finite number >= 0 or null", field=f"{wwhere}.margin")

    return ProfileEntry(
        shape=shape,
        source=source,
        tokens=tuple(tokens),
        median_us=MappingProxyType(medians),
        failed=MappingProxyType(failed),
    )


# -------------------------------------------------------------------------- loading


class _Loaded:
    """Cache slot for one (path, file identity): a Profile or the error, plus answers."""

    __slots__ = ("profile", "error", "choices")

    def __init__(self, profile, error):
        self.profile = profile
        self.error = error
        self.choices = {}


# (path) -> (identity, _Loaded); identity = (st_mtime_ns, st_size, st_ino), so a
# rewritten file (select writes via os.replace: new inode) is re-read.
_CACHE: dict = {}
_MAX_CACHED_CHOICES = 4096  # answers kept per profile
_WARNED: set = set()
_PROBED: list = []  # [(fingerprint or None, problem or None)] once probed


def clear_cache() -> None:
    """Forget loaded profiles, cached answers, the probed fingerprint and warnings already given."""
    _CACHE.clear()
    _WARNED.clear()
    _PROBED.clear()


def _read_and_parse(path: str) -> Profile:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}", path=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"not UTF-8 text (bad byte at offset {exc.start})", path=path) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", path=path
        ) from None
    except RecursionError:
        raise ProfileError("invalid JSON: nested too deeply", path=path) from None
    return parse_profile(data, path)


def _load_cached(path: str) -> _Loaded:
    try:
        st = os.stat(path)
    except OSError as exc:
        return _Loaded(None, ProfileError(f"cannot read: {exc.strerror or exc}", path=path))
    ident = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == ident:
        return hit[1]
    try:
        slot = _Loaded(_read_and_parse(path), None)
    except ProfileError as exc:
        slot = _Loaded(None, exc)
    except Exception as exc:  # defensive: anything else is still a bad profile
        slot = _Loaded(None, ProfileError(f"unexpected {type(exc).__name__}: {exc}", path=path))
    _CACHE[path] = (ident, slot)
    return slot


def load_profile(path) -> Profile:
    """Read and validate a profile file; raises :class:`ProfileError` (one line) if unusable.

    Results are cached by (path, mtime, size, inode).
    """
    slot = _load_cached(os.fspath(path))
    if slot.error is not None:
        e = slot.error
        raise ProfileError(e.problem, field=e.field, path=e.path)
    return slot.profile


# --------------------------------------------------------------------------- lookup


def _fallback_message(problem: str) -> str:
    return f"{problem}; using fallback all2all backend {FALLBACK_BACKEND!r}"


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import logging

        logging.getLogger("a2a_tune").warning("a2a-tune: %s", message)


def _fallback(problem: str, source: str | None = None) -> Choice:
    message = _fallback_message(problem)
    _warn_once(message)
    return Choice(
        backend=FALLBACK_BACKEND,
        vllm_name=FALLBACK_BACKEND,
        sglang_name=None,  # SGLang: keep the engine's own default
        match="fallback",
        reason=message,
        source=source,
    )


def _resolve_fingerprint(fingerprint):
    """(normalised fingerprint, None) or (None, problem)."""
    if fingerprint is None:
        fingerprint = os.environ.get(FINGERPRINT_ENV) or None
    if fingerprint is None:
        if not _PROBED:
            try:
                from a2a_tune.tuner.probe import probe  # lazy: imports pynvml

                _PROBED.append((normalize_fingerprint(probe().fingerprint), None))
            except Exception as exc:
                _PROBED.append((None, f"hardware probe failed ({type(exc).__name__}: {exc}); "
                                      f"pass fingerprint= or set {FINGERPRINT_ENV}"))
        return _PROBED[0]
    try:
        return normalize_fingerprint(fingerprint), None
    except ValueError as exc:
        return None, str(exc)


# engine -> index into Profile.backends' (vllm_name, sglang_name); None: no restriction.
_ENGINES = {None: None, "vllm": 0, "sglang": 1}


def _as_int(v):
    """int(v) for ints and integer-like objects (numpy ints); None for bools and the rest."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _check_args(ints: dict, strs: dict):
    """(problem or None, normalised ints in order)."""
    out = []
    for name, v in ints.items():
        i = _as_int(v)
        low = 0 if name == "tokens" else 1
        if i is None or i < low:
            return f"invalid lookup argument {name}={v!r} (expected an integer >= {low})", None
        out.append(i)
    for name, v in strs.items():
        if not isinstance(v, str):
            return f"invalid lookup argument {name}={v!r} (expected a string)", None
    return None, out


def lookup(
    *,
    ep_size: int,
    hidden: int,
    topk: int,
    num_experts: int,
    tokens: int,
    dtype: str = "bf16",
    routing: str = "uniform",
    fingerprint: str | None = None,
    profile: str | os.PathLike | None = None,
    engine: str | None = None,
) -> Choice:
    """Pick the all2all backend for this shape at ``tokens`` tokens per rank. Never raises.

    ``profile`` names a file directly (its fingerprint is then only checked when
    ``fingerprint`` is given too); otherwise the profile of ``fingerprint`` (or
    ``$A2A_TUNE_FINGERPRINT``, or the probed one) is searched for. ``engine``
    (``"vllm"`` or ``"sglang"``) lets only backends that engine has a literal for
    compete, so a faster backend the engine cannot express does not push the answer
    to the fallback. See the module docstring for the shape distance and token
    interpolation rules.
    """
    try:
        return _lookup(ep_size, hidden, topk, num_experts, tokens, dtype, routing, fingerprint, profile, engine)
    except Exception as exc:  # never crash the engine
        return _fallback(f"internal error in a2a-tune lookup ({type(exc).__name__}: {exc})")


def _lookup(ep_size, hidden, topk, num_experts, tokens, dtype, routing, fingerprint, profile, engine) -> Choice:
    problem, ints = _check_args(
        {"ep_size": ep_size, "hidden": hidden, "topk": topk, "num_experts": num_experts, "tokens": tokens},
        {"dtype": dtype, "routing": routing},
    )
    if problem is None and engine not in _ENGINES:
        problem = f"invalid lookup argument engine={engine!r} (expected one of {', '.join(map(repr, _ENGINES))})"
    if problem:
        return _fallback(problem)
    ep_size, hidden, topk, num_experts, tokens = ints

    if profile is not None:
        path = os.fspath(profile)
        expected = None
        if fingerprint is not None:
            try:
                expected = normalize_fingerprint(fingerprint)
            except ValueError as exc:
                return _fallback(str(exc), path)
    else:
        expected, problem = _resolve_fingerprint(fingerprint)
        if problem:
            return _fallback(problem)
        path, tried = _find(expected)
        if path is None:
            return _fallback(_miss_message(expected, tried))

    slot = _load_cached(path)
    if slot.error is not None:
        return _fallback(str(slot.error), path)
    prof = slot.profile
    if expected is not None and prof.fingerprint != expected:
        return _fallback(
            f"{path}: hardware.fingerprint: profile is for {prof.fingerprint!r}, this machine is {expected!r}",
            path,
        )

    key = (ep_size, hidden, topk, num_experts, tokens, dtype, routing, engine)
    choice = slot.choices.get(key)
    if choice is None:
        choice = _choose(prof, path, Shape(ep_size, hidden, topk, num_experts, dtype, routing), tokens, engine)
        if len(slot.choices) >= _MAX_CACHED_CHOICES:  # e.g. a caller sweeping every token count
            slot.choices.clear()
        slot.choices[key] = choice
    elif choice.match == "fallback":
        _warn_once(choice.reason)
    return choice


def shape_distance(a: Shape, b: Shape) -> float:
    """The documented nearest-shape distance (only meaningful for equal ep_size and dtype)."""
    d = (
        abs(math.log2(a.hidden / b.hidden))
        + abs(math.log2(a.topk / b.topk))
        + abs(math.log2(a.num_experts / b.num_experts))
    )
    return d + (0.5 if a.routing != b.routing else 0.0)


def _choose(prof: Profile, path: str, want: Shape, tokens: int, engine: str | None) -> Choice:
    fname = os.path.basename(path)
    entry = prof.by_shape.get(want)
    if entry is not None:
        match, shape_text = "exact", "exact shape"
    else:
        ranked = sorted(
            (
                (round(shape_distance(want, e.shape), 9), -e.shape.hidden, -e.shape.num_experts, -e.shape.topk, i)
                for i, e in enumerate(prof.entries)
                if e.shape.ep_size == want.ep_size and e.shape.dtype == want.dtype
            )
        )
        if not ranked:
            have = sorted({f"ep_size={e.shape.ep_size}/dtype={e.shape.dtype}" for e in prof.entries})
            return _fallback(
                f"{path}: no entry for ep_size={want.ep_size} dtype={want.dtype} "
                f"(table has {', '.join(have)})",
                path,
            )
        dist, *_, idx = ranked[0]
        entry = prof.entries[idx]
        match = "nearest-shape"
        shape_text = f"nearest shape {_describe_shape(entry.shape)} (distance {dist:.2f}) for requested {_describe_shape(want)}"
    if entry.source != "measured":
        shape_text += f" [{entry.source}]"

    times, where = _estimate(entry, tokens)
    usable = {b: round(v, 3) for b, v in times.items() if b not in entry.failed}
    if engine is not None:
        name_idx = _ENGINES[engine]
        usable = {b: v for b, v in usable.items() if prof.backends[b][name_idx] is not None}
    if not usable:
        return _fallback(
            f"{path}: {shape_text}: no usable backend{f' with a {engine} name' if engine else ''} {where}"
            + (f" (failed: {', '.join(sorted(entry.failed))})" if entry.failed else ""),
            path,
        )
    ranked_b = sorted(usable.items(), key=lambda kv: (kv[1], kv[0]))
    best, best_us = ranked_b[0]
    if len(ranked_b) > 1:
        ru, ru_us = ranked_b[1]
        vs = f"{best} {best_us:.3f} us, runner-up {ru} {ru_us:.3f} us (+{(ru_us / best_us - 1) * 100:.1f}%)"
    else:
        vs = f"{best} {best_us:.3f} us, no other backend competes"
    vllm_name, sglang_name = prof.backends[best]
    return Choice(
        backend=best,
        vllm_name=vllm_name,
        sglang_name=sglang_name,
        match=match,
        reason=f"profile {fname}, {shape_text}, {where}: {vs}",
        source=path,
        expected_us=usable,
        entry_shape=entry.shape,
    )


def _estimate(entry: ProfileEntry, tokens: int) -> tuple:
    """({backend: predicted median µs} for backends measured where needed, description)."""
    grid = entry.tokens
    n = len(grid)
    if tokens <= grid[0] or tokens >= grid[-1]:
        j = 0 if tokens <= grid[0] else n - 1
        if tokens == grid[j]:
            where = f"at {tokens} tokens/rank (measured)"
        else:
            where = f"clamped to {grid[j]} tokens/rank (requested {tokens})"
        return {b: m[j] for b, m in entry.median_us.items() if m[j] is not None}, where
    hi = bisect.bisect_left(grid, tokens)
    if grid[hi] == tokens:
        return (
            {b: m[hi] for b, m in entry.median_us.items() if m[hi] is not None},
            f"at {tokens} tokens/rank (measured)",
        )
    lo = hi - 1
    t0, t1 = grid[lo], grid[hi]
    f = math.log(tokens / t0) / math.log(t1 / t0)
    out = {}
    for b, m in entry.median_us.items():
        v0, v1 = m[lo], m[hi]
        if v0 is not None and v1 is not None:
            out[b] = math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
    return out, f"interpolated at {tokens} tokens/rank between {t0} and {t1}"
