"""No import cycles among tuner/, kernels/ and db/: every `import` statement counts, at module
level or inside a function (a lazy import still ties the two modules together).

An edge is module A naming module B in an import: `import a.b.c` and `from a.b import c`
(when `c` is a submodule) name `a.b.c`; `from a.b import name` names `a.b`. Relative imports
are resolved against the importing module. The packages a module sits in (and those Python
runs on the way to a submodule) are not edges: a package's `__init__` importing its own
submodules is what a package is. Nor are the imports of an `if TYPE_CHECKING:` block, which
never run (type hints only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import REPO

# pyproject's [tool.setuptools.package-dir]: folder -> import name
PACKAGES = {"tuner": "a2a_tune.tuner", "kernels": "a2a_tune.kernels", "db": "a2a_tune.db"}


def module_files(repo: Path) -> dict[str, Path]:
    """Every module of the three packages: import name -> file."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((repo / folder).rglob("*.py")):
            parts = list(path.relative_to(repo / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from ... import` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _runnable_imports(node: ast.AST):
    """The import statements under `node`, but those of an `if TYPE_CHECKING:` body."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    test = node.test if isinstance(node, ast.If) else None
    type_checking = isinstance(test, (ast.Name, ast.Attribute)) and "TYPE_CHECKING" in (
        getattr(test, "id", None),
        getattr(test, "attr", None),
    )
    for child in node.orelse if type_checking else ast.iter_child_nodes(node):
        yield from _runnable_imports(child)


def import_edges(repo: Path) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, within the three packages."""
    files = module_files(repo)
    edges: dict[str, dict[str, int]] = {m: {} for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runnable_imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, _is_package(path), node)
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in files else source)
            for target in targets:
                # `import a.b.c` of a name that is no module of ours: the deepest module it names
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != module and target not in _ancestors(module):
                    edges[module].setdefault(target, node.lineno)
    return edges


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (first module repeated at the end) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_cycle_in(group, edges) for group in groups]


def _cycle_in(group: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest cycle through the group's first module (breadth-first inside the group)."""
    start, members = group[0], set(group)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    path = [v]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in {group}")


def describe(cycle: list[str], edges: dict[str, dict[str, int]], files: dict[str, Path], repo: Path) -> str:
    steps = [f"  {a} -> {b}  ({files[a].relative_to(repo)}:{edges[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(m.removeprefix("a2a_tune.") for m in cycle) + "\n" + "\n".join(steps)


def test_tuner_kernels_and_db_import_no_module_that_imports_them_back():
    edges = import_edges(REPO)
    files = module_files(REPO)
    cycles = find_cycles(edges)
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(describe(c, edges, files, REPO) for c in cycles)


# ------------------------------------------------------------------------- the walk itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in PACKAGES:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").touch()
    return tmp_path


T = "a2a_tune.tuner."
K = "a2a_tune.kernels."
CHAIN = {  # a -> b at module level, b -> c and c -> a inside functions
    "tuner/a.py": "from . import b\n",
    "tuner/b.py": "def f():\n    from .c import g\n",
    "tuner/c.py": "def g():\n    from a2a_tune.tuner.a import x\n",
}


@pytest.mark.parametrize(
    "files, module, its_edges, cycles",
    [
        (CHAIN, T + "b", {T + "c": 2}, [[T + "a", T + "b", T + "c", T + "a"]]),
        (  # `from package import submodule` names the submodule
            {
                "kernels/__init__.py": "from .quant import q\n",
                "kernels/quant.py": "from a2a_tune.kernels import _k\n",
                "kernels/_k.py": "import a2a_tune.kernels.quant\n",
            },
            K + "quant",
            {K + "_k": 1},
            [[K + "_k", K + "quant", K + "_k"]],
        ),
        (  # a package imports its module, the module reads a name from its package: no cycle
            {
                "db/__init__.py": "from .store import Store\nERRORS = 1\n",
                "db/store.py": "from a2a_tune.db import ERRORS\nfrom .. import db\nimport a2a_tune.tuner.runtime.point\n",
                "tuner/runtime/__init__.py": "",
                "tuner/runtime/point.py": "import os\n",
            },
            "a2a_tune.db.store",
            {T + "runtime.point": 3},
            [],
        ),
        (  # a type hint's import never runs; its `else:` does
            {
                "db/lease.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store import Store\n",
                "db/store.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from . import lease\n",
            },
            "a2a_tune.db.store",
            {"a2a_tune.db.lease": 5},
            [],
        ),
    ],
    ids=["function-level-relative", "package-submodule", "own-package", "type-checking"],
)
def test_the_walk_finds_each_import_and_every_cycle(tmp_path, files, module, its_edges, cycles):
    edges = import_edges(_tree(tmp_path, files))
    assert edges[module] == its_edges
    assert find_cycles(edges) == cycles


def test_a_cycle_is_printed_with_the_line_of_each_import(tmp_path):
    repo = _tree(tmp_path, CHAIN)
    edges = import_edges(repo)
    text = describe(find_cycles(edges)[0], edges, module_files(repo), repo)
    assert text.splitlines() == [
        "tuner.a -> tuner.b -> tuner.c -> tuner.a",
        "  a2a_tune.tuner.a -> a2a_tune.tuner.b  (tuner/a.py:1)",
        "  a2a_tune.tuner.b -> a2a_tune.tuner.c  (tuner/b.py:2)",
        "  a2a_tune.tuner.c -> a2a_tune.tuner.a  (tuner/c.py:2)",
    ]
