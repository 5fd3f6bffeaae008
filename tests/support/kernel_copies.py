"""A copy of a kernel module with a few lines changed, imported as a module of its own: how the
tests plant a bug in the shipped kernels (tests/support/planted_kernels.py) and compare a
kernel's code with and without a switch (tests/kernels/test_virtual.py). Nothing is written to
disk: the copy's source lives in `linecache`, where Triton (`inspect.getsource`) finds it."""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import sys
from types import ModuleType


def copy_module(module: ModuleType, name: str, edits: list[tuple[str, str]]) -> ModuleType:
    """`module`'s source with each (old, new) of `edits` applied (old must occur exactly once:
    a kernel that changed fails loudly instead of planting nothing), imported as `name`."""
    source = inspect.getsource(module)
    for old, new in edits:
        if source.count(old) != 1:
            raise AssertionError(f"{module.__name__}: {old.strip()!r} is not in it exactly once")
        source = source.replace(old, new)
    filename = f"<copy of {module.__name__}: {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    spec = importlib.util.spec_from_loader(name, loader=None)
    copy = importlib.util.module_from_spec(spec)
    copy.__package__ = module.__package__  # its relative imports resolve as the original's
    sys.modules[name] = copy
    exec(compile(source, filename, "exec"), copy.__dict__)
    return copy
