"""Runtime lookup: which all2all backend should this engine use on this machine?

Called by serving engines at start-up (directly, through ``a2a-tune lookup``, or through the
vLLM plugin :mod:`a2a_tune.tuner.runtime.vllm_plugin`). Three steps, one module each:
:func:`~a2a_tune.tuner.runtime.request.request` checks what is asked (a shape, a load -- one
step's tokens, a phase or a workload -- and optionally an engine) into a
:class:`LookupRequest`; :func:`answer` finds the table (:mod:`a2a_tune.tuner.runtime.profiles`)
and :func:`~a2a_tune.tuner.runtime.choice.choose` picks the entry and the backend there;
:func:`lookup` is both in one call. Standard library only, and it never raises: any problem
answers the documented fallback :data:`FALLBACK_BACKEND` with one warning. The rules --
search order, shape distance, loads, knobs, the memory budget -- are written once, in the
README ("Runtime lookup").
"""

from __future__ import annotations

import os

from a2a_tune.tuner.runtime import engines
from a2a_tune.tuner.runtime.choice import Choice, choose, shape_distance
from a2a_tune.tuner.runtime.choice import fallback as _fallback
from a2a_tune.tuner.runtime.fingerprint import normalize_fingerprint
from a2a_tune.tuner.runtime.point import Shape
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
from a2a_tune.tuner.runtime.request import PHASES, WORKSPACE_ENV, LookupRequest, RequestError, request
from a2a_tune.tuner.runtime.table import (
    FALLBACK_BACKEND,
    SCHEMA_VERSION,
    Profile,
    ProfileEntry,
    ProfileError,
    parse_profile,
)
from a2a_tune.tuner.runtime.text import one_line

# The lookup's public names, whichever module defines them (profiles.py, request.py, choice.py):
# engines and tools import them from here (``a2a_tune.tuner.lookup`` is this module).
__all__ = [
    "FALLBACK_BACKEND",
    "SCHEMA_VERSION",
    "PROFILE_DIR_ENV",
    "FINGERPRINT_ENV",
    "CLUSTER_POINTER_SUFFIX",
    "HW_UNCHECKED",
    "PHASES",
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

# request()'s keywords: lookup() takes the same (and ``quiet``), so they are named once.
_CODE = request.__code__
_REQUEST_KEYWORDS = frozenset(_CODE.co_varnames[_CODE.co_argcount : _CODE.co_argcount + _CODE.co_kwonlyargcount])
_REQUIRED = frozenset(_REQUEST_KEYWORDS - set(request.__kwdefaults__ or ()))


def lookup(*, quiet: bool = False, **args) -> Choice:
    """Pick the all2all backend for this shape and load. Never raises (but for a call whose
    keywords are not :func:`~a2a_tune.tuner.runtime.request.request`'s: a TypeError, as
    Python gives).

    The arguments are :func:`~a2a_tune.tuner.runtime.request.request`'s (``ep_size``,
    ``hidden``, ``topk``, ``num_experts``; one of ``tokens``, ``phase`` with ``max_tokens``,
    or ``workload``; ``dtype``, ``routing``, ``fingerprint``, ``profile``, ``engine``,
    ``max_workspace_mib``); see the README. A request it refuses is answered with the
    fallback and the request's words. ``quiet``: do not log the fallback warning (the caller
    reports ``Choice.reason``).
    """
    if not _REQUIRED <= args.keys() <= _REQUEST_KEYWORDS:  # a wrong call, not a bad request
        wrong = sorted(args.keys() - _REQUEST_KEYWORDS) or [f"(missing) {n}" for n in sorted(_REQUIRED - args.keys())]
        raise TypeError(f"lookup() keyword arguments: {', '.join(wrong)}")
    try:
        req = request(**args)
    except RequestError as exc:
        return _reported(_fallback(str(exc), phase=exc.phase), args.get("engine"), quiet)
    except Exception as exc:  # never crash the engine
        return _reported(_fallback(f"internal error in a2a-tune lookup ({one_line(exc)})"), args.get("engine"), quiet)
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

    key = (req.shape, req.engine, phase, load, hw, expected_fp, req.max_workspace_mib, req.deployment)
    choice = slot.choices.get(key)
    if choice is None:
        if dist is None:
            from a2a_tune.tuner.runtime.workload import WorkloadError, load_workload

            try:
                dist = ("discrete", load_workload(req.load[1]))
            except WorkloadError as exc:
                return _fallback(f"workload {exc}", phase=phase)  # not cached: the file may be fixed
        choice = choose(
            prof, path, req.shape, dist, phase, req.engine, hw, expected_fp, req.max_workspace_mib, req.deployment
        )
        if len(slot.choices) >= _MAX_CACHED_CHOICES:  # e.g. a caller sweeping every token count
            slot.choices.clear()
        slot.choices[key] = choice
    return choice


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
