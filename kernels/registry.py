"""Backends register by name with a decorator; the sweep and the CLI ask the registry.

Out-of-tree backends: name their modules in `A2A_TUNE_BACKEND_MODULES` (comma-separated);
they are imported on first use of the registry, in every rank, and register themselves.
Each import is given `A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S` seconds (default 60): a module
still importing then (waiting on a lock, a socket, a device) fails the command in one line
naming it, instead of hanging it. The import runs in a thread: a module that blocks in
native code without releasing the GIL is beyond this bound, and one cannot install signal
handlers at import.

The classmethods the sweep asks before any case starts (`availability`, `feasibility`) are
out-of-tree code too: `availability_of` and `feasibility_of` call them within
`A2A_TUNE_BACKEND_CALL_TIMEOUT_S` seconds (default 30) and catch what they raise, so a
backend that raises or blocks there is unavailable (or the shape infeasible) with one line
saying why, and the others go on. A call that did not return is not made again. The same
bound holds for `knobs()`, which the measurement asks of a built backend (`knobs_of`): what it
raises or a call that blocks is an error of that case, never of the sweep.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from typing import Any, TypeVar

from a2a_tune.tuner.runtime.engines import ENGINES
from a2a_tune.tuner.runtime.environ import EnvError
from a2a_tune.tuner.runtime.environ import env_seconds as _env_seconds
from a2a_tune.tuner.runtime.text import one_line, quoted

from .base import REACHES, All2AllBackend, Availability
from .errors import KernelsError, UnknownBackendError

_REGISTRY: dict[str, type[All2AllBackend]] = {}
B = TypeVar("B", bound=type[All2AllBackend])

MODULES_ENV = "A2A_TUNE_BACKEND_MODULES"
IMPORT_TIMEOUT_ENV = "A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S"
DEFAULT_IMPORT_TIMEOUT_S = 60.0
CALL_TIMEOUT_ENV = "A2A_TUNE_BACKEND_CALL_TIMEOUT_S"
DEFAULT_CALL_TIMEOUT_S = 30.0


def register_backend(cls: B) -> B:
    """Class decorator: make `cls` reachable as `get_backend(cls.name)`."""
    name = cls.name
    if cls.reach not in REACHES:
        raise ValueError(f"backend {name!r}: reach {cls.reach!r} is not one of {', '.join(REACHES)}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"backend name {name!r} registered twice ({_REGISTRY[name].__qualname__}, {cls.__qualname__})")
    _REGISTRY[name] = cls
    return cls


_extra_loaded = False
# (the A2A_TUNE_BACKEND_MODULES value, its error): a failed load fails every later use at once
_extra_error: tuple[str, KernelsError] | None = None
_loading = False


def import_timeout() -> float:
    """Seconds each out-of-tree module may take to import ($A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S)."""
    return env_seconds(IMPORT_TIMEOUT_ENV, DEFAULT_IMPORT_TIMEOUT_S)


def call_timeout() -> float:
    """Seconds a backend's availability/feasibility may take ($A2A_TUNE_BACKEND_CALL_TIMEOUT_S)."""
    return env_seconds(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_S)


def env_seconds(name: str, default: float) -> float:
    """$name as seconds (`runtime.environ.env_seconds`); KernelsError (one line naming the
    variable and the range) otherwise."""
    try:
        return _env_seconds(name, default)
    except EnvError as exc:
        raise KernelsError(str(exc)) from None


def _bounded(call: Any, seconds: float, what: str) -> list[Any]:
    """Run `call()` in a thread for at most `seconds`: [] when it has not returned (the thread
    is left behind: nothing can stop it), else [value, None] or [None, what it raised]."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            value = call()
            outcome.extend((value, None))
        except BaseException as exc:  # handed to the caller's thread
            outcome.extend((None, exc))

    thread = threading.Thread(target=run, name=f"a2a-tune {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome


def _import_bounded(module: str, seconds: float) -> None:
    """Import `module` in a thread; KernelsError when it has not finished in `seconds` or
    when it raised."""
    outcome = _bounded(lambda: importlib.import_module(module), seconds, f"import {module}")
    if not outcome:
        raise KernelsError(
            f"{MODULES_ENV}: importing {quoted(module)} did not finish within {seconds:g} s "
            f"({IMPORT_TIMEOUT_ENV}); what does it wait for at import?"
        )
    exc = outcome[1]
    if exc is not None:  # whatever the module raises: one line naming it, not a traceback
        raise KernelsError(f"{MODULES_ENV}: cannot import {quoted(module)} ({one_line(exc, 300)})") from exc


def _load_extra_modules() -> None:
    global _extra_loaded, _extra_error, _loading
    value = os.environ.get(MODULES_ENV, "")
    if _extra_error is not None and _extra_error[0] == value:
        raise _extra_error[1]
    if _extra_loaded or _loading:  # _loading: asked by a module being imported; it sees what is registered
        return
    modules = [m for m in (m.strip() for m in value.split(",")) if m]
    _loading = True
    try:
        seconds = import_timeout() if modules else 0.0
        for module in modules:
            _import_bounded(module, seconds)
    except KernelsError as exc:
        _extra_error = (value, exc)
        raise
    finally:
        _loading = False
    _extra_loaded = True


def list_backends() -> list[str]:
    """Registered backend names, in registration order (simplest first)."""
    _load_extra_modules()
    return list(_REGISTRY)


def get_backend(name: str, *, extra: bool = True) -> type[All2AllBackend]:
    """The backend registered as `name`; `extra=False`: without importing A2A_TUNE_BACKEND_MODULES."""
    if extra:
        _load_extra_modules()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBackendError(f"unknown backend {quoted(name)}; known: {', '.join(_REGISTRY) or 'none'}") from None


def engine_names(*, extra: bool = True) -> dict[str, dict[str, Any]]:
    """Every registered backend -> what a table records of it: ``engines`` (engine -> its
    literal, None where it has none), ``closest`` (engine -> its backend doing the same job,
    where it has no literal) and ``engine_options`` (engine -> the options it needs beside the
    literal). `extra=False`: only what is registered already, without importing
    A2A_TUNE_BACKEND_MODULES."""
    if extra:
        _load_extra_modules()
    return {
        n: {
            "engines": {**dict.fromkeys(ENGINES), **cls.engine_names},
            "closest": dict(cls.closest_names),
            "engine_options": {engine: list(opts) for engine, opts in cls.engine_options.items()},
        }
        for n, cls in list(_REGISTRY.items())
    }


class CallFailed(Availability):
    """What `availability_of` / `feasibility_of` return when the backend's own method raised,
    blocked or returned nonsense: an error of the backend, not its verdict."""


_stuck: dict[tuple[str, str], str] = {}  # (backend, method) -> why: a call that never returned is not made again


def _asked(cls: type[All2AllBackend], method: str, *args: Any) -> Availability:
    """`cls.method(*args)` bounded (`call_timeout`) and caught: its Availability, or a
    CallFailed saying in one line what went wrong. Raises only KernelsError, for an invalid
    $A2A_TUNE_BACKEND_CALL_TIMEOUT_S."""
    key = (cls.name, method)
    seconds = call_timeout()
    if key not in _stuck:
        outcome = _bounded(lambda: getattr(cls, method)(*args), seconds, f"{cls.name}.{method}")
        if outcome:
            return _verdict(method, *outcome)
        _stuck[key] = f"{method}() did not return within {seconds:g} s ({CALL_TIMEOUT_ENV})"
    return CallFailed(False, _stuck[key])


def _verdict(method: str, value: Any, exc: BaseException | None) -> Availability:
    if exc is not None:
        return CallFailed(False, f"{method}() raised {one_line(exc, 200)}")
    try:
        ok, reason = value
    except (TypeError, ValueError):
        return CallFailed(False, f"{method}() returned {one_line(repr(value), 80)}, not (ok, reason)")
    return Availability(bool(ok), one_line(str(reason), 300) if reason else "")


def availability_of(cls: type[All2AllBackend], env: Any) -> Availability:
    """`cls.availability(env)`, bounded and caught (module docstring): never raises, never hangs."""
    return _asked(cls, "availability", env)


def feasibility_of(cls: type[All2AllBackend], shape: Any, world_size: int) -> Availability:
    """`cls.feasibility(shape, world_size)`, bounded and caught: a shape the backend cannot
    even judge is one it cannot take."""
    return _asked(cls, "feasibility", shape, world_size)


def knobs_of(backend: All2AllBackend) -> tuple[dict[str, Any], str]:
    """`backend.knobs()`, bounded (`call_timeout`) and caught like `availability_of`: (the
    settings in effect, "") or ({}, one line saying what went wrong). Raises only KernelsError,
    for an invalid $A2A_TUNE_BACKEND_CALL_TIMEOUT_S."""
    key = (type(backend).name, "knobs")
    seconds = call_timeout()
    if key not in _stuck:
        outcome = _bounded(backend.knobs, seconds, f"{key[0]}.knobs")
        if outcome:
            value, exc = outcome
            if exc is not None:
                return {}, f"knobs() raised {one_line(exc, 200)}"
            if not isinstance(value, Mapping):
                return {}, f"knobs() returned {one_line(repr(value), 80)}, not a dict"
            return dict(value), ""
        _stuck[key] = f"knobs() did not return within {seconds:g} s ({CALL_TIMEOUT_ENV})"
    return {}, _stuck[key]
