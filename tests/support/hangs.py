"""A hang fails the test instead of stalling the suite."""

from __future__ import annotations

import threading


def bounded(fn, seconds: float = 10.0):
    """fn() in a thread: its result or its exception, or a test failure when it is still running
    after `seconds` (a hang must fail the test, not stall the suite)."""
    out: list = []

    def run():
        try:
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            out.append((False, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s (a hang)"
    ok, value = out[0]
    if not ok:
        raise value
    return value
