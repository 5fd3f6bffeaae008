"""Numbers read from the environment, checked where they are read: one line naming the variable
and the range it accepts (EnvError), never a bare ``float()`` traceback, a NaN that disables a
watchdog, or a negative timeout handed to gloo. Standard library only."""

from __future__ import annotations

import math
import os

__all__ = ["MAX_SECONDS", "EnvError", "env_seconds"]

#: The longest timeout a variable may set: a week (gloo and NCCL take milliseconds in C ints).
MAX_SECONDS = 7 * 24 * 3600.0


class EnvError(Exception):
    """An environment variable out of its range; ``str()`` is one line naming it. Not a
    ValueError, so no handler of bad input values takes it for one: the command line ends
    with it (exit 2) before any rank starts."""


def env_seconds(name: str, default: float) -> float:
    """$name as a number of seconds in (0, MAX_SECONDS] (unset or blank: ``default``)."""
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise EnvError(f"{name}={shown!r}: expected a number of seconds more than 0 and at most {MAX_SECONDS:g}")
    return seconds
