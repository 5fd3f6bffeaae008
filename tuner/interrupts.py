"""SIGTERM and SIGHUP handled as Ctrl-C is: a :class:`Terminated` (a KeyboardInterrupt) raised
in the main thread, so the code that stops ranks and records a run on Ctrl-C runs for them too,
and the exit code is the one a shell reports for the signal (:data:`SIGNAL_EXIT`). Standard
library only: the command line's light commands use it too."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["SIGNAL_EXIT", "Terminated", "sigterm_as_interrupt"]

# The exit code of a command a signal stopped: 128 + the signal's number, as a shell reports it.
SIGNAL_EXIT = {"SIGINT": 130, "SIGHUP": 129, "SIGTERM": 143}


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM or SIGHUP (its terminal or SSH session closed): handled like
    Ctrl-C (ranks stopped, run recorded). `signal_name` says which."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"terminated ({signal_name})")
        self.signal_name = signal_name


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM or SIGHUP raises :class:`Terminated` while inside; outside the main thread, as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)
