"""Out-of-tree backends whose calls misbehave (issue 31.2): availability()/feasibility() before
any case starts, knobs() once a case is timed. The sweep, `backends` and `check` must name them
in one line and go on without them.

Imported through A2A_TUNE_BACKEND_MODULES=unruly_backends (tests/support on the path).
"""

from __future__ import annotations

import time

from planting import planted_backend


def _raise(exc: BaseException):
    raise exc


def _on_rank(rank: int, misbehave):
    """knobs() that misbehaves (`misbehave()`) on `rank` only: the other ranks go on into the
    next collective, and must not wait there for ever."""

    def knobs(self):
        return misbehave() if self.rank == rank else {"planted": True}

    return knobs


planted_backend(
    "planted_availability_raises",
    "availability() raises.",
    availability=classmethod(lambda cls, env: _raise(RuntimeError("planted: probing the fabric failed"))),
)
planted_backend(
    "planted_availability_blocks",
    "availability() waits on something that never answers (a lock, a socket, a device).",
    availability=classmethod(lambda cls, env: time.sleep(3600)),
)
planted_backend(
    "planted_feasibility_raises",
    "feasibility() raises.",
    feasibility=classmethod(lambda cls, shape, world_size: _raise(ZeroDivisionError("planted: division by zero"))),
)
planted_backend(
    "planted_availability_nonsense",
    "availability() returns a bare bool instead of (ok, reason).",
    availability=classmethod(lambda cls, env: True),
)
planted_backend(
    "planted_knobs_raises",
    "Correct, but knobs() raises on rank 0 once its case is timed.",
    knobs=_on_rank(0, lambda: _raise(KeyError("planted: no such setting"))),
)
planted_backend(
    "planted_knobs_blocks",
    "Correct, but knobs() never returns on rank 1 (it waits on a lock the backend's own thread holds).",
    knobs=_on_rank(1, lambda: time.sleep(3600)),
)
planted_backend(
    "planted_knobs_nonsense",
    "Correct, but knobs() returns a list, not the settings by name.",
    knobs=lambda self: ["planted"],
)
