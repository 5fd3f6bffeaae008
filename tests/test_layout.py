"""The tree's dependency rules, checked: what engines import at start-up is stdlib only, and
the layering rule (docs/architecture.md, "Layering") holds for every import statement."""

import ast
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import a2a_tune.tuner.runtime as runtime

RUNTIME_MODULES = sorted(f"a2a_tune.tuner.runtime.{m.name}" for m in pkgutil.iter_modules(runtime.__path__))


def test_the_runtime_package_has_the_start_up_modules():
    assert {"a2a_tune.tuner.runtime.lookup", "a2a_tune.tuner.runtime.vllm_plugin"} <= set(RUNTIME_MODULES)


def test_every_runtime_module_imports_only_the_standard_library():
    # One interpreter per module: a module that pulls in torch would hide behind another.
    for name in RUNTIME_MODULES:
        code = f"""
import json, sys
before = set(sys.modules)
import {name}
ours = ("a2a_tune", "a2a_tune.tuner", "a2a_tune.tuner.runtime")
foreign = sorted(m for m in set(sys.modules) - before
                 if m.split(".")[0] not in sys.stdlib_module_names
                 and m not in ours and not m.startswith("a2a_tune.tuner.runtime."))
print(json.dumps(foreign))
"""
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [], name


def test_the_old_import_paths_are_the_runtime_modules():
    import a2a_tune.tuner.lookup as old_lookup
    import a2a_tune.tuner.runtime.lookup as new_lookup
    import a2a_tune.tuner.runtime.vllm_plugin as new_plugin
    import a2a_tune.tuner.vllm_plugin as old_plugin

    assert old_lookup is new_lookup and old_lookup.lookup is new_lookup.lookup
    assert old_plugin is new_plugin


def test_the_vllm_entry_point_resolves():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "a2a_tune"]
    assert callable(ep.load())


def test_the_store_the_table_and_lookup_name_a_point_with_the_point_type():
    """One vocabulary: runtime.point's Shape and Point are the table's entry key, the store's
    key columns (the backend, then the point, in one order) and lookup's request."""
    import inspect

    from a2a_tune.db import MeasurementKey
    from a2a_tune.db.models import KEY_FIELDS, Failure, Measurement
    from a2a_tune.tuner.runtime import point, table
    from a2a_tune.tuner.runtime.lookup import request

    assert point.Shape._fields == point.SHAPE_FIELDS and point.Point._fields == point.POINT_FIELDS
    assert KEY_FIELDS == ("backend",) + point.POINT_FIELDS
    assert MeasurementKey._fields == KEY_FIELDS
    for model in (Measurement, Failure):
        assert set(KEY_FIELDS) <= set(model.__table__.columns.keys())
    assert table.Shape is point.Shape and table.SHAPE_KEYS == point.SHAPE_FIELDS
    assert set(point.SHAPE_FIELDS) <= set(inspect.signature(request).parameters)  # lookup() takes these


# ------------------------------------------------------------------------------ layering

ROOT = Path(__file__).resolve().parents[1]
FOUNDATION = "a2a_tune.tuner.runtime"
# The layering rule: which of our packages each folder may import (itself included). kernels/
# and db/ stand on the runtime, the standard-library foundation, and on nothing else of
# tuner/ (nor on each other); the runtime stands on the standard library alone. tuner/ may
# import everything.
LAYERS = {
    "kernels": ("a2a_tune.kernels", FOUNDATION),
    "db": ("a2a_tune.db", FOUNDATION),
    "tuner/runtime": (FOUNDATION,),
}
# The runtime imports the standard library only, but a plugin may import the engine it runs in.
HOSTS = {"vllm_plugin.py": "vllm"}
# Third-party packages a folder must not import: the store works without torch.
SHUNNED = {"db": ("torch",)}


def _module_name(path: Path) -> str:
    """The dotted name a file of the tree is imported as (tuner/x.py: a2a_tune.tuner.x)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["a2a_tune", *parts])


def _imports(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, dotted name) of every import statement in `source` -- at the top, in functions,
    under `if` -- relative ones resolved against `module`; ``from m import n`` names ``m.n``
    (n may be a module)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def layering_breaks(path: Path, allowed: tuple, *, stdlib_only: bool = False, shunned: tuple = ()) -> list[str]:
    """The imports of the file at `path` that break the layering rule: names of ours
    (a2a_tune.*) outside `allowed`, packages in `shunned`, and with `stdlib_only` any other
    package beyond the standard library (and the engine a plugin runs in, HOSTS).
    ``path:line: name`` each."""
    module = _module_name(path)
    breaks = []
    for line, name in _imports(path.read_text(), module, path.name == "__init__.py"):
        top = name.split(".")[0]
        if top == "a2a_tune":
            ok = name == "a2a_tune.__future__" or any(name == a or name.startswith(a + ".") for a in allowed)
        else:
            ok = top not in shunned and (
                not stdlib_only or top in sys.stdlib_module_names or top in ("__future__", HOSTS.get(path.name))
            )
        if not ok:
            breaks.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    return breaks


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_every_import_keeps_the_layering_rule(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, folder
    runtime_only = folder == "tuner/runtime"
    shunned = SHUNNED.get(folder, ())
    breaks = [b for f in files for b in layering_breaks(f, LAYERS[folder], stdlib_only=runtime_only, shunned=shunned)]
    assert breaks == [], f"imports that break the layering rule (docs/architecture.md): {breaks}"


def test_the_layering_check_finds_a_planted_import_wherever_it_stands(tmp_path, monkeypatch):
    """The checker itself: a module in kernels/ that imports the tuner -- at the top, relative,
    in a function, or the store -- is named; what the rule allows is not."""
    source = (
        "import torch\n"
        "from a2a_tune.tuner.runtime.text import one_line\n"
        "from .base import MoEShape\n"
        "from a2a_tune.tuner import plans\n"
        "from ..tuner.runtime import point\n"
        "from .. import db\n"
        "def later():\n"
        "    import a2a_tune.tuner.sweep\n"
        "    from ..tuner.measure import Result\n"
    )
    copy = tmp_path / "kernels" / "planted.py"
    copy.parent.mkdir()
    copy.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    breaks = layering_breaks(copy, LAYERS["kernels"])
    assert breaks == [
        "kernels/planted.py:4: a2a_tune.tuner.plans",
        "kernels/planted.py:6: a2a_tune.db",
        "kernels/planted.py:8: a2a_tune.tuner.sweep",
        "kernels/planted.py:9: a2a_tune.tuner.measure.Result",
    ]
    # the runtime: the standard library only, also inside functions
    runtime_copy = tmp_path / "tuner" / "runtime" / "planted.py"
    runtime_copy.parent.mkdir(parents=True)
    runtime_copy.write_text("import json\nfrom . import text\ndef f():\n    import numpy\n    from .. import plans\n")
    db_copy = tmp_path / "db" / "planted.py"
    db_copy.parent.mkdir()
    db_copy.write_text("import sqlalchemy\nfrom a2a_tune.tuner.runtime.point import Point\nimport torch\n")
    assert layering_breaks(db_copy, LAYERS["db"], shunned=SHUNNED["db"]) == ["db/planted.py:3: torch"]
    assert layering_breaks(runtime_copy, LAYERS["tuner/runtime"], stdlib_only=True) == [
        "tuner/runtime/planted.py:4: numpy",
        "tuner/runtime/planted.py:5: a2a_tune.tuner.plans",
    ]


# The views stand on the tuner, never the reverse: no module of tuner/ outside views/ and the
# command line (cli/, which wires everything) imports a view. What both need to print to the
# console lives below them (tuner/console.py).
VIEWS = "a2a_tune.tuner.views"
ABOVE_VIEWS = ("views", "cli")


def view_imports(path: Path) -> list[str]:
    """The imports of a view in the file at `path` (``path:line: name`` each)."""
    found = _imports(path.read_text(), _module_name(path), path.name == "__init__.py")
    return [f"{path.relative_to(ROOT)}:{line}: {n}" for line, n in found if n == VIEWS or n.startswith(VIEWS + ".")]


def test_the_tuner_imports_no_view():
    files = [
        f for f in sorted((ROOT / "tuner").rglob("*.py")) if f.relative_to(ROOT / "tuner").parts[0] not in ABOVE_VIEWS
    ]
    assert len(files) > 20
    breaks = [b for f in files for b in view_imports(f)]
    assert breaks == [], f"tuner/ imports the views, which import tuner/ (docs/architecture.md): {breaks}"


def test_the_view_check_finds_a_planted_import(tmp_path, monkeypatch):
    planted = tmp_path / "tuner" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("from .console import fit\ndef f():\n    from .views.layout import fit\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert view_imports(planted) == ["tuner/planted.py:3: a2a_tune.tuner.views.layout.fit"]


def test_no_code_of_ours_reads_optunas_tables():
    """Tuned knobs are rows of ours (db/knobs.py): Optuna keeps its trials in its own tables,
    which only Optuna's API reads (the 0005 revision's one-time copy included)."""
    files = [p for folder in ("tuner", "db", "kernels") for p in sorted((ROOT / folder).rglob("*.py"))]
    theirs = re.compile(r"study_user_attributes|trial_params|trial_values|(?<!has_)table\(\"studies\"|FROM studies")
    reads = [f"{p.relative_to(ROOT)}: {m.group()}" for p in files for m in theirs.finditer(p.read_text())]
    assert reads == []
    assert theirs.search('studies = table("studies", column("study_id"))')  # what tuner/studies.py had
