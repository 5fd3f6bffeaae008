"""The tree's dependency rules, checked: what engines import at start-up is stdlib only."""

import json
import pkgutil
import subprocess
import sys

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
