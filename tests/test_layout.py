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


def test_the_store_and_the_table_name_a_shape_with_the_same_keys():
    """One vocabulary: the table's shape keys (runtime.table.SHAPE_KEYS, the one order the
    tuner uses) are the columns a store record carries its point in, less the token count."""
    from a2a_tune.db.models import SHAPE_FIELDS
    from a2a_tune.tuner.runtime.table import SHAPE_KEYS, Shape

    assert Shape._fields == SHAPE_KEYS
    assert set(SHAPE_FIELDS) == {*SHAPE_KEYS, "tokens_per_rank"}
