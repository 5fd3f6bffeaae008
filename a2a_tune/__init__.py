"""a2a-tune: measure the MoE all2all backends per machine and answer engines at start-up.

The package's subpackages live in the repository's top-level folders (pyproject.toml maps
them): ``a2a_tune.tuner`` (tuner/), ``a2a_tune.kernels`` (kernels/), ``a2a_tune.db`` (db/),
``a2a_tune.profiles`` (profiles/). Importing this module imports none of them, nor
``importlib.metadata``: every engine's start-up imports this package on the way to the
lookup, so ``__version__`` is read from the installed metadata only when asked for.
"""


def __getattr__(name: str):
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("a2a-tune")
    except PackageNotFoundError:  # a source tree that was never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
