"""What an engine's start-up imports on the way to the table: `import a2a_tune.tuner.runtime.lookup`
in a fresh interpreter loads no module of a deny list (the metadata machinery a version string
costs, the validator select uses, the tuner's heavy libraries). Issue 37: `a2a_tune/__init__.py`
read `__version__` through importlib.metadata at import, about 23 ms of a 60 ms import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DENY = [
    "importlib.metadata",
    "email",
    "zipfile",
    "jsonschema",
    "torch",
    "numpy",
    "sqlalchemy",
    "rich",
    "typer",
    "pynvml",
    "a2a_tune.kernels",
    "a2a_tune.db",
    "a2a_tune.tuner.select",
]

CHILD = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps({{"before": sorted(before), "after": sorted(sys.modules)}}))
"""


def _loaded_by(module: str) -> tuple[set[str], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(module=module)], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    return set(seen["before"]), set(seen["after"]) - set(seen["before"])


def _denied(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == d or m.startswith(d + ".") for d in DENY))


@pytest.mark.parametrize("module", ["a2a_tune.tuner.runtime.lookup", "a2a_tune"])
def test_the_lookup_import_pulls_nothing_from_the_deny_list(module):
    before, loaded = _loaded_by(module)
    if already := _denied(before):
        pytest.skip(f"the interpreter loaded {already} before the import (a site hook): nothing to tell")
    assert _denied(loaded) == [], f"import {module} pulls {_denied(loaded)}"


def test_the_version_is_still_there_when_asked_for():
    from importlib.metadata import version

    import a2a_tune

    assert a2a_tune.__version__ == version("a2a-tune")
    with pytest.raises(AttributeError):
        a2a_tune.no_such_attribute  # noqa: B018
