"""Backends register by name with a decorator; the sweep and the CLI ask the registry.

Out-of-tree backends: name their modules in `A2A_TUNE_BACKEND_MODULES` (comma-separated);
they are imported on first use of the registry, in every rank, and register themselves.
Each import is given `A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S` seconds (default 60): a module
still importing then (waiting on a lock, a socket, a device) fails the command in one line
naming it, instead of hanging it. The import runs in a thread: a module that blocks in
native code without releasing the GIL is beyond this bound, and one cannot install signal
handlers at import.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any, TypeVar

from a2a_tune.tuner.runtime.text import one_line

from .base import REACHES, All2AllBackend
from .errors import KernelsError, UnknownBackendError

_REGISTRY: dict[str, type[All2AllBackend]] = {}
B = TypeVar("B", bound=type[All2AllBackend])

MODULES_ENV = "A2A_TUNE_BACKEND_MODULES"
IMPORT_TIMEOUT_ENV = "A2A_TUNE_BACKEND_IMPORT_TIMEOUT_S"
DEFAULT_IMPORT_TIMEOUT_S = 60.0


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
    value = os.environ.get(IMPORT_TIMEOUT_ENV, "")
    try:
        seconds = float(value) if value.strip() else DEFAULT_IMPORT_TIMEOUT_S
    except ValueError:
        raise KernelsError(f"{IMPORT_TIMEOUT_ENV}={value[:40]!r} is not a number of seconds") from None
    if not seconds > 0:
        raise KernelsError(f"{IMPORT_TIMEOUT_ENV}={value[:40]!r} must be more than 0")
    return seconds


def _import_bounded(module: str, seconds: float) -> None:
    """Import `module` in a thread; KernelsError when it has not finished in `seconds` (the
    thread is left behind: nothing can stop an import) or when it raised."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            importlib.import_module(module)
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, name=f"a2a-tune import {module}", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise KernelsError(
            f"{MODULES_ENV}: importing {module!r} did not finish within {seconds:g} s "
            f"({IMPORT_TIMEOUT_ENV}); what does it wait for at import?"
        )
    exc = outcome[0]
    if exc is not None:  # whatever the module raises: one line naming it, not a traceback
        raise KernelsError(f"{MODULES_ENV}: cannot import {module!r} ({one_line(exc, 300)})") from exc


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
        raise UnknownBackendError(f"unknown backend {name!r}; known: {', '.join(_REGISTRY) or 'none'}") from None


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
            "engines": dict(cls.engine_names),
            "closest": dict(cls.closest_names),
            "engine_options": {engine: list(opts) for engine, opts in cls.engine_options.items()},
        }
        for n, cls in list(_REGISTRY.items())
    }
