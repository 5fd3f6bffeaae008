"""Runtime lookup: which all2all backend should this engine use on this machine?

Called by serving engines at start-up (directly, through ``a2a-tune lookup``, or through the
vLLM plugin :mod:`a2a_tune.tuner.runtime.vllm_plugin`). :func:`request` checks what is asked
(a shape, a load -- one step's tokens, a phase or a workload -- and optionally an engine) into
a :class:`LookupRequest`; :func:`answer` finds the table (:mod:`a2a_tune.tuner.runtime.profiles`),
picks the entry (exact shape, else the nearest with the same EP size and dtype) and the
backend with the lowest expected time there (:mod:`a2a_tune.tuner.runtime.estimate`), among
those the engine accepts (:mod:`a2a_tune.tuner.runtime.engines`); :func:`lookup` is both in one
call. Standard library only, and it never raises: any problem answers the documented
fallback :data:`FALLBACK_BACKEND` with one warning. The rules -- search order, shape
distance, loads, knobs, the memory budget -- are written once, in the README ("Runtime lookup").
"""

from __future__ import annotations

import math
import os
from types import MappingProxyType
from typing import NamedTuple

from a2a_tune.tuner.runtime import engines, savings
from a2a_tune.tuner.runtime.estimate import US_DECIMALS, bridge_gaps, decide, expected, where_text
from a2a_tune.tuner.runtime.fingerprint import HW_CLUSTER, HW_DEFAULT, HW_SAME_DOMAIN, normalize_fingerprint
from a2a_tune.tuner.runtime.point import (
    MAX_EP_SIZE,
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_TOKENS_PER_RANK,
    MAX_TOPK,
    PAYLOADS,
    PointError,
    Shape,
    check_tokens,
)
from a2a_tune.tuner.runtime.profiles import (
    CLUSTER_POINTER_SUFFIX,
    FINGERPRINT_ENV,
    HW_UNCHECKED,
    PROFILE_DIR_ENV,
    add_cluster_pointer,
    clear_cache,
    fallback_message,
    find_profile,
    hardware_problem,
    load_cached,
    load_profile,
    locate,
    profile_filename,
    profile_search_paths,
    resolve_fingerprint,
    user_profile_dir,
    warn_once,
)
from a2a_tune.tuner.runtime.table import (
    FALLBACK_BACKEND,
    SCHEMA_VERSION,
    Profile,
    ProfileEntry,
    ProfileError,
    describe_shape,
    parse_profile,
)
from a2a_tune.tuner.runtime.text import one_line

# The names below were all importable from this module before profiles.py split off; engines
# and tools import them from here (``a2a_tune.tuner.lookup`` is this module).
__all__ = [
    "FALLBACK_BACKEND",
    "SCHEMA_VERSION",
    "PROFILE_DIR_ENV",
    "FINGERPRINT_ENV",
    "CLUSTER_POINTER_SUFFIX",
    "HW_UNCHECKED",
    "PHASES",
    "SIZE_OPTION",
    "WORKSPACE_ENV",
    "Choice",
    "LookupRequest",
    "Profile",
    "ProfileEntry",
    "ProfileError",
    "RequestError",
    "Shape",
    "add_cluster_pointer",
    "answer",
    "clear_cache",
    "find_profile",
    "load_profile",
    "lookup",
    "normalize_fingerprint",
    "parse_profile",
    "profile_filename",
    "profile_search_paths",
    "request",
    "shape_distance",
    "user_profile_dir",
]

PHASES = ("decode", "prefill")
#: A workspace budget in MiB for every request that gives none (README, "Memory budget").
WORKSPACE_ENV = "A2A_TUNE_MAX_WORKSPACE_MIB"
#: The command line's option for each phase's ``max_tokens`` (``a2a-tune lookup``).
SIZE_OPTION = {"decode": "--max-batch", "prefill": "--max-tokens"}


class Choice:
    """The answer of :func:`lookup`; read-only (answers are cached and shared).

    ``backend``: our name; ``vllm_name`` / ``sglang_name`` / ``trtllm_name``: the engines'
    literals for it (from the profile) or None; ``engine_options``: engine -> the options
    that engine needs beside the literal (e.g. SGLang's ``--deepep-mode``); ``match``:
    ``"exact"``, ``"nearest-shape"`` or ``"fallback"`` (the shape rule, or no answer);
    ``hardware_match``: ``"exact"``, ``"cluster"``, ``"same-gpu-domain"``, ``"engine-default"``
    (no table) or ``"unchecked"`` (``profile=`` given without ``fingerprint=``); ``reason``: one line saying which
    profile, shape and token rule produced it (or what went wrong); ``source``: the
    profile path or None; ``profile_fingerprint``: the fingerprint of the table used;
    ``phase``: ``"tokens"``, ``"decode"``, ``"prefill"`` or ``"workload"``;
    ``expected_us``: each compared backend's expected median µs (empty on fallback): the
    competing ones and, over a range of token counts, those not measured at every count in
    it (compared, never chosen: they may have failed there); ``alternatives``: every other
    compared backend -> regret (expected / best expected - 1); ``regret``: the chosen
    backend's own (> 0 only when the tie rule preferred it over the fastest); ``tie``:
    whether the tie rule applied; ``timing``: compared backend -> timing mode of its curve;
    ``entry_shape``: the table shape used, or None; ``knobs``: the chosen backend's tuned
    knob setting at the measured token count nearest the load (empty: its defaults);
    ``over_budget``: backend -> MiB it holds per rank, for those the memory budget skipped;
    ``vs_default``: the engine's own default here (``engine``, ``engine_default``, its
    ``default_us``) and ``saving_us_per_layer`` against it (:mod:`~a2a_tune.tuner.runtime.savings`;
    empty on a fallback or when the default was not measured).

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
        "over_budget",
        "vs_default",
    )
    _MAPPINGS = ("expected_us", "alternatives", "timing", "knobs", "engine_options", "over_budget", "vs_default")
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
        over_budget=None,
        vs_default=None,
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


# --------------------------------------------------------------------------- request


class LookupRequest(NamedTuple):
    """A checked request (build it with :func:`request`): ``shape``; ``phase`` -- ``"tokens"``,
    ``"decode"``, ``"prefill"`` or ``"workload"``; ``load``, what the answer averages over: an
    :mod:`~a2a_tune.tuner.runtime.estimate` distribution (``("point", t)``,
    ``("log-uniform", 1, B)``, ``("discrete", ((t, w), ...))``) or ``("workload-file", path)``,
    read when answered; ``engine`` or None; ``fingerprint`` as given (None: this machine's);
    ``profile``: a table's path, or None to search for it; ``max_workspace_mib``: the memory
    budget per rank (None: none).

    A named tuple, frozen and hashable like a frozen dataclass; ``dataclasses`` would add
    ~7 ms (it imports ``inspect``) to every engine's start-up.
    """

    shape: Shape
    phase: str
    load: tuple
    engine: str | None = None
    fingerprint: str | None = None
    profile: str | None = None
    max_workspace_mib: float | None = None


class RequestError(ValueError):
    """A request :func:`request` refuses; ``str()`` is one line, ``phase`` the phase label
    the fallback answer carries."""

    def __init__(self, message: str, phase: str = "tokens"):
        super().__init__(one_line(message))
        self.phase = phase


def _shown(value) -> str:
    """A bounded ``repr`` for a message."""
    try:
        return one_line(repr(value), 80)
    except Exception:  # a huge int (beyond Python's digit limit) or a broken __repr__
        return f"<{type(value).__name__}>"


class _Words:
    """How :func:`request`'s errors name the arguments: lookup's keywords (``tokens=``), or the
    options a command line spells them with (``--tokens``; ``options`` maps an argument to
    the option it came from, e.g. ``{"max_tokens": "--max-batch"}``)."""

    _OPTIONS = {"num_experts": "--experts"}

    def __init__(self, options):
        self.cli = options is not None
        self.options = options or {}

    def name(self, arg: str, phase=None) -> str:
        if not self.cli:
            return f"{arg}="
        if arg == "max_tokens":
            return self.options.get(arg) or SIZE_OPTION.get(phase, "--max-tokens")
        return self.options.get(arg) or self._OPTIONS.get(arg) or "--" + arg.replace("_", "-")

    def invalid(self, arg: str, value, expected: str, cli_expected: str, phase=None) -> str:
        if self.cli:
            return f"{self.name(arg, phase)} must be {cli_expected}, got {_shown(value)}"
        return f"invalid lookup argument {arg}={_shown(value)} (expected {expected})"

    def count(self, arg: str, value, low: int, phase=None) -> int:
        """``value`` as an int >= ``low`` (integer-like objects such as numpy ints included)."""
        if not isinstance(value, bool):
            try:
                import operator

                i = operator.index(value)
                if i >= low:
                    return i
            except TypeError:
                pass
        raise RequestError(self.invalid(arg, value, f"an integer >= {low}", f">= {low}", phase), phase or "tokens")

    def tokens(self, arg: str, value, phase=None) -> int:
        """``value`` as a token count per rank: the point's one bound (1..2^20), which the CLI,
        the store and the table hold too."""
        import operator

        try:
            number = value if isinstance(value, bool) else operator.index(value)  # numpy ints too
        except TypeError:
            number = value  # not integer-like: check_tokens says so
        try:
            return check_tokens(number)
        except PointError as exc:
            if self.cli:
                raise RequestError(f"{self.name(arg, phase)}: {exc}", phase or "tokens") from None
            raise RequestError(f"invalid lookup argument {arg}={_shown(value)} ({exc})", phase or "tokens") from None

    def stray_size(self, other: str) -> str:
        """``max_tokens`` given where the load is ``other`` (tokens or a workload)."""
        if not self.cli:
            return f"max_tokens= goes with phase=, not with {other}="
        opt = self.name("max_tokens")
        return f"{opt} goes with --phase {'decode' if opt == SIZE_OPTION['decode'] else 'prefill'}"


def request(
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
    max_workspace_mib: float | None = None,
    options: dict | None = None,
) -> LookupRequest:
    """Lookup's request rules, in one place: the :class:`LookupRequest`, or
    :class:`RequestError` (one line) saying what is wrong. Arguments as for :func:`lookup`;
    ``options``: name them as the command line does (see :class:`_Words`), for
    ``a2a-tune lookup``. A workload file is read when answered, not here (a missing or
    broken one is the fallback, not a refused request)."""
    words = _Words(options)
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
        and (dtype not in PAYLOADS or PAYLOADS[dtype].problem(hidden) is None)
    ):
        shape = Shape(ep_size, hidden, topk, num_experts, dtype, routing)  # the common case, fast
    else:
        given = (("ep_size", ep_size), ("hidden", hidden), ("topk", topk), ("num_experts", num_experts))
        sizes = [words.count(n, v, 1) for n, v in given]
        for n, v in (("dtype", dtype), ("routing", routing)):
            if not isinstance(v, str):
                raise RequestError(words.invalid(n, v, "a string", "a string"))
        shape = Shape(*sizes, dtype, routing)
        problem = shape.problem()  # the point's bounds, top-k <= experts (uneven experts are fine)
        if problem:
            raise RequestError(f"invalid lookup shape: {problem}")
    if engine is not None and engine not in engines.ENGINES:
        raise RequestError(
            words.invalid(
                "engine",
                engine,
                f"None or one of {', '.join(map(repr, engines.ENGINES))}",
                " or ".join(engines.ENGINES),
            )
        )
    if profile is not None:
        try:
            profile = os.fspath(profile)
        except TypeError:
            raise RequestError(words.invalid("profile", profile, "a file path", "a file path")) from None
    phase, load = _load(words, tokens, phase, max_tokens, workload)
    budget = _budget(words, max_workspace_mib)
    return LookupRequest(shape, phase, load, engine, fingerprint, profile, budget)


def _budget(words: _Words, value) -> float | None:
    """The memory budget in MiB: the argument, else $A2A_TUNE_MAX_WORKSPACE_MIB; RequestError
    for one that is not a number >= 0."""
    name = words.name("max_workspace_mib")
    if value is None:
        value = os.environ.get(WORKSPACE_ENV, "").strip() or None
        if value is None:
            return None
        name = f"{WORKSPACE_ENV}="
        try:
            value = float(value)
        except ValueError:
            raise RequestError(f"invalid {name}{_shown(value)} (expected a number of MiB)") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        if words.cli and name.startswith("--"):
            raise RequestError(f"{name} must be a number of MiB >= 0, got {_shown(value)}")
        raise RequestError(f"invalid {name}{_shown(value)} (expected a number of MiB >= 0)")
    return float(value)


def _load(words: _Words, tokens, phase, max_tokens, workload) -> tuple:
    """(phase label, load) of a request (see :class:`LookupRequest`), or RequestError."""
    if (
        type(tokens) is int
        and 1 <= tokens <= MAX_TOKENS_PER_RANK
        and phase is None
        and max_tokens is None
        and workload is None
    ):
        return "tokens", ("point", tokens)  # the common case, fast
    given = [n for n, v in (("tokens", tokens), ("phase", phase), ("workload", workload)) if v is not None]
    if len(given) != 1:
        got = ", ".join(words.name(n).rstrip("=") if words.cli else n for n in given) or "none"
        if words.cli:
            raise RequestError(f"give exactly one of --tokens, --phase or --workload (got {got})")
        raise RequestError(f"give exactly one of tokens=, phase= (with max_tokens=) or workload= (got {got})")
    if tokens is not None:
        if max_tokens is not None:
            raise RequestError(words.stray_size("tokens"))
        return "tokens", ("point", words.tokens("tokens", tokens))
    if phase is not None:
        if phase not in PHASES:
            raise RequestError(words.invalid("phase", phase, "'decode' or 'prefill'", "decode or prefill"))
        size = words.name("max_tokens", phase)
        if words.cli and size != SIZE_OPTION[phase] and max_tokens is not None:
            raise RequestError(words.stray_size("phase"))
        if max_tokens is None:
            if words.cli:
                raise RequestError(f"--phase {phase} needs {size} N", phase)
            what = "max batch per rank" if phase == "decode" else "tokens per rank per prefill step"
            raise RequestError(f"phase={phase!r} needs max_tokens= ({what})", phase)
        n = words.tokens("max_tokens", max_tokens, phase)
        return phase, ("log-uniform", 1, n) if phase == "decode" else ("point", n)
    if max_tokens is not None:
        raise RequestError(words.stray_size("workload"), "workload")
    from collections.abc import Mapping

    if isinstance(workload, Mapping):
        from a2a_tune.tuner.runtime import workload as wl

        try:
            return "workload", ("discrete", wl.parse_workload(workload))
        except wl.WorkloadError as exc:
            raise RequestError(f"workload: {exc}", "workload") from None
    try:
        return "workload", ("workload-file", os.fspath(workload))
    except TypeError:
        expected = "a file path or a mapping"
        raise RequestError(words.invalid("workload", workload, expected, "a file path"), "workload") from None


# --------------------------------------------------------------------------- answer


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
    max_workspace_mib: float | None = None,
) -> Choice:
    """Pick the all2all backend for this shape and load. Never raises.

    Give exactly one of ``tokens`` (tokens per rank per step), ``phase`` ("decode" /
    "prefill", with ``max_tokens``) or ``workload`` (a JSON / CSV histogram file, or a
    ``{tokens: weight}`` mapping); see the README. ``profile`` names a file directly (its
    fingerprint is then only checked when ``fingerprint`` is given too); otherwise the
    profile of ``fingerprint`` (or ``$A2A_TUNE_FINGERPRINT``, or the probed one) is searched
    for. ``engine`` (``"vllm"``, ``"sglang"`` or ``"trtllm"``) lets only backends that
    engine accepts a literal for compete. ``quiet``: do not log the fallback warning (the
    caller reports ``Choice.reason``). ``max_workspace_mib`` (default
    ``$A2A_TUNE_MAX_WORKSPACE_MIB``): skip backends holding more device memory per rank.
    """
    args = dict(locals())  # the request's arguments, as given
    del args["quiet"]
    try:
        req = request(**args)
    except RequestError as exc:
        return _reported(_fallback(str(exc), phase=exc.phase), engine, quiet)
    except Exception as exc:  # never crash the engine
        return _reported(_fallback(f"internal error in a2a-tune lookup ({one_line(exc)})"), engine, quiet)
    return answer(req, quiet=quiet)


def answer(req: LookupRequest, *, quiet: bool = False) -> Choice:
    """The :class:`Choice` for a request from :func:`request`. Never raises; ``quiet`` as
    for :func:`lookup`."""
    try:
        choice = _answer(req)
    except Exception as exc:  # never crash the engine
        choice = _fallback(f"internal error in a2a-tune lookup ({one_line(exc)})")
    return _reported(choice, req.engine, quiet)


def _reported(choice: Choice, engine, quiet: bool) -> Choice:
    if choice.match == "fallback" and not quiet:
        warn_once(_warning_for(choice.reason, engine))
    return choice


_MAX_CACHED_CHOICES = 4096  # answers kept per profile


def _answer(req: LookupRequest) -> Choice:
    phase, load, dist = req.phase, req.load, req.load
    if load[0] == "workload-file":
        path = load[1]
        try:
            st = os.stat(path)
        except OSError as exc:
            return _fallback(f"workload {path}: cannot read: {exc.strerror or exc}", phase=phase)
        load, dist = (*load, st.st_mtime_ns, st.st_size, st.st_ino), None  # read on a cache miss

    level = None  # which search level found the table (None: the caller named the file)
    if req.profile is not None:
        path, expected_fp = req.profile, None
        if req.fingerprint is not None:
            try:
                expected_fp = normalize_fingerprint(req.fingerprint)
            except ValueError as exc:
                return _fallback(str(exc), path, phase=phase)
    else:
        expected_fp, problem = resolve_fingerprint(req.fingerprint)
        if problem:
            return _fallback(problem, phase=phase)
        path, level, problem = locate(expected_fp, req.shape.ep_size, req.shape.dtype)
        if problem:
            return _fallback(problem, path, phase=phase)

    slot = load_cached(path)
    if slot.error is not None:
        return _fallback(str(slot.error), path, phase=phase)
    prof = slot.profile
    hw, problem = hardware_problem(prof, path, level, expected_fp)
    if problem:
        return _fallback(problem, path, profile_fingerprint=prof.fingerprint, phase=phase)

    key = (req.shape, req.engine, phase, load, hw, expected_fp, req.max_workspace_mib)
    choice = slot.choices.get(key)
    if choice is None:
        if dist is None:
            from a2a_tune.tuner.runtime.workload import WorkloadError, load_workload

            try:
                dist = ("discrete", load_workload(req.load[1]))
            except WorkloadError as exc:
                return _fallback(f"workload {exc}", phase=phase)  # not cached: the file may be fixed
        choice = _choose(prof, path, req.shape, dist, phase, req.engine, hw, expected_fp, req.max_workspace_mib)
        if len(slot.choices) >= _MAX_CACHED_CHOICES:  # e.g. a caller sweeping every token count
            slot.choices.clear()
        slot.choices[key] = choice
    return choice


# --------------------------------------------------------------------------- choose


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


def _workspace_need(entry: ProfileEntry, backend: str, dist):
    """MiB `backend` holds per rank to serve `dist`: the most at the measured token counts up to
    the first covering the load's largest step; None where the table does not hold it."""
    values = entry.figures.get(backend, {}).get("workspace_mib")
    if not values:
        return None
    kind = dist[0]
    top = dist[1] if kind == "point" else dist[2] if kind == "log-uniform" else max(t for t, _ in dist[1])
    covering = next((j for j, t in enumerate(entry.tokens) if t >= top), len(entry.tokens) - 1)
    known = [v for v in values[: covering + 1] if v is not None] or [v for v in values if v is not None]
    return max(known) if known else None


def _within_budget(entry: ProfileEntry, curves: dict, dist, budget) -> tuple:
    """(the curves within `budget`, {backend: MiB} of those skipped, the words saying so)."""
    if budget is None:
        return curves, {}, ""
    need = {b: _workspace_need(entry, b, dist) for b in curves}
    over = {b: mib for b, mib in need.items() if mib is not None and mib > budget}
    unknown = sorted(b for b, mib in need.items() if mib is None)
    text = f"; workspace budget {budget:g} MiB: "
    text += (
        "skipped " + ", ".join(f"{b} ({mib:g} MiB)" for b, mib in sorted(over.items())) if over else "nothing skipped"
    )
    if unknown:
        text += f" (memory not in the table: {', '.join(unknown)}, kept)"
    return {b: c for b, c in curves.items() if b not in over}, over, text


def _choose(
    prof: Profile,
    path: str,
    want: Shape,
    dist,
    phase: str,
    engine: str | None,
    hw: str,
    machine_fp: str | None,
    budget=None,
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
    curves, over, budget_text = _within_budget(entry, curves, dist, budget)
    medians = {b: round(v, US_DECIMALS) for b, v in expected(entry.tokens, curves, dist).items()}
    if not medians:
        return _fallback(
            f"{path}: {shape_text}, {where}: {_unusable(entry, prof, engine, want)}{budget_text}",
            path,
            over_budget=over,
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
    # Over a range, a backend not measured at some count inside it (a refinement count timed
    # only for the contenders, or a count where it failed) is compared on its own measured
    # counts but never chosen.
    compared = dict(medians)
    gapped = {}
    if dist[0] == "discrete" or (dist[0] == "log-uniform" and dist[1] < dist[2]):
        bridged = {b: bridge_gaps(entry.tokens, c) for b, c in curves.items() if b not in medians}
        bridged = {b: c for b, c in bridged.items() if c is not None}
        gapped = {b: round(v, US_DECIMALS) for b, v in expected(entry.tokens, bridged, dist).items()}
        compared.update(gapped)
    if gapped:
        vs += "; not measured at every token count in range, so compared but not chosen: " + ", ".join(
            f"{b} {(v / best - 1) * 100:+.1f}%" for v, b in sorted((v, b) for b, v in gapped.items())
        )
    modes = {b: entry.timing.get(b, "eager") for b in compared}
    if len(set(modes.values())) > 1:
        vs += " [timing: " + ", ".join(f"{b} {m}" for b, m in sorted(modes.items())) + "]"
    hw_text = {
        HW_SAME_DOMAIN: f" (measured on {prof.fingerprint}: same GPUs and NVLink domain as {machine_fp})",
        HW_CLUSTER: f" (measured by a job over the nodes of {prof.fingerprint}, this node among them)",
    }.get(hw, "")
    names = prof.backends[chosen]
    return Choice(
        vs_default=_vs_default(entry, prof, want, dist, engine, medians[chosen]),
        backend=chosen,
        vllm_name=names.vllm_name,
        sglang_name=names.sglang_name,
        trtllm_name=names.trtllm_name,
        engine_options=names.engine_options,
        match=match,
        reason=one_line(f"profile {fname}{hw_text}, {shape_text}, {where}: {vs}{budget_text}"),
        source=path,
        expected_us=compared,
        entry_shape=entry.shape,
        alternatives={b: round(v / best - 1, 4) for b, v in compared.items() if b != chosen},
        regret=round(medians[chosen] / best - 1, 4),
        tie=len(tied) > 1,
        timing=modes,
        knobs=_knobs_at(entry, chosen, dist),
        over_budget=over,
        **common,
    )


def _vs_default(entry: ProfileEntry, prof: Profile, want: Shape, dist, engine, chosen_us: float) -> dict:
    """The engine's default on this entry and the choice's saving against it (savings.py)."""
    eng = engine or savings.DEFAULT_ENGINE
    measured = [b for b in entry.median_us if b not in entry.failed]
    label, pool = savings.default_backends(eng, prof.backends, measured, want.num_experts, want.ep_size)
    # a count the default was not measured at (a refinement count) is bridged, as for "compared"
    pool_curves = {b: bridge_gaps(entry.tokens, entry.median_us[b]) or entry.median_us[b] for b in pool}
    times = expected(entry.tokens, pool_curves, dist)
    if not times:
        return {}
    default_us = round(min(times.values()), US_DECIMALS)
    return {
        "engine": eng,
        "engine_default": label,
        "default_us": default_us,
        "saving_us_per_layer": round(default_us - chosen_us, US_DECIMALS),
    }


# How a failure's kind (the first word of a table's ``failed`` reason) reads in a list.
_FAILURE_KINDS = {
    "unavailable": "unavailable",
    "not_applicable": "not applicable",
    "incorrect": "incorrect",
    "error": "failed",
    "timeout": "timed out",
}


def _unusable(entry: ProfileEntry, prof: Profile, engine, want: Shape) -> str:
    """Why no backend competes: "no usable backend [that <engine> accepts]", and of those the
    engine could run, which the table lists as unavailable, incorrect, ... there."""
    kinds: dict = {}
    for b, reason in sorted(entry.failed.items()):
        if engine is None or _expressible(engine, prof.backends[b], want):
            kind = reason.split(":", 1)[0].split(" at ", 1)[0].strip()
            kinds.setdefault(_FAILURE_KINDS.get(kind, "failed"), []).append(b)
    text = f"no usable backend{f' that {engines.NAMES[engine]} accepts' if engine else ''}"
    if kinds:
        text += " (" + "; ".join(f"{kind}: {', '.join(bs)}" for kind, bs in kinds.items()) + ")"
    return text


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
    """The backend's knob setting at the measured token count nearest the load (in log space,
    the larger on a tie): the point; the decode range's log-midpoint; a workload's weighted
    log-mean. {} when the table has none there."""
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


# --------------------------------------------------------------------------- fallback


# What an engine that is not told a backend does (the warning says so instead of the fallback).
_KEPT_DEFAULT = {
    "sglang": f"SGLang keeps its default --moe-a2a-backend {engines.DEFAULT['sglang']}",
    "trtllm": "TensorRT-LLM keeps its own choice (no TRTLLM_FORCE_COMM_METHOD)",
}


def _warning_for(reason: str, engine) -> str:
    kept = _KEPT_DEFAULT.get(engine) if isinstance(engine, str) else None
    generic = fallback_message("")
    if kept and reason.endswith(generic):
        return f"{reason[: -len(generic)]}; {kept}"
    return reason


def _fallback(
    problem: str,
    source: str | None = None,
    *,
    hardware_match: str = HW_DEFAULT,
    profile_fingerprint: str | None = None,
    phase: str = "tokens",
    over_budget=None,
) -> Choice:
    return Choice(
        backend=FALLBACK_BACKEND,
        vllm_name=FALLBACK_BACKEND,
        sglang_name=None,  # SGLang: keep the engine's own default
        trtllm_name=None,  # TensorRT-LLM: keep its own priority list
        match="fallback",
        reason=fallback_message(problem),
        source=source,
        hardware_match=hardware_match,
        profile_fingerprint=profile_fingerprint,
        phase=phase,
        over_budget=over_budget,
    )
