"""a2a-tune: measure the MoE all2all backends per machine and answer engines at start-up.

The package's subpackages live in the repository's top-level folders (pyproject.toml maps
them): ``a2a_tune.tuner`` (tuner/), ``a2a_tune.kernels`` (kernels/), ``a2a_tune.db`` (db/),
``a2a_tune.profiles`` (profiles/). Importing this module imports none of them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("a2a-tune")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
