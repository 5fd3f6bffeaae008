"""Backends register by name with a decorator; the sweep and the CLI ask the registry.

Out-of-tree backends: name their modules in `A2A_TUNE_BACKEND_MODULES` (comma-separated);
they are imported on first use of the registry, in every rank, and register themselves.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, TypeVar

from .base import All2AllBackend
from .errors import KernelsError, UnknownBackendError

_REGISTRY: dict[str, type[All2AllBackend]] = {}
B = TypeVar("B", bound=type[All2AllBackend])


def register_backend(cls: B) -> B:
    """Class decorator: make `cls` reachable as `get_backend(cls.name)`."""
    name = cls.name
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"backend name {name!r} registered twice ({_REGISTRY[name].__qualname__}, {cls.__qualname__})")
    _REGISTRY[name] = cls
    return cls


_extra_loaded = False


def _load_extra_modules() -> None:
    global _extra_loaded
    if _extra_loaded:
        return
    for module in filter(None, (m.strip() for m in os.environ.get("A2A_TUNE_BACKEND_MODULES", "").split(","))):
        try:
            importlib.import_module(module)
        except Exception as exc:  # whatever the module raises: one line naming it, not a traceback
            cause = (str(exc).strip().splitlines() or [""])[0]
            kind = "" if isinstance(exc, ImportError) else f"{type(exc).__name__}: "
            raise KernelsError(f"A2A_TUNE_BACKEND_MODULES: cannot import {module!r} ({kind}{cause})") from exc
    _extra_loaded = True


def list_backends() -> list[str]:
    """Registered backend names, in registration order (simplest first)."""
    _load_extra_modules()
    return list(_REGISTRY)


def get_backend(name: str) -> type[All2AllBackend]:
    _load_extra_modules()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBackendError(f"unknown backend {name!r}; known: {', '.join(_REGISTRY) or 'none'}") from None


def engine_names() -> dict[str, dict[str, Any]]:
    """Every registered backend -> the engines' literals for it (vllm_name, sglang_name,
    trtllm_name), vLLM's closest backend where vLLM has none, and the options an engine needs
    beside the literal (engine_options): what a table records per backend."""
    return {
        n: {
            "vllm_name": cls.vllm_name,
            "sglang_name": cls.sglang_name,
            "trtllm_name": cls.trtllm_name,
            "vllm_closest": cls.vllm_closest,
            "engine_options": {engine: list(opts) for engine, opts in cls.engine_options.items()},
        }
        for n, cls in ((n, get_backend(n)) for n in list_backends())
    }
