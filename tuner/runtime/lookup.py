"""Runtime lookup: which all2all backend should this engine use on this machine?

Called by serving engines at start-up (directly, through the ``a2a-tune lookup`` CLI,
or through the vLLM plugin :mod:`a2a_tune.tuner.runtime.vllm_plugin`). Three promises shape
this module:

* **Standard library only.** Importing it must not pull in torch, SQLAlchemy, pynvml,
  jsonschema, rich or ``a2a_tune.kernels``; the import takes a few milliseconds and a
  warm :func:`lookup` tens of microseconds (profiles are cached by path + mtime, and
  answers are cached per profile). ``bench/startup.py`` measures both.
* **Never raises.** Any problem -- no profile, unreadable file, truncated or garbled
  JSON, another schema version, a field of the wrong type, a NaN / negative / missing
  timing, an empty table, a table for other hardware, a shape the table does not
  cover, a bad workload file -- yields the documented fallback :data:`FALLBACK_BACKEND`
  (``allgather_reducescatter``, vLLM's own default) and ONE warning on the
  ``"a2a_tune"`` logger: a single line naming the file and the problem. The same
  problem is not reported twice in one process (``quiet=True``: no warning at all; the
  caller reports ``Choice.reason`` itself).
* **One key function.** :func:`profile_filename` names the file for both the writer
  (``a2a_tune.tuner.select``) and this reader.

The table format (schemas 1 and 2) is :mod:`a2a_tune.tuner.runtime.table`; interpolation,
expectations over a phase or workload and the tie rule are :mod:`a2a_tune.tuner.runtime.estimate`;
the literals each engine accepts are :mod:`a2a_tune.tuner.runtime.engines`.

**Which table.** Search order for ``<fingerprint>.json`` (first file found is used; a
broken file is reported, not skipped, so an override never hides silently behind the
packaged one)::

    $A2A_TUNE_PROFILE_DIR   (several directories allowed, separated by os.pathsep)
    ~/.local/share/a2a-tune/profiles   (where `a2a-tune run` writes; $XDG_DATA_HOME)
    packaged a2a_tune/profiles/

Fingerprint: ``lookup(fingerprint=...)``, else ``$A2A_TUNE_FINGERPRINT``, else this
machine's, cached per boot and driver or probed within a few seconds
(:func:`a2a_tune.tuner.runtime.fingerprint.probed_fingerprint`). Tables, in order (see
:mod:`a2a_tune.tuner.runtime.fingerprint`): ``<fingerprint>.json``; the tables of the
multi-node jobs this node took part in (a pointer ``<fingerprint>.cluster`` the job wrote on
every node names them, level ``cluster``); a table of the same GPU models and NVLink islands
that differs only in the node count (``h200.nvl18x2.*``, level ``same-gpu-domain``). The
first with an entry for the requested EP size and dtype answers (else the first found, which
says what it lacks); none: the engine default. ``Choice.hardware_match`` says which level
answered.

**Which shape.** An entry with exactly the requested shape is used ("exact"). Otherwise
only entries with the same ``ep_size`` and ``dtype`` are candidates (none -> fallback) and
the nearest by::

    distance = |log2(hidden/hidden')| + |log2(topk/topk')|
             + |log2(num_experts/num_experts')| + (0.5 if routing differs)

is used ("nearest-shape"); ties go to the larger hidden, then the larger num_experts,
then the larger topk, then the earlier entry.

**What is refused** (the fallback, with the reason): a shape no engine can run (each number
outside the point's bounds, top-k above the experts: :meth:`Shape.problem
<a2a_tune.tuner.runtime.point.Shape.problem>`), and a token count, max batch or prefill step
outside 1..2^20 per rank (:func:`~a2a_tune.tuner.runtime.point.check_tokens`, the bound the
CLI, the store and the table share). Experts that do not divide over the ranks are a valid
request: engines such as TensorRT-LLM run them.

**Which token counts** -- give exactly one of:

* ``tokens=T``: tokens per rank per step (a single point);
* ``phase="decode", max_tokens=B``: B = the engine's max batch per rank (vLLM
  ``max_num_seqs``); tokens per rank log-uniform over 1..B;
* ``phase="prefill", max_tokens=C``: C = tokens per rank per prefill step (vLLM
  ``max_num_batched_tokens``, the chunked-prefill size); the point C;
* ``workload=FILE`` (JSON or CSV histogram, :mod:`a2a_tune.tuner.runtime.workload`) or a
  ``{tokens: weight}`` mapping.

Each backend's expected time over that is compared (see :mod:`a2a_tune.tuner.runtime.estimate`
for interpolation, clamping and which backends compete); backends in the entry's
``failed`` never compete; with ``engine="vllm"`` / ``"sglang"`` / ``"trtllm"`` only
backends whose literal (and options) that engine accepts compete, so a faster backend the
engine cannot express does not push the answer to the fallback. The fastest wins unless the tie rule prefers
another inside its p10..p90 spread. ``Choice.alternatives`` gives every other competing
backend's regret (expected time / best expected time - 1).

Disaggregated serving: a prefill engine asks ``phase="prefill"``, a decode engine
``phase="decode"``; where the curves cross they get different backends.

**Knobs.** ``Choice.knobs`` is the launch setting the table holds for the chosen backend
(``a2a-tune tune-knobs --profile``) at the entry's measured token count nearest (in log
space; the larger on a tie) to the request's typical load: the point itself; the decode
range's log-midpoint sqrt(1 * B); a workload's weighted log-mean. Empty where the table
has none (the backend's defaults); apply with ``backend.set_knobs(choice.knobs)``.
"""

from __future__ import annotations

import math
import os
from functools import cache
from types import MappingProxyType

from a2a_tune.tuner.runtime import engines
from a2a_tune.tuner.runtime.estimate import US_DECIMALS, decide, expected, where_text
from a2a_tune.tuner.runtime.fingerprint import (
    HW_CLUSTER,
    HW_DEFAULT,
    HW_EXACT,
    HW_SAME_DOMAIN,
    domain_key,
    node_count,
    normalize_fingerprint,
)
from a2a_tune.tuner.runtime.point import (
    MAX_EP_SIZE,
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_TOKENS_PER_RANK,
    MAX_TOPK,
    PointError,
    check_tokens,
)
from a2a_tune.tuner.runtime.table import (
    FALLBACK_BACKEND,
    SCHEMA_VERSION,
    Profile,
    ProfileEntry,
    ProfileError,
    Shape,
    describe_shape,
    parse_profile,
)

# logging and pathlib are imported where used: together they are about half of this
# module's import time in a fresh interpreter, and the happy path needs neither.

__all__ = [
    "FALLBACK_BACKEND",
    "SCHEMA_VERSION",
    "PROFILE_DIR_ENV",
    "FINGERPRINT_ENV",
    "CLUSTER_POINTER_SUFFIX",
    "PHASES",
    "Choice",
    "Profile",
    "ProfileEntry",
    "ProfileError",
    "Shape",
    "add_cluster_pointer",
    "clear_cache",
    "find_profile",
    "load_profile",
    "lookup",
    "normalize_fingerprint",
    "parse_profile",
    "profile_filename",
    "profile_search_paths",
    "shape_distance",
    "user_profile_dir",
]

PROFILE_DIR_ENV = "A2A_TUNE_PROFILE_DIR"
#: ``<node fingerprint>.cluster`` in a profile directory: {"clusters": [fingerprint, ...]},
#: the multi-node jobs this node took part in, newest first (written by the tuner's run).
CLUSTER_POINTER_SUFFIX = ".cluster"
FINGERPRINT_ENV = "A2A_TUNE_FINGERPRINT"
PHASES = ("decode", "prefill")
#: hardware_match of an explicit ``profile=`` without ``fingerprint=``: nothing to compare.
HW_UNCHECKED = "unchecked"


class Choice:
    """The answer of :func:`lookup`; read-only (answers are cached and shared).

    ``backend``: our name; ``vllm_name`` / ``sglang_name`` / ``trtllm_name``: the engines'
    literals for it (from the profile) or None; ``engine_options``: engine -> the options
    that engine needs beside the literal (e.g. SGLang's ``--deepep-mode``); ``match``: ``"exact"``, ``"nearest-shape"`` or
    ``"fallback"`` (the shape rule, or no answer); ``hardware_match``: ``"exact"``,
    ``"same-gpu-domain"``, ``"engine-default"`` (no table) or ``"unchecked"``
    (``profile=`` given without ``fingerprint=``); ``reason``: one line saying which
    profile, shape and token rule produced it (or what went wrong); ``source``: the
    profile path or None; ``profile_fingerprint``: the fingerprint of the table used;
    ``phase``: ``"tokens"``, ``"decode"``, ``"prefill"`` or ``"workload"``;
    ``expected_us``: each competing backend's expected median µs (empty on fallback);
    ``alternatives``: every other competing backend -> regret (expected / best expected
    - 1); ``regret``: the chosen backend's own (> 0 only when the tie rule preferred it
    over the fastest); ``tie``: whether the tie rule applied; ``timing``: competing
    backend -> timing mode of its curve; ``entry_shape``: the table shape used, or None;
    ``knobs``: the chosen backend's tuned knob setting (empty: its defaults; see above).

    A plain class rather than a dataclass: importing dataclasses costs ~10 ms (it imports
    inspect), which every engine would pay at start-up.
    """

    _FIELDS = (
        "backend",
        "vllm_name",
        "sglang_name",
        "trtllm_name",
        "match",
        "reason",
        "source",
        "expected_us",
        "entry_shape",
        "hardware_match",
        "profile_fingerprint",
        "phase",
        "alternatives",
        "regret",
        "tie",
        "timing",
        "knobs",
        "engine_options",
    )
    _MAPPINGS = ("expected_us", "alternatives", "timing", "knobs", "engine_options")
    __slots__ = _FIELDS

    def __init__(
        self,
        backend: str,
        vllm_name,
        sglang_name,
        match: str,
        reason: str,
        source=None,
        expected_us=None,
        entry_shape=None,
        hardware_match: str = HW_DEFAULT,
        profile_fingerprint=None,
        phase: str = "tokens",
        alternatives=None,
        regret: float = 0.0,
        tie: bool = False,
        timing=None,
        knobs=None,
        trtllm_name=None,
        engine_options=None,
    ):
        values = dict(locals())
        for name in self._FIELDS:
            value = values[name]
            if name in self._MAPPINGS:
                value = MappingProxyType(dict(value or {}))
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"Choice is read-only (cannot set {name!r})")

    def __delattr__(self, name):
        raise AttributeError(f"Choice is read-only (cannot delete {name!r})")

    def _key(self) -> tuple:
        return tuple(
            tuple(sorted(getattr(self, n).items())) if n in self._MAPPINGS else getattr(self, n) for n in self._FIELDS
        )

    def __eq__(self, other):
        return self._key() == other._key() if type(other) is Choice else NotImplemented

    def __hash__(self):
        return hash(tuple(getattr(self, n) for n in self._FIELDS if n not in self._MAPPINGS))

    def __repr__(self) -> str:
        return "Choice(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self._FIELDS) + ")"

    def engine_args(self, engine: str) -> tuple:
        """(literal, options) to tell ``engine`` ("vllm", "sglang", "trtllm") this answer's
        backend; (None, ()) on a fallback or when the engine has no literal for it."""
        if self.match == "fallback":
            return None, ()
        literal = {"vllm": self.vllm_name, "sglang": self.sglang_name, "trtllm": self.trtllm_name}.get(engine)
        return literal, tuple(self.engine_options.get(engine, ())) if literal else ()

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (used by ``a2a-tune lookup --format json``)."""
        out = {n: (dict(getattr(self, n)) if n in self._MAPPINGS else getattr(self, n)) for n in self._FIELDS}
        out["entry_shape"] = dict(self.entry_shape._asdict()) if self.entry_shape else None
        out["engine_options"] = {engine: list(opts) for engine, opts in self.engine_options.items()}
        return out


# --------------------------------------------------------------------------- naming


def profile_filename(fingerprint: str) -> str:
    """THE file name of a fingerprint's profile, shared by the writer and the reader."""
    return f"{normalize_fingerprint(fingerprint)}.json"


@cache
def _packaged_dir() -> str | None:
    """Directory of the packaged profiles (``a2a_tune.profiles``), or None.

    Found through the import system's spec, not ``importlib.resources`` (which costs ~15 ms
    of imports on an engine's first lookup); profiles are installed as plain files.
    """
    try:
        from importlib.util import find_spec

        spec = find_spec("a2a_tune.profiles")
        for d in (spec.submodule_search_locations or []) if spec else []:
            if os.path.isdir(d):
                return os.fspath(d)
    except Exception:  # a broken install: fall through to the source layout
        pass
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")
    return here if os.path.isdir(here) else None


def user_profile_dir() -> str:
    """Where `a2a-tune select` / `run` write by default: this machine's own measured tables."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "a2a-tune", "profiles")


def _search_dirs() -> list:
    # Asked on every lookup (a new table may appear): memoised on the variables it reads.
    environ = os.environ
    key = (environ.get(PROFILE_DIR_ENV), environ.get("XDG_DATA_HOME"), environ.get("HOME"))
    dirs = _DIRS_CACHE.get(key)
    if dirs is None:
        dirs = []
        if key[0]:
            dirs.extend(os.path.expanduser(d) for d in key[0].split(os.pathsep) if d.strip())
        dirs.append(user_profile_dir())
        packaged = _packaged_dir()
        if packaged:
            dirs.append(packaged)
        _DIRS_CACHE.clear()
        _DIRS_CACHE[key] = dirs
    return list(dirs)


_DIRS_CACHE: dict = {}


def profile_search_paths() -> list:
    """Directories searched for profiles, in order: ``$A2A_TUNE_PROFILE_DIR`` entries, the
    user's own (``user_profile_dir()``, where ``a2a-tune run`` writes), the packaged ones."""
    from pathlib import Path

    return [Path(d) for d in _search_dirs()]


def _find(fingerprint: str, dirs: list) -> tuple:
    """(path or None, list of every path tried) for an already normalised fingerprint."""
    name = f"{fingerprint}.json"
    tried = []
    for d in dirs:
        p = os.path.join(d, name)
        tried.append(p)
        if os.path.exists(p) and not os.path.isdir(p):  # a FIFO or device there is reported, not skipped
            return p, tried
    return None, tried


# (fingerprint, dirs) -> (directory mtimes, path or None): the relaxed search lists
# directories, so it is redone only when one of them changed.
_DOMAIN_CACHE: dict = {}


def _dir_stamp(d: str):
    try:
        return os.stat(d).st_mtime_ns
    except OSError:
        return None


def _find_same_domain(fingerprint: str, dirs: list):
    """A table for the same GPUs and NVLink islands on another node count (see
    :mod:`a2a_tune.tuner.runtime.fingerprint`): the first directory in search order that has one;
    in it the closest node count, then the name. None if there is none."""
    key = domain_key(fingerprint)
    if key is None:
        return None
    cache_key = (fingerprint, tuple(dirs))
    stamps = tuple(_dir_stamp(d) for d in dirs)
    hit = _DOMAIN_CACHE.get(cache_key)
    if hit is not None and hit[0] == stamps:
        return hit[1]
    want_nodes = node_count(fingerprint) or 1
    found = None
    for d, stamp in zip(dirs, stamps):
        if stamp is None:
            continue
        try:
            names = [e.name for e in os.scandir(d) if e.name.endswith(".json") and e.is_file()]
        except OSError:
            continue
        candidates = []
        for name in names:
            fp = name[: -len(".json")]
            if fp != fingerprint and domain_key(fp) == key:
                candidates.append((abs((node_count(fp) or 1) - want_nodes), name))
        if candidates:
            found = os.path.join(d, min(candidates)[1])
            break
    _DOMAIN_CACHE[cache_key] = (stamps, found)
    return found


def add_cluster_pointer(directory, node_fingerprint: str, cluster_fingerprint: str) -> None:
    """Record in ``directory`` that this node (``node_fingerprint``) took part in the job of
    ``cluster_fingerprint``: lookup on the node then finds that table. Newest first; written
    atomically (several nodes may share the directory). Raises OSError / ValueError."""
    import json
    import tempfile

    node, cluster = normalize_fingerprint(node_fingerprint), normalize_fingerprint(cluster_fingerprint)
    path = os.path.join(os.fspath(directory), node + CLUSTER_POINTER_SUFFIX)
    clusters = [cluster] + [c for c in _read_pointer(path) if c != cluster]
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=CLUSTER_POINTER_SUFFIX)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"clusters": clusters}, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# path -> (file identity, clusters): pointers are re-read only when they change.
_POINTER_CACHE: dict = {}


def _read_pointer(path: str) -> list:
    """The cluster fingerprints a pointer file names ([] if absent or unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    ident = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _POINTER_CACHE.get(path)
    if hit is not None and hit[0] == ident:
        return hit[1]
    import json

    from a2a_tune.tuner.runtime.files import MAX_CACHE_BYTES, read_capped

    clusters = []
    try:
        data = json.loads(read_capped(path, MAX_CACHE_BYTES).decode("utf-8"))
        for fp in data.get("clusters", []) if isinstance(data, dict) else []:
            try:
                clusters.append(normalize_fingerprint(fp))
            except ValueError:
                continue
    except (OSError, ValueError):
        _warn_once(f'{path}: not a cluster pointer ({{"clusters": [fingerprint, ...]}}); ignored')
    _POINTER_CACHE[path] = (ident, clusters)
    return clusters


def _tables(fingerprint: str, dirs: list):
    """(path, level) of every table that may answer for ``fingerprint``, in the order of the
    levels (:mod:`a2a_tune.tuner.runtime.fingerprint`), found lazily; then, once, (None, tried)."""
    path, tried = _find(fingerprint, dirs)
    if path is not None:
        yield path, HW_EXACT
    seen = set()
    for d in dirs:
        for cluster in _read_pointer(os.path.join(d, fingerprint + CLUSTER_POINTER_SUFFIX)):
            if cluster not in seen:
                seen.add(cluster)
                found, _ = _find(cluster, dirs)
                if found is not None:
                    yield found, HW_CLUSTER
    same = _find_same_domain(fingerprint, dirs)
    if same is not None:
        yield same, HW_SAME_DOMAIN
    yield None, tried


def _covers(slot, ep_size: int, dtype: str) -> bool:
    """Whether a loaded table has any entry for this EP size and dtype."""
    if slot.profile is None:
        return False
    if slot.ep_dtypes is None:
        slot.ep_dtypes = frozenset((e.shape.ep_size, e.shape.dtype) for e in slot.profile.entries)
    return (ep_size, dtype) in slot.ep_dtypes


def _miss_message(fingerprint: str, tried: list) -> str:
    key = domain_key(fingerprint)
    relaxed = f" (nor one for {key[0]}.{key[1]}.*)" if key else ""
    return f"no profile for fingerprint {fingerprint!r}{relaxed}; searched: {', '.join(tried) or '(no directories)'}"


def find_profile(fingerprint: str):
    """Path of the profile for ``fingerprint`` in search order (exact name only); None (and
    a warning) on a miss."""
    try:
        fp = normalize_fingerprint(fingerprint)
    except ValueError as exc:
        _warn_once(str(exc))
        return None
    path, tried = _find(fp, _search_dirs())
    if path is None:
        _warn_once(_fallback_message(_miss_message(fp, tried)))
        return None
    from pathlib import Path

    return Path(path)


# -------------------------------------------------------------------------- loading


class _Loaded:
    """Cache slot for one (path, file identity): a Profile or the error, plus answers."""

    __slots__ = ("profile", "error", "choices", "ep_dtypes")

    def __init__(self, profile, error):
        self.profile = profile
        self.error = error
        self.choices = {}
        self.ep_dtypes = None  # (ep_size, dtype) of its entries, once asked (_covers)


# (path) -> (identity, _Loaded); identity = (st_mtime_ns, st_size, st_ino), so a
# rewritten file (select writes via os.replace: new inode) is re-read.
_CACHE: dict = {}
_MAX_CACHED_CHOICES = 4096  # answers kept per profile
_WARNED: set = set()
_PROBED: list = []  # [(fingerprint or None, problem or None)] once probed


def clear_cache() -> None:
    """Forget loaded profiles and workloads, cached answers, the probed fingerprint and
    warnings already given."""
    _CACHE.clear()
    _DOMAIN_CACHE.clear()
    _POINTER_CACHE.clear()
    _WARNED.clear()
    _PROBED.clear()
    import sys

    wl = sys.modules.get("a2a_tune.tuner.runtime.workload")
    if wl is not None:
        wl.clear_cache()


def _read_and_parse(path: str) -> Profile:
    import json

    from a2a_tune.tuner.runtime.files import MAX_TABLE_BYTES, FileRefused, read_capped

    try:
        raw = read_capped(path, MAX_TABLE_BYTES)
    except FileRefused as exc:
        raise ProfileError(str(exc), path=path) from None
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}", path=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"not UTF-8 text (bad byte at offset {exc.start})", path=path) from None
    # A table is tens of thousands of small objects, none of them in a reference cycle:
    # pausing the cyclic GC while building them saves ~20% of a cold lookup.
    import gc

    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", path=path) from None
        except RecursionError:
            raise ProfileError("invalid JSON: nested too deeply", path=path) from None
        return parse_profile(data, path)
    finally:
        if gc_was_enabled:
            gc.enable()


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
    """Read and validate a profile file (schema 1 or 2); raises :class:`ProfileError`
    (one line) if unusable. Results are cached by (path, mtime, size, inode)."""
    slot = _load_cached(os.fspath(path))
    if slot.error is not None:
        e = slot.error
        raise ProfileError(e.problem, field=e.field, path=e.path)
    return slot.profile


# --------------------------------------------------------------------------- lookup


def _fallback_message(problem: str) -> str:
    return f"{problem}; using fallback all2all backend {FALLBACK_BACKEND!r}"


# What an engine that is not told a backend does (the warning says so instead of the fallback).
_KEPT_DEFAULT = {
    "sglang": f"SGLang keeps its default --moe-a2a-backend {engines.DEFAULT['sglang']}",
    "trtllm": "TensorRT-LLM keeps its own choice (no TRTLLM_FORCE_COMM_METHOD)",
}


def _warning_for(reason: str, engine) -> str:
    kept = _KEPT_DEFAULT.get(engine)
    generic = _fallback_message("")
    if kept and reason.endswith(generic):
        return f"{reason[: -len(generic)]}; {kept}"
    return reason


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import logging

        logging.getLogger("a2a_tune").warning("a2a-tune: %s", message)


def _fallback(
    problem: str,
    source: str | None = None,
    *,
    hardware_match: str = HW_DEFAULT,
    profile_fingerprint: str | None = None,
    phase: str = "tokens",
) -> Choice:
    return Choice(
        backend=FALLBACK_BACKEND,
        vllm_name=FALLBACK_BACKEND,
        sglang_name=None,  # SGLang: keep the engine's own default
        trtllm_name=None,  # TensorRT-LLM: keep its own priority list
        match="fallback",
        reason=_fallback_message(problem),
        source=source,
        hardware_match=hardware_match,
        profile_fingerprint=profile_fingerprint,
        phase=phase,
    )


def _resolve_fingerprint(fingerprint):
    """(normalised fingerprint, None) or (None, problem)."""
    if fingerprint is None:
        fingerprint = os.environ.get(FINGERPRINT_ENV) or None
    if fingerprint is None:
        if not _PROBED:
            from a2a_tune.tuner.runtime.fingerprint import PROBE_TIMEOUT_S, probed_fingerprint

            try:
                _PROBED.append((probed_fingerprint(PROBE_TIMEOUT_S), None))
            except Exception as exc:
                _PROBED.append(
                    (
                        None,
                        f"hardware probe failed ({type(exc).__name__}: {exc}); "
                        f"pass fingerprint= or set {FINGERPRINT_ENV}",
                    )
                )
        return _PROBED[0]
    try:
        return normalize_fingerprint(fingerprint), None
    except ValueError as exc:
        return None, str(exc)


def _as_int(v):
    """int(v) for ints and integer-like objects (numpy ints); None for bools and the rest."""
    if isinstance(v, bool):
        return None
    try:
        import operator

        return operator.index(v)
    except TypeError:
        return None


def _check_args(ints: dict, strs: dict):
    """(problem or None, normalised ints in order). Token counts (tokens, max_tokens) are held
    to the point's bound; shape sizes to >= 1 here, to their bounds by Shape.problem."""
    out = []
    for name, v in ints.items():
        i = _as_int(v)
        if i is not None and name in ("tokens", "max_tokens"):
            try:
                check_tokens(i)
            except PointError as exc:
                return f"invalid lookup argument {name}={v!r} ({exc})", None
        if i is None or i < 1:
            return f"invalid lookup argument {name}={v!r} (expected an integer >= 1)", None
        out.append(i)
    for name, v in strs.items():
        if not isinstance(v, str):
            return f"invalid lookup argument {name}={v!r} (expected a string)", None
    return None, out


def _request(tokens, phase, max_tokens, workload):
    """What the answer is averaged over: (problem, phase label, cache key, dist or loader).

    ``dist`` is an :mod:`~a2a_tune.tuner.runtime.estimate` distribution, or for a workload file
    a zero-argument callable that loads it (only run on a cache miss).
    """
    if (
        type(tokens) is int
        and 1 <= tokens <= MAX_TOKENS_PER_RANK
        and phase is None
        and max_tokens is None
        and workload is None
    ):
        return None, "tokens", ("point", tokens), ("point", tokens)  # the common case, fast
    given = [n for n, v in (("tokens", tokens), ("phase", phase), ("workload", workload)) if v is not None]
    if len(given) != 1:
        return (
            f"give exactly one of tokens=, phase= (with max_tokens=) or workload= (got {', '.join(given) or 'none'})",
            None,
            None,
            None,
        )
    if tokens is not None:
        if max_tokens is not None:
            return "max_tokens= goes with phase=, not with tokens=", None, None, None
        problem, ints = _check_args({"tokens": tokens}, {})
        if problem:
            return problem, "tokens", None, None
        return None, "tokens", ("point", ints[0]), ("point", ints[0])
    if phase is not None:
        if phase not in PHASES:
            return f"invalid lookup argument phase={phase!r} (expected 'decode' or 'prefill')", None, None, None
        if max_tokens is None:
            what = "max batch per rank" if phase == "decode" else "tokens per rank per prefill step"
            return f"phase={phase!r} needs max_tokens= ({what})", phase, None, None
        problem, ints = _check_args({"max_tokens": max_tokens}, {})
        if problem:
            return problem, phase, None, None
        n = ints[0]
        dist = ("log-uniform", 1, n) if phase == "decode" else ("point", n)
        return None, phase, (phase, n), dist
    if max_tokens is not None:
        return "max_tokens= goes with phase=, not with workload=", "workload", None, None
    from collections.abc import Mapping

    from a2a_tune.tuner.runtime import workload as wl

    if isinstance(workload, Mapping):
        try:
            parsed = wl.parse_workload(workload)
        except wl.WorkloadError as exc:
            return f"workload: {exc}", "workload", None, None
        return None, "workload", ("workload", parsed), ("discrete", parsed)
    try:
        path = os.fspath(workload)
        st = os.stat(path)
    except TypeError:
        return (
            f"invalid lookup argument workload={workload!r} (expected a file path or a mapping)",
            "workload",
            None,
            None,
        )
    except OSError as exc:
        return f"workload {path}: cannot read: {exc.strerror or exc}", "workload", None, None
    key = ("workload-file", path, st.st_mtime_ns, st.st_size, st.st_ino)
    return None, "workload", key, lambda: ("discrete", wl.load_workload(path))


def lookup(
    *,
    ep_size: int,
    hidden: int,
    topk: int,
    num_experts: int,
    tokens: int | None = None,
    dtype: str = "bf16",
    routing: str = "uniform",
    fingerprint: str | None = None,
    profile: str | os.PathLike | None = None,
    engine: str | None = None,
    phase: str | None = None,
    max_tokens: int | None = None,
    workload=None,
    quiet: bool = False,
) -> Choice:
    """Pick the all2all backend for this shape and load. Never raises.

    Give exactly one of ``tokens`` (tokens per rank per step), ``phase`` ("decode" /
    "prefill", with ``max_tokens``) or ``workload`` (a JSON / CSV histogram file, or a
    ``{tokens: weight}`` mapping); see the module docstring. ``profile`` names a file
    directly (its fingerprint is then only checked when ``fingerprint`` is given too);
    otherwise the profile of ``fingerprint`` (or ``$A2A_TUNE_FINGERPRINT``, or the
    probed one) is searched for. ``engine`` (``"vllm"``, ``"sglang"`` or ``"trtllm"``) lets
    only backends that engine accepts a literal for compete. ``quiet``: do not log the
    fallback warning (the caller reports ``Choice.reason``).
    """
    try:
        choice = _lookup(
            ep_size,
            hidden,
            topk,
            num_experts,
            tokens,
            dtype,
            routing,
            fingerprint,
            profile,
            engine,
            phase,
            max_tokens,
            workload,
        )
    except Exception as exc:  # never crash the engine
        choice = _fallback(f"internal error in a2a-tune lookup ({type(exc).__name__}: {exc})")
    if choice.match == "fallback" and not quiet:
        _warn_once(_warning_for(choice.reason, engine))
    return choice


def _lookup(
    ep_size,
    hidden,
    topk,
    num_experts,
    tokens,
    dtype,
    routing,
    fingerprint,
    profile,
    engine,
    phase,
    max_tokens,
    workload,
) -> Choice:
    if (
        type(ep_size) is int
        and type(hidden) is int
        and type(topk) is int
        and type(num_experts) is int
        and 1 <= ep_size <= MAX_EP_SIZE
        and 1 <= hidden <= MAX_HIDDEN
        and 1 <= topk <= MAX_TOPK
        and topk <= num_experts <= MAX_EXPERTS
        and type(dtype) is str
        and dtype
        and type(routing) is str
        and routing
    ):
        problem, ints = None, (ep_size, hidden, topk, num_experts)  # the common case, fast
    else:
        problem, ints = _check_args(
            {"ep_size": ep_size, "hidden": hidden, "topk": topk, "num_experts": num_experts},
            {"dtype": dtype, "routing": routing},
        )
        if problem is None:
            problem = Shape(*ints, dtype, routing).problem()  # the point's rules (one line)
            if problem:
                problem = f"invalid lookup shape: {problem}"
    if problem is None and engine is not None and engine not in engines.ENGINES:
        problem = (
            f"invalid lookup argument engine={engine!r} "
            f"(expected None or one of {', '.join(map(repr, engines.ENGINES))})"
        )
    if problem:
        return _fallback(problem)
    problem, phase_label, dist_key, dist = _request(tokens, phase, max_tokens, workload)
    if problem:
        return _fallback(problem, phase=phase_label or "tokens")
    ep_size, hidden, topk, num_experts = ints

    level = None  # which search level found the table (None: the caller named the file)
    if profile is not None:
        path = os.fspath(profile)
        expected_fp = None
        if fingerprint is not None:
            try:
                expected_fp = normalize_fingerprint(fingerprint)
            except ValueError as exc:
                return _fallback(str(exc), path, phase=phase_label)
    else:
        expected_fp, problem = _resolve_fingerprint(fingerprint)
        if problem:
            return _fallback(problem, phase=phase_label)
        first = None
        for path, level in _tables(expected_fp, _search_dirs()):
            if path is None:  # every table was looked at; none has this EP size and dtype
                if first is None:
                    return _fallback(_miss_message(expected_fp, level), phase=phase_label)
                path, level = first
                break
            first = first or (path, level)
            found = _load_cached(path)
            if found.error is not None or _covers(found, ep_size, dtype):
                break  # a broken table is reported, not skipped: an override never hides silently

    slot = _load_cached(path)
    if slot.error is not None:
        return _fallback(str(slot.error), path, phase=phase_label)
    prof = slot.profile
    hw = HW_EXACT if expected_fp is not None else HW_UNCHECKED
    # The table of a job this node took part in, or of the machine itself: the file's name is
    # the fingerprint it must hold (a file holding another's table is corrupt, never borrowed).
    named_for = expected_fp if level != HW_CLUSTER else os.path.basename(path)[: -len(".json")]
    if level == HW_CLUSTER and prof.fingerprint == named_for:
        hw = HW_CLUSTER
    elif expected_fp is not None and prof.fingerprint != expected_fp:
        same_domain = domain_key(expected_fp) is not None and domain_key(prof.fingerprint) == domain_key(expected_fp)
        if level in (HW_EXACT, HW_CLUSTER) or not same_domain:
            return _fallback(
                f"{path}: hardware.fingerprint: profile is for {prof.fingerprint!r}, "
                + (
                    f"this machine is {expected_fp!r}"
                    if level != HW_CLUSTER
                    else f"the file is named for {named_for!r}"
                ),
                path,
                profile_fingerprint=prof.fingerprint,
                phase=phase_label,
            )
        hw = HW_SAME_DOMAIN

    key = (ep_size, hidden, topk, num_experts, dtype, routing, engine, dist_key, hw, expected_fp)
    choice = slot.choices.get(key)
    if choice is None:
        if callable(dist):
            from a2a_tune.tuner.runtime.workload import WorkloadError

            try:
                dist = dist()
            except WorkloadError as exc:
                return _fallback(f"workload {exc}", phase=phase_label)  # not cached: the file may be fixed
        want = Shape(ep_size, hidden, topk, num_experts, dtype, routing)
        choice = _choose(prof, path, want, dist, phase_label, engine, hw, expected_fp)
        if len(slot.choices) >= _MAX_CACHED_CHOICES:  # e.g. a caller sweeping every token count
            slot.choices.clear()
        slot.choices[key] = choice
    return choice


def shape_distance(a: Shape, b: Shape) -> float:
    """The documented nearest-shape distance (only meaningful for equal ep_size and dtype)."""
    d = (
        abs(math.log2(a.hidden / b.hidden))
        + abs(math.log2(a.topk / b.topk))
        + abs(math.log2(a.num_experts / b.num_experts))
    )
    return d + (0.5 if a.routing != b.routing else 0.0)


def _pick_entry(prof: Profile, want: Shape):
    """(entry, match, shape text) or (None, None, problem)."""
    entry = prof.by_shape.get(want)
    if entry is not None:
        return entry, "exact", "exact shape"
    ranked = sorted(
        (round(shape_distance(want, e.shape), 9), -e.shape.hidden, -e.shape.num_experts, -e.shape.topk, i)
        for i, e in enumerate(prof.entries)
        if e.shape.ep_size == want.ep_size and e.shape.dtype == want.dtype
    )
    if not ranked:
        have = sorted({f"ep_size={e.shape.ep_size}/dtype={e.shape.dtype}" for e in prof.entries})
        return None, None, f"no entry for ep_size={want.ep_size} dtype={want.dtype} (table has {', '.join(have)})"
    dist, *_, idx = ranked[0]
    entry = prof.entries[idx]
    text = f"nearest shape {describe_shape(entry.shape)} (distance {dist:.2f}) for requested {describe_shape(want)}"
    return entry, "nearest-shape", text


def _choose(
    prof: Profile, path: str, want: Shape, dist, phase: str, engine: str | None, hw: str, machine_fp: str | None
) -> Choice:
    fname = os.path.basename(path)
    common = dict(hardware_match=hw, profile_fingerprint=prof.fingerprint, phase=phase)
    entry, match, shape_text = _pick_entry(prof, want)
    if entry is None:
        return _fallback(f"{path}: {shape_text}", path, **common)
    if entry.source != "measured":
        shape_text += f" [{entry.source}]"
    where = where_text(entry.tokens, dist)
    if phase in PHASES:
        where = f"{phase}: {where}"

    curves = {b: c for b, c in entry.median_us.items() if b not in entry.failed}
    if engine is not None:
        curves = {b: c for b, c in curves.items() if _expressible(engine, prof.backends[b], want)}
    medians = {b: round(v, US_DECIMALS) for b, v in expected(entry.tokens, curves, dist).items()}
    if not medians:
        return _fallback(
            f"{path}: {shape_text}: no usable backend{f' with a {engine} name' if engine else ''} {where}"
            + (f" (failed: {', '.join(sorted(entry.failed))})" if entry.failed else ""),
            path,
            **common,
        )
    spread_of = lambda curves_by_b: expected(entry.tokens, {b: curves_by_b[b] for b in medians}, dist)  # noqa: E731
    chosen, fastest, tied = decide(medians, spread_of(entry.p10_us), spread_of(entry.p90_us), prof.tie_preference)
    best = medians[fastest]
    verb = "expected " if phase != "tokens" else ""
    if chosen != fastest:
        vs = (
            f"{chosen} {verb}{medians[chosen]:.3f} us (+{(medians[chosen] / best - 1) * 100:.1f}%), "
            f"fastest {fastest} {best:.3f} us; tie: {', '.join(tied[1:])} within {fastest}'s p10..p90, "
            f"preferring {chosen} (tie preference)"
        )
    else:
        others = sorted((v, b) for b, v in medians.items() if b != chosen)
        if others:
            ru_us, ru = others[0]
            vs = f"{chosen} {verb}{best:.3f} us, runner-up {ru} {ru_us:.3f} us (+{(ru_us / best - 1) * 100:.1f}%)"
        else:
            vs = f"{chosen} {verb}{best:.3f} us, no other backend competes"
        if len(tied) > 1:
            vs += f"; tie: {', '.join(tied[1:])} within {fastest}'s p10..p90, {chosen} preferred anyway"
    modes = {b: entry.timing.get(b, "eager") for b in medians}
    if len(set(modes.values())) > 1:
        vs += " [timing: " + ", ".join(f"{b} {m}" for b, m in sorted(modes.items())) + "]"
    hw_text = {
        HW_SAME_DOMAIN: f" (measured on {prof.fingerprint}: same GPUs and NVLink domain as {machine_fp})",
        HW_CLUSTER: f" (measured by a job over the nodes of {prof.fingerprint}, this node among them)",
    }.get(hw, "")
    names = prof.backends[chosen]
    return Choice(
        backend=chosen,
        vllm_name=names.vllm_name,
        sglang_name=names.sglang_name,
        trtllm_name=names.trtllm_name,
        engine_options=names.engine_options,
        match=match,
        reason=f"profile {fname}{hw_text}, {shape_text}, {where}: {vs}",
        source=path,
        expected_us=medians,
        entry_shape=entry.shape,
        alternatives={b: round(v / best - 1, 4) for b, v in medians.items() if b != chosen},
        regret=round(medians[chosen] / best - 1, 4),
        tie=len(tied) > 1,
        timing=modes,
        knobs=_knobs_at(entry, chosen, dist),
        **common,
    )


def _expressible(engine: str, names, want: Shape) -> bool:
    """Whether ``engine`` can be told to run the backend with these names at ``want``."""
    return engines.accepts(
        engine,
        names.literal(engine),
        names.engine_options.get(engine, ()),
        num_experts=want.num_experts,
        ep_size=want.ep_size,
    )


def _knobs_at(entry: ProfileEntry, backend: str, dist) -> dict:
    """The backend's knob setting at the measured token count nearest the load (see the module
    docstring); {} when the table has none there."""
    settings = entry.knobs.get(backend)
    if not settings:
        return {}
    kind = dist[0]
    if kind == "point":
        log_t = math.log(max(dist[1], 1))
    elif kind == "log-uniform":
        log_t = (math.log(max(dist[1], 1)) + math.log(max(dist[2], 1))) / 2
    else:  # discrete: ((tokens, weight), ...), weights summing to 1
        log_t = sum(w * math.log(max(t, 1)) for t, w in dist[1])
    j = min(range(len(entry.tokens)), key=lambda i: (abs(math.log(entry.tokens[i]) - log_t), -entry.tokens[i]))
    return dict(settings[j] or {})
