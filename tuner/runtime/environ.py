"""Values read from the environment, checked where they are read. Numbers: one line naming the
variable and the range it accepts (EnvError), never a bare ``float()`` traceback, a NaN that
disables a watchdog, or a negative timeout handed to gloo. Text: a blank value (spaces only) is
the variable unset, never a file or directory named by spaces; an XDG base directory that is not
absolute is ignored, as the XDG spec says. The list of variables: docs/commands.md. Standard
library only."""

from __future__ import annotations

import math
import os

__all__ = ["MAX_SECONDS", "EnvError", "env_seconds", "env_text", "xdg_dir"]

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


def env_text(name: str) -> str | None:
    """$name as it is set, or None when unset or blank (spaces only: unset, as for numbers)."""
    value = os.environ.get(name, "")
    return value if value.strip() else None


def xdg_dir(name: str, *default: str) -> str:
    """The XDG base directory $name (XDG_DATA_HOME, XDG_CACHE_HOME) when it is an absolute path,
    else ~/`default` (unset, blank or relative: the spec says to ignore it)."""
    value = os.environ.get(name, "")
    return value if os.path.isabs(value) else os.path.join(os.path.expanduser("~"), *default)
