"""A run's one writer: the lease in its ``runs`` row, and the heartbeat that keeps it.

A run is held by at most one :class:`Writer` at a time (its lease: token, host, pid, since,
heartbeat in the ``runs`` row). Every write to a run -- measurement, failure, finish -- first
checks the lease in the same transaction (:func:`fence`), so a process that lost the run
writes nothing and never changes another's status (:class:`LeaseLostError`); a write
without a writer is refused while anyone holds the run. :func:`claim` takes a run over only
when nobody holds it, its holder is silent for :data:`LEASE_STALE_S` seconds
(:class:`LeaseHeartbeat` beats every :data:`HEARTBEAT_S`), or its holder's pid is dead on
this same host (same boot and PID namespace); otherwise it raises :class:`RunBusyError`
naming the holder. Lease times come from the writers' clocks: hosts sharing a store keep
them within seconds (NTP).

The functions here run inside a session the :class:`~a2a_tune.db.store.Store` opened; the
Store's ``start_run``, ``claim_run``, ``heartbeat`` and writes are the API.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .errors import LeaseLostError, NotFoundError, RunBusyError, StoreError, StoreFileLostError
from .models import Run, utcnow

if TYPE_CHECKING:
    from .store import Store

LEASE_STALE_S = 60.0  # a writer silent this long is taken for dead: its run may be taken over
HEARTBEAT_S = 10.0  # how often a live writer says so (LeaseHeartbeat); well inside LEASE_STALE_S


def _pid_scope() -> str:
    """Where a pid names one process: this boot (Linux boot id) and PID namespace; "" when
    unknown (then no pid is ever checked, only heartbeats)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process in this PID namespace."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # killed, not yet reaped: dead
    except (OSError, IndexError):
        return True


@dataclasses.dataclass(frozen=True)
class Writer:
    """The identity a process writes a run under (its lease, see the module docstring).

    ``token`` is random and secret to the writer; ``host`` and ``pid`` name it to people;
    ``scope`` says where ``pid`` can be checked. A sweep makes one in the process the
    operator started and hands it to the rank that writes, so restarted ranks keep the run.
    """

    token: str
    host: str
    pid: int
    scope: str

    @classmethod
    def this_process(cls) -> Writer:
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), _pid_scope())


class LeaseHeartbeat:
    """Keeps a writer's hold on a run fresh from a daemon thread (every ``interval`` s) while
    the writer's main thread measures. ``lost`` holds the reason once the run was taken
    over (or the store's file is gone); the writer's next write raises anyway. A context
    manager."""

    def __init__(self, store: Store, run_id: int, writer: Writer, interval: float = HEARTBEAT_S) -> None:
        self.lost: str | None = None
        self._args = (store, run_id, writer)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"a2a-tune run {run_id} heartbeat", daemon=True)

    def _beat(self) -> None:
        store, run_id, writer = self._args
        while not self._stop.wait(self._interval):
            try:
                store.heartbeat(run_id, writer)
            except (LeaseLostError, StoreFileLostError) as exc:
                self.lost = str(exc)
                return
            except StoreError:
                pass  # a busy or briefly unreachable database: the next beat tries again

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- in a session


def lease_values(writer: Writer, now: dt.datetime) -> dict[str, Any]:
    """The ``runs`` columns that say ``writer`` holds the run since ``now``."""
    return {
        "writer_token": writer.token,
        "writer_host": writer.host[:255],
        "writer_pid": writer.pid,
        "writer_scope": writer.scope[:128],
        "writer_since": now,
        "heartbeat_at": now,
    }


def fence(s: Session, run_id: int, writer: Writer | None, values: dict[str, Any] | None = None) -> None:
    """The first statement of every write to a run: an UPDATE of its row that matches only
    while ``writer`` holds it (None: while nobody does), refreshing the heartbeat. It takes
    the row's write lock, so a takeover cannot slip between the check and the write."""
    held = Run.writer_token.is_(None) if writer is None else Run.writer_token == writer.token
    if values is None:
        values = {"heartbeat_at": utcnow()} if writer is not None else {"writer_token": None}
    elif writer is not None and "writer_token" not in values:
        values = {**values, "heartbeat_at": utcnow()}
    if s.execute(update(Run).where(Run.id == run_id, held).values(**values)).rowcount == 1:
        return
    row = s.get(Run, run_id)
    if row is None:
        raise NotFoundError(f"no run {run_id} in this store")
    if writer is None:
        raise _busy(row)
    holder = f"now held by host {row.writer_host}, pid {row.writer_pid}" if row.writer_token else "released"
    raise LeaseLostError(
        f"run {run_id} is no longer held by this process (pid {writer.pid}): {holder}; nothing was written"
    )


def _busy(row: Run, stale_after: float = LEASE_STALE_S) -> RunBusyError:
    return RunBusyError(row.id, row.writer_host, row.writer_pid, row.writer_since, row.heartbeat_at, stale_after)


def claim(
    s: Session, run_id: int, writer: Writer, stale_after: float = LEASE_STALE_S, resumed_at: dt.datetime | None = None
) -> None:
    """Take ``run_id`` for ``writer`` and mark it "running" again (see
    :meth:`~a2a_tune.db.store.Store.claim_run`, which says what ``resumed_at`` records)."""
    now = utcnow()
    row = s.execute(
        select(Run.id, Run.status, Run.writer_token, Run.writer_pid, Run.writer_scope, Run.heartbeat_at).where(
            Run.id == run_id
        )
    ).first()
    if row is None:
        raise NotFoundError(f"no run {run_id} in this store")
    if row.status == "completed":
        raise StoreError(f"run {run_id} is completed: nothing to resume")
    if row.writer_token not in (None, writer.token):
        stale = row.heartbeat_at is None or (now - row.heartbeat_at).total_seconds() > stale_after
        dead = bool(row.writer_scope) and row.writer_scope == writer.scope and not _pid_alive(row.writer_pid)
        if not (stale or dead):
            raise _busy(s.get(Run, run_id), stale_after)
    # Compare and swap: the holder (and its heartbeat) seen above, else someone moved first.
    same = [
        Run.status == row.status,
        Run.writer_token.is_(None) if row.writer_token is None else Run.writer_token == row.writer_token,
        Run.heartbeat_at.is_(None) if row.heartbeat_at is None else Run.heartbeat_at == row.heartbeat_at,
    ]
    values: dict[str, Any] = {"status": "running", "finished_at": None, **lease_values(writer, now)}
    if row.writer_token == writer.token:
        del values["writer_since"]  # still the same writer since it first took the run
    if resumed_at is not None:
        values["resumed_at"] = resumed_at
    if s.execute(update(Run).where(Run.id == run_id, *same).values(**values)).rowcount != 1:
        raise _busy(s.get(Run, run_id), stale_after)
