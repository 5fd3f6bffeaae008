"""The sweep's supervisor: starts the ranks (tuner.ranks runs the cases), watches them, restarts.

`sweep` runs the plan on `world_size` ranks, spawned here or this process's torchrun/srun
job, with one writer per run (a2a_tune.db). The caller has checked the plan whole and the
store's URL (tuner.plans.build_plan / check_plan; a2a_tune.db.check_url): ranks start at once.

What this side owns, the rank side does not:
* restarts: a case that makes no progress for `case_timeout` seconds, or whose rank's
  process dies, is recorded against its backend ("timeout", "crashed"), every rank is
  stopped and the ranks restart on the same run without that backend (at most MAX_RESTARTS);
* the run's end when the ranks cannot record it: "interrupted" on Ctrl-C / SIGTERM
  (`SweepInterrupted`), "failed" when ranks died between cases or restarts ran out;
* the lease: the restarted ranks hold the run as the same writer, so no other sweep takes it.
Progress is the ranks' (rank 0 draws the bar); the heartbeat file is how they tell this
process which case they are in.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from a2a_tune.db import (
    MeasurementKey,
    StoreError,
    Writer,
    open_store,
    resolve_url,
)

from .launch import (
    Heartbeat,
    RankContext,
    RankCrashed,
    RankFailed,
    RanksLost,
    launched_externally,
    run_ranks,
)
from .plans import DEFAULT_ITERS, DEFAULT_TOKENS, SweepPlan
from .ranks import CompletedRun, ResumeRefused, SweepOutcome, Target, left_out, sweep_rank

__all__ = [
    "DEFAULT_ITERS",
    "DEFAULT_TOKENS",
    "CompletedRun",
    "ResumeRefused",
    "SweepOutcome",
    "SweepPlan",
    "sweep",
]  # the plan's names: tuner.plans


DEFAULT_CASE_TIMEOUT_S = 600.0  # one case: gate + warm-up + timing (first cases also compile kernels)
MAX_RESTARTS = 8


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP stopped the sweep; its run (``run_id``, None if none was opened yet)
    is marked "interrupted" and can be resumed."""

    def __init__(self, run_id: int | None, signal_name: str = "SIGINT") -> None:
        super().__init__(f"run {run_id} interrupted by {signal_name}")
        self.run_id = run_id
        self.signal_name = signal_name


def sweep(
    plan: SweepPlan,
    *,
    device_type: str,
    world_size: int,
    db_url: str | None,
    resume: bool = False,
    progress: bool = True,
    case_timeout: float = DEFAULT_CASE_TIMEOUT_S,
    allow_mixed: bool = False,
    after: Callable[[RankContext, CompletedRun], Any] | None = None,
    launched_at: _dt.datetime | None = None,
) -> SweepOutcome | None:
    """Run the sweep on `world_size` ranks (spawned here, or this process's torchrun job).
    Returns the outcome; None on the non-zero ranks of a torchrun/srun job.

    The run has one writer: this process (see a2a_tune.db, "One writer per run"). `resume`
    continues the latest unfinished run of the same plan unless another live process holds
    it (then `RankFailed` says who), leaving out the backends that hung or crashed in it; when
    the plan's latest run completed it changes nothing and reports that run. A sweep that lost
    its run stops without changing it.

    `plan` must be checked whole for `device_type` x `world_size` and `db_url` be a checked
    URL (see the module docstring): ranks start at once.
    `allow_mixed`: sweep even when the nodes differ (tuner.cluster); the run records the mix.
    `after`: the caller's step after a completed run, called on every rank together (it may
    use their process group) as `after(ctx, CompletedRun)`; picklable, for spawned ranks.
    Rank 0's answer is `outcome.after`.
    `launched_at`: when the command began (aware; None: now), stored as the new run's start,
    or the resumed run's latest resume, so the run's duration counts its ranks' start-up.

    Spawned ranks are watched: a case that makes no progress for `case_timeout` seconds (a
    hung collective or kernel) gets every rank killed — the only way to free a wedged NCCL
    communicator or GPU — is recorded as a "timeout" failure, its backend is left out of the
    rest of this sweep, and the ranks restart on the same run, skipping what is stored. A
    rank whose process dies in a case (a segfault, ``abort()``, ``os._exit``, the OOM
    killer) is handled the same way, recorded as "crashed" with its exit code or signal.
    A rank that dies outside any case marks the run "failed" and raises `RankCrashed`; a rank's
    error marks it "failed" (rank 0 does) and raises `RankFailed`. Ctrl-C or SIGTERM stops every rank, marks the run "interrupted" and raises
    `SweepInterrupted`; after `kill -9` the run stays "running" and `resume` takes it over.
    """
    launched_at = launched_at or _dt.datetime.now(_dt.timezone.utc)  # before any rank starts
    writer = Writer.this_process()
    skip: dict[str, str] = {}  # backend -> why the rest of this sweep goes on without it
    lost: dict[str, str] = {}  # backend -> the failure kind it was left out for
    run_id: int | None = None  # known once rank 0 opened the run (its first heartbeat)
    with tempfile.TemporaryDirectory(prefix="a2a-tune-") as tmp:
        heartbeat = Heartbeat(Path(tmp) / "heartbeat.json")
        stalled = None if launched_externally() else heartbeat.stalled_after(case_timeout)
        for _ in range(MAX_RESTARTS + 1):
            try:
                results = run_ranks(
                    sweep_rank,
                    world_size,
                    device_type,
                    plan,
                    Target(db_url, resume, run_id, writer, launched_at),
                    progress,
                    heartbeat,
                    dict(skip),
                    {"allow_mixed": allow_mixed, "after": after},
                    stalled=stalled,
                )
            except RanksLost as exc:
                # A case hung, or a rank's process died in it: the case that rank was in is
                # recorded against its backend, which the restarted ranks leave out.
                doing = heartbeat.of_rank(exc.rank or 0).last()
                run_id = run_id or heartbeat.fact("run_id")
                heartbeat.clear()  # the restarted ranks start a fresh heartbeat
                if doing is None:  # between cases: nothing to blame, nothing to go on without
                    _mark_stopped(db_url, run_id, writer, "failed")
                    raise
                key = MeasurementKey(*doing["key"])
                run_id = doing["run_id"]
                kind, reason = _lost_case(exc, case_timeout)
                _record_lost(db_url, run_id, key, kind, reason, writer)
                skip[key.backend] = left_out(kind, key.tokens_per_rank, reason)
                lost[key.backend] = kind
                continue  # the same run, held by the same writer
            except KeyboardInterrupt as exc:
                run_id = run_id or heartbeat.fact("run_id")
                _mark_stopped(db_url, run_id, writer, "interrupted")
                raise SweepInterrupted(run_id, getattr(exc, "signal_name", "SIGINT")) from None
            outcome = next((r for r in results if r is not None), None)
            if outcome is None:  # a non-zero rank of a torchrun/srun job: rank 0 reports
                return None
            for backend, why in skip.items():
                outcome.failed[lost[backend]] = outcome.failed.get(lost[backend], 0) + 1
                outcome.infeasible[backend] = why
            return outcome
    _mark_stopped(db_url, run_id, writer, "failed")
    raise RankFailed(f"gave up after {MAX_RESTARTS} restarts of lost ranks")


def _lost_case(exc: RanksLost, case_timeout: float) -> tuple[str, str]:
    """(failure kind, reason) for a case that lost its ranks."""
    if isinstance(exc, RankCrashed):
        return "crashed", f"rank {exc.rank} {exc.how}; every rank was stopped"
    return "timeout", f"no progress for {case_timeout:.0f} s; every rank was stopped"


def _record_lost(db_url: str | None, run_id: int, key: MeasurementKey, kind: str, reason: str, writer: Writer) -> None:
    """Record the lost case, taking the run back first: rank 0 may have seen its peer go and
    marked the run failed (releasing it) before it was stopped."""
    with open_store(db_url) as store:
        store.claim_run(run_id, writer)
        store.add_failure(run_id, kind=kind, reason=reason, writer=writer, **key._asdict())


def _mark_stopped(db_url: str | None, run_id: int | None, writer: Writer, status: str) -> None:
    """Mark `run_id` `status` ("interrupted", "failed") for `writer` and release it, so ranks
    that were stopped or died do not leave it "running"; nothing when rank 0 already finished
    it (or the run is another's: the lease decides), when no run was opened, or under
    torchrun/srun (rank 0 records its own end there). Not after a rank's own error: rank 0
    recorded the end itself, and the store may be what failed (a replaced SQLite file must not
    be opened again: the old file's -wal beside it would be replayed into it)."""
    if run_id is None or launched_externally() or _file_gone(db_url):
        return
    try:
        with open_store(db_url) as store:
            store.finish_run(run_id, status, writer=writer)
    except StoreError:
        pass


def _file_gone(db_url: str | None) -> bool:
    """Whether the store is an SQLite file that is not there any more (deleted mid-sweep):
    opening it would create an empty one in its place."""
    from sqlalchemy.engine import make_url

    url = make_url(resolve_url(db_url))
    path = url.database
    return (
        url.get_backend_name() == "sqlite"
        and bool(path)
        and not path.startswith(("file:", ":memory:"))
        and (not os.path.exists(path))
    )
