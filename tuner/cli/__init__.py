"""`a2a-tune`: the command line, one module per command group. Heavy imports (torch,
SQLAlchemy) happen inside the commands that need them, so `a2a-tune lookup` stays as light as
the runtime lookup itself.

Importing the modules registers their commands, in the order `--help` lists them."""

from . import run, tune, lookup, views, listings, db  # noqa: F401, I001 - registration order
from .common import app, main

__all__ = ["app", "main"]
