"""Which table: the file a fingerprint's table has, where tables are written and searched, and loading.

The one place for both sides of a table's location. The writers (``select``, ``run``, the
cluster path) name a table with :func:`profile_filename`, write into :func:`table_dir` (the
first directory the search looks in, so an engine finds what was just written), under
:func:`table_lock`, with :func:`replace_file`; :mod:`a2a_tune.tuner.runtime.lookup` asks
:func:`locate` which table answers for this machine and loads it with :func:`load_cached`.
The search order, the levels (exact, cluster, same GPU domain) and the rule that a broken
table or directory is reported, never skipped, are in the README ("Runtime lookup").

Everything read here is cached on the file's identity (mtime, size, inode), so a warm lookup
reads no file and a rewritten table (``select`` replaces it: a new inode) is read again.
Standard library only; ``logging`` and ``pathlib`` are imported where used (together about
half of a cold import, and the happy path needs neither).
"""

from __future__ import annotations

import os
from functools import cache

from a2a_tune.tuner.runtime.environ import env_text, xdg_dir
from a2a_tune.tuner.runtime.fingerprint import (
    HW_CLUSTER,
    HW_EXACT,
    HW_SAME_DOMAIN,
    domain_key,
    node_count,
    normalize_fingerprint,
)
from a2a_tune.tuner.runtime.table import FALLBACK_BACKEND, Profile, ProfileError, parse_profile
from a2a_tune.tuner.runtime.text import LIMIT, one_line

__all__ = [
    "CLUSTER_POINTER_SUFFIX",
    "FINGERPRINT_ENV",
    "HW_UNCHECKED",
    "PROFILE_DIR_ENV",
    "table_dir",
    "add_cluster_pointer",
    "clear_cache",
    "fallback_message",
    "find_profile",
    "hardware_problem",
    "load_cached",
    "load_profile",
    "locate",
    "profile_filename",
    "profile_search_paths",
    "resolve_fingerprint",
    "replace_file",
    "lock_path",
    "table_lock",
    "user_profile_dir",
    "warn_once",
]

PROFILE_DIR_ENV = "A2A_TUNE_PROFILE_DIR"
#: ``<node fingerprint>.cluster`` in a profile directory: {"clusters": [fingerprint, ...]},
#: the multi-node jobs this node took part in, newest first (written by the tuner's run).
CLUSTER_POINTER_SUFFIX = ".cluster"
FINGERPRINT_ENV = "A2A_TUNE_FINGERPRINT"
#: hardware_match of an explicit ``profile=`` without ``fingerprint=``: nothing to compare.
HW_UNCHECKED = "unchecked"


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
    return os.path.join(xdg_dir("XDG_DATA_HOME", ".local", "share"), "a2a-tune", "profiles")


def table_dir(out_dir=None):
    """Where this node writes tables (a ``pathlib.Path``): `out_dir`, else the first
    $A2A_TUNE_PROFILE_DIR entry, else the user's profile directory (both searched by lookup on
    this node; blank entries are skipped, as the search skips them). The views write their
    files under it by default (``plots/``, ``reports/``)."""
    from pathlib import Path

    first = next((d for d in os.environ.get(PROFILE_DIR_ENV, "").split(os.pathsep) if d.strip()), None)
    return Path(out_dir or first or user_profile_dir()).expanduser()


class table_lock:  # noqa: N801 - used as a context manager, like open()
    """Hold ``directory``'s lock for ``fingerprint``'s table (``.<fingerprint>.json.lock``, an
    advisory ``flock``) while a writer reads the table on disk, merges and replaces it: two
    ``run``s or ``select``s at once then merge one after the other, never over each other.
    The lock file is opened read-only (``flock`` needs no more) and created readable by all,
    whatever the umask, so every operator who can write the directory can take it."""

    def __init__(self, directory, fingerprint: str | None = None, *, file=None):
        # `file`: the table file itself (named as select names it, the same lock as select's).
        self.path = lock_path(directory, fingerprint) if file is None else _lock_of(os.fspath(file))
        self.fd = None

    def __enter__(self):
        import fcntl

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.fchmod(self.fd, 0o644)  # a umask of 077 must not lock out the next operator
        except FileExistsError:
            self.fd = os.open(self.path, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock
        self.fd = None


def lock_path(directory, fingerprint: str) -> str:
    """The lock file of ``fingerprint``'s table in ``directory`` (:class:`table_lock`)."""
    return _lock_of(os.path.join(os.fspath(directory), profile_filename(fingerprint)))


def _lock_of(table: str) -> str:
    return os.path.join(os.path.dirname(table) or ".", f".{os.path.basename(table)}.lock")


def replace_file(target, text: str | bytes) -> str:
    """Atomically replace ``target`` with ``text`` (or bytes): a temporary file in the same directory,
    flushed to disk, made world-readable (engines often run as another user than the tuner)
    and renamed over it, so a reader sees the old file or the new one, never a partial one.
    A symlink is written through: its target is replaced, the link kept. Returns the path;
    raises OSError."""
    import tempfile

    named = target = os.fspath(target)
    if os.path.islink(target):
        target = os.path.realpath(target)
    directory = os.path.dirname(target) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
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
    return named


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


# --------------------------------------------------------------------------- finding


def _broken(path: str, exc: OSError) -> str:
    """Why ``path`` on the search path cannot be looked at (one line): it is reported, not
    skipped, since a table there would come before every later directory's."""
    import errno

    if exc.errno == errno.ELOOP:
        what = "a symbolic link loop"
    elif isinstance(exc, FileNotFoundError):  # only asked for a link that exists
        try:
            what = f"a dangling symbolic link (to {one_line(repr(os.readlink(path)), 200)})"
        except OSError:
            what = "a dangling symbolic link"
    elif isinstance(exc, NotADirectoryError):
        what = "its directory is not a directory"
    else:
        what = exc.strerror or one_line(exc)
    return f"{path}: cannot read: {what}"


def _find(fingerprint: str, dirs: list) -> tuple:
    """(path or None, every path tried, problem or None) for an already normalised fingerprint.

    The first path in search order that holds something is the answer: a table, or anything
    else there (a FIFO, a device: reported when loaded). A path that cannot be looked at --
    a symbolic link loop, a dangling link (the file's or its directory's), a directory that
    cannot be searched -- is the answer too, with the problem: an override never hides
    silently behind a later table. A directory that does not exist holds nothing.
    """
    name = f"{fingerprint}.json"
    tried = []
    for d in dirs:
        p = os.path.join(d, name)
        tried.append(p)
        try:
            st = os.stat(p)
        except FileNotFoundError as exc:
            if os.path.lexists(p):
                return p, tried, _broken(p, exc)
            if os.path.lexists(d) and not os.path.exists(d):
                return p, tried, _broken(d, exc)
            continue
        except OSError as exc:
            return p, tried, _broken(p, exc)
        if not _is_dir(st):
            return p, tried, None
    return None, tried, None


def _is_dir(st) -> bool:
    import stat

    return stat.S_ISDIR(st.st_mode)


# (fingerprint, dirs) -> (directory mtimes, (path or None, problem or None)): the relaxed
# search lists directories, so it is redone only when one of them changed.
_DOMAIN_CACHE: dict = {}


def _dir_stamp(d: str):
    try:
        return os.stat(d).st_mtime_ns
    except OSError:
        return None


def _find_same_domain(fingerprint: str, dirs: list) -> tuple:
    """(path, problem): a table for the same GPUs and NVLink islands on another node count
    (see :mod:`a2a_tune.tuner.runtime.fingerprint`): the first directory in search order that
    has one; in it the closest node count, then the name. (None, None) if there is none; a
    directory that exists but cannot be listed is (it, problem)."""
    key = domain_key(fingerprint)
    if key is None:
        return None, None
    cache_key = (fingerprint, tuple(dirs))
    stamps = tuple(_dir_stamp(d) for d in dirs)
    hit = _DOMAIN_CACHE.get(cache_key)
    if hit is not None and hit[0] == stamps:
        return hit[1]
    want_nodes = node_count(fingerprint) or 1
    found = None, None
    for d, stamp in zip(dirs, stamps):
        if stamp is None:
            continue
        try:
            names = [e.name for e in os.scandir(d) if e.name.endswith(".json") and not e.is_dir()]
        except FileNotFoundError:
            continue
        except OSError as exc:
            found = d, _broken(d, exc)
            break
        candidates = []
        for name in names:
            fp = name[: -len(".json")]
            if fp != fingerprint and domain_key(fp) == key:
                candidates.append((abs((node_count(fp) or 1) - want_nodes), name))
        if candidates:
            found = os.path.join(d, min(candidates)[1]), None
            break
    _DOMAIN_CACHE[cache_key] = (stamps, found)
    return found


def add_cluster_pointer(directory, node_fingerprint: str, cluster_fingerprint: str) -> None:
    """Record in ``directory`` that this node (``node_fingerprint``) took part in the job of
    ``cluster_fingerprint``: lookup on the node then finds that table. Newest first; written
    atomically (several nodes may share the directory). Raises OSError / ValueError."""
    import json

    node, cluster = normalize_fingerprint(node_fingerprint), normalize_fingerprint(cluster_fingerprint)
    path = os.path.join(os.fspath(directory), node + CLUSTER_POINTER_SUFFIX)
    clusters = [cluster] + [c for c in _read_pointer(path) if c != cluster]
    replace_file(path, json.dumps({"clusters": clusters}))


# path -> (file identity, clusters): pointers are re-read only when they change.
_POINTER_CACHE: dict = {}
_NOT_A_POINTER = 'not a cluster pointer ({"clusters": [fingerprint, ...]}); ignored'


def _read_pointer(path: str) -> list:
    """The cluster fingerprints a pointer file names ([] if absent). One that cannot be read
    or parsed -- a dangling link or a link loop included -- is ignored with a warning."""
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        if os.path.lexists(path):
            warn_once(f"{_broken(path, exc)}; {_NOT_A_POINTER}")
        return []
    except OSError as exc:
        warn_once(f"{_broken(path, exc)}; {_NOT_A_POINTER}")
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
        warn_once(f"{path}: {_NOT_A_POINTER}")
    _POINTER_CACHE[path] = (ident, clusters)
    return clusters


def _tables(fingerprint: str, dirs: list):
    """(path, level, problem) of every table that may answer for ``fingerprint``, in the
    order of the levels (:mod:`a2a_tune.tuner.runtime.fingerprint`), found lazily; then,
    once, (None, tried, None)."""
    path, tried, problem = _find(fingerprint, dirs)
    if path is not None:
        yield path, HW_EXACT, problem
    seen = set()
    for d in dirs:
        for cluster in _read_pointer(os.path.join(d, fingerprint + CLUSTER_POINTER_SUFFIX)):
            if cluster not in seen:
                seen.add(cluster)
                found, _, problem = _find(cluster, dirs)
                if found is not None:
                    yield found, HW_CLUSTER, problem
    same, problem = _find_same_domain(fingerprint, dirs)
    if same is not None:
        yield same, HW_SAME_DOMAIN, problem
    yield None, tried, None


def _covers(slot, ep_size: int, dtype: str) -> int:
    """How a loaded table answers this EP size and dtype: 2, an entry for them; 1, one for a
    larger EP size (the lookup answers from the nearest larger one, and says so); 0, neither."""
    if slot.profile is None:
        return 0
    if slot.ep_dtypes is None:
        slot.ep_dtypes = frozenset((e.shape.ep_size, e.shape.dtype) for e in slot.profile.entries)
    if (ep_size, dtype) in slot.ep_dtypes:
        return 2
    return int(any(d == dtype and ep > ep_size for ep, d in slot.ep_dtypes))


def _miss_message(fingerprint: str, tried: list) -> str:
    key = domain_key(fingerprint)
    relaxed = f" (nor one for {key[0]}.{key[1]}.*)" if key else ""
    return f"no profile for fingerprint {fingerprint!r}{relaxed}; searched: {', '.join(tried) or '(no directories)'}"


def locate(fingerprint: str, ep_size: int, dtype: str) -> tuple:
    """(path, level, problem) of the table that answers for ``fingerprint`` (normalised) at
    this EP size and dtype: of the tables found, the first with an entry for them, else the
    first with one for a larger EP size, else the first found (its answer says what it
    lacks). A table that does not load, or a place on the search path that cannot be read
    (``problem``), stops the search: it is reported, not skipped. (None, None, problem) when
    no table is found."""
    first = larger = None
    for path, level, problem in _tables(fingerprint, _search_dirs()):
        if path is None:  # every table was looked at; none has this EP size and dtype
            if first is None:
                return None, None, _miss_message(fingerprint, level)
            return (*(larger or first), None)
        if problem is not None:
            return path, level, problem
        first = first or (path, level)
        found = load_cached(path)
        covers = _covers(found, ep_size, dtype)
        if found.error is not None or covers == 2:
            return path, level, None
        if covers and larger is None:
            larger = path, level
    raise AssertionError("unreachable: _tables always ends with (None, tried, None)")


def find_profile(fingerprint: str):
    """Path of the profile for ``fingerprint`` in search order (exact name only); None (and
    a warning) on a miss. A place that cannot be read is returned too (loading it says why)."""
    try:
        fp = normalize_fingerprint(fingerprint)
    except ValueError as exc:
        warn_once(str(exc))
        return None
    path, tried, _ = _find(fp, _search_dirs())
    if path is None:
        warn_once(fallback_message(_miss_message(fp, tried)))
        return None
    from pathlib import Path

    return Path(path)


def hardware_problem(prof: Profile, path: str, level, expected_fp) -> tuple:
    """(hardware_match, problem or None) of a loaded table found at ``level`` (None: named by
    the caller) for the machine ``expected_fp`` (None: not checked). The table of a job this
    node took part in, or of the machine itself: the file's name is the fingerprint it must
    hold (a file holding another's table is corrupt, never borrowed)."""
    if expected_fp is None:
        return HW_UNCHECKED, None
    named_for = expected_fp if level != HW_CLUSTER else os.path.basename(path)[: -len(".json")]
    if level == HW_CLUSTER and prof.fingerprint == named_for:
        return HW_CLUSTER, None
    if prof.fingerprint == expected_fp:
        return HW_EXACT, None
    same_domain = domain_key(expected_fp) is not None and domain_key(prof.fingerprint) == domain_key(expected_fp)
    if level in (HW_EXACT, HW_CLUSTER) or not same_domain:
        whose = f"this machine is {expected_fp!r}" if level != HW_CLUSTER else f"the file is named for {named_for!r}"
        return HW_EXACT, f"{path}: hardware.fingerprint: profile is for {prof.fingerprint!r}, {whose}"
    return HW_SAME_DOMAIN, None


# --------------------------------------------------------------------------- this machine


_PROBED: list = []  # [(fingerprint or None, problem or None)] once probed


def resolve_fingerprint(fingerprint) -> tuple:
    """(normalised fingerprint, None) or (None, problem): ``fingerprint``, else
    ``$A2A_TUNE_FINGERPRINT``, else this machine's (probed once per process)."""
    if fingerprint is None:
        fingerprint = env_text(FINGERPRINT_ENV)  # blank: unset, probed
    if fingerprint is None:
        if not _PROBED:
            from a2a_tune.tuner.runtime.fingerprint import PROBE_TIMEOUT_S, probed_fingerprint

            try:
                _PROBED.append((probed_fingerprint(PROBE_TIMEOUT_S), None))
            except Exception as exc:
                _PROBED.append(
                    (None, f"hardware probe failed ({one_line(exc)}); pass fingerprint= or set {FINGERPRINT_ENV}")
                )
        return _PROBED[0]
    try:
        return normalize_fingerprint(fingerprint), None
    except ValueError as exc:
        return None, str(exc)


# -------------------------------------------------------------------------- loading


class _Loaded:
    """Cache slot for one (path, file identity): a Profile or the error, plus the answers
    lookup computed from it (``choices``: cached here so a rewritten table drops them)."""

    __slots__ = ("profile", "error", "choices", "ep_dtypes")

    def __init__(self, profile, error):
        self.profile = profile
        self.error = error
        self.choices = {}
        self.ep_dtypes = None  # (ep_size, dtype) of its entries, once asked (_covers)


# (path) -> (identity, _Loaded); identity = (st_mtime_ns, st_size, st_ino), so a
# rewritten file (select writes via os.replace: new inode) is re-read.
_CACHE: dict = {}
_WARNED: set = set()


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


def read_table_bytes(path) -> bytes:
    """The bytes of the table at ``path``, read the one way every reader of a table reads it
    (the lookup and every view): a regular file under MAX_TABLE_BYTES, never blocking; else
    ProfileError (one line naming the file)."""
    from a2a_tune.tuner.runtime.files import MAX_TABLE_BYTES, FileRefused, read_capped

    path = os.fspath(path)
    try:
        return read_capped(path, MAX_TABLE_BYTES)
    except FileRefused as exc:
        raise ProfileError(str(exc), path=path) from None
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}", path=path) from None


def parse_table_json(raw: bytes, path) -> object:
    """``raw`` (a table's bytes) as JSON data, or ProfileError (one line naming the file):
    `files.parse_json`'s problems."""
    from a2a_tune.tuner.runtime.files import FileRefused, parse_json

    try:
        return parse_json(raw)
    except FileRefused as exc:
        raise ProfileError(str(exc), path=os.fspath(path)) from None


def _read_and_parse(path: str) -> Profile:
    raw = read_table_bytes(path)
    # A table is tens of thousands of small objects, none of them in a reference cycle:
    # pausing the cyclic GC while building them saves ~20% of a cold lookup.
    import gc

    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return parse_profile(parse_table_json(raw, path), path)
    finally:
        if gc_was_enabled:
            gc.enable()


def load_cached(path: str) -> _Loaded:
    """The cache slot of the table at ``path``: read and parsed once per file identity."""
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
        slot = _Loaded(None, ProfileError(f"unexpected {one_line(exc)}", path=path))
    _CACHE[path] = (ident, slot)
    return slot


def load_profile(path) -> Profile:
    """Read and validate a profile file (schema 1 or 2); raises :class:`ProfileError`
    (one line) if unusable. Results are cached by (path, mtime, size, inode)."""
    slot = load_cached(os.fspath(path))
    if slot.error is not None:
        e = slot.error
        raise ProfileError(e.problem, field=e.field, path=e.path)
    return slot.profile


# --------------------------------------------------------------------------- warnings


def fallback_message(problem: str) -> str:
    """``problem`` (one safe line) and what the lookup does about it."""
    return f"{one_line(problem)}; using fallback all2all backend {FALLBACK_BACKEND!r}"


def warn_once(message: str) -> None:
    """One line on the ``a2a_tune`` logger, once per process for the same message."""
    message = one_line(message, 2 * LIMIT)  # a bounded problem and what is done about it
    if message not in _WARNED:
        _WARNED.add(message)
        import logging

        logging.getLogger("a2a_tune").warning("a2a-tune: %s", message)
