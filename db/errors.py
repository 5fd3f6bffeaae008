"""Typed exceptions of the measurement store.

Every message is one line meant for a terminal: the CLI prints ``str(exc)`` and exits.
The driver exception that caused an error (sqlite3, psycopg, SQLAlchemy) is chained as
``__cause__`` for debugging, never pasted into the message.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be opened or used (bad URL, not a database, unknown schema...)."""


class StoreOutdatedError(StoreError):
    """The database schema is older than this a2a-tune; ``a2a-tune db upgrade`` fixes it.

    Attributes: ``url`` (password hidden), ``current`` (the database's revision, None when
    it is stamped at the base) and ``head`` (the revision this code expects).
    """

    def __init__(self, url: str, current: str | None, head: str) -> None:
        self.url = url
        self.current = current
        self.head = head
        at = f"revision {current}" if current else "the base revision (no schema)"
        super().__init__(
            f"database {url} is at schema {at}, this a2a-tune needs {head}; run: a2a-tune db upgrade --db {url}"
        )


class EmptyStoreError(StoreError):
    """A store opened read-only that does not exist yet or holds no a2a-tune data."""


class NotFoundError(StoreError):
    """A run id or hardware id that this database does not hold."""


class DuplicateMeasurementError(StoreError):
    """A measurement with the same key is already stored for the run.

    ``key`` is the full unique key: run_id, backend, num_experts, topk, hidden, dtype,
    ep_size, tokens_per_rank, routing, timing.
    """

    def __init__(self, key: tuple) -> None:
        self.key = key
        super().__init__(f"measurement already stored for run {key[0]}: {key[1:]}")


class RunBusyError(StoreError):
    """Another live process holds the run's lease (see ``Store.claim_run``).

    Attributes: ``run_id``, ``host``, ``pid``, ``since`` (when it took the run) and
    ``heartbeat`` (its last sign of life), as stored.
    """

    def __init__(self, run_id: int, host: str | None, pid: int | None, since, heartbeat, stale_after_s: float) -> None:
        self.run_id, self.host, self.pid, self.since, self.heartbeat = run_id, host, pid, since, heartbeat
        ago = ""
        if heartbeat is not None:
            import datetime as dt

            seconds = (dt.datetime.now(dt.timezone.utc) - heartbeat).total_seconds()
            ago = f", last heartbeat {max(seconds, 0):.0f} s ago"
        when = since.strftime("%Y-%m-%d %H:%M:%S UTC") if since is not None else "an unknown time"
        super().__init__(
            f"run {run_id} is being written by another process (host {host or '?'}, pid {pid or '?'}, "
            f"since {when}{ago}); wait for it to finish or stop it (a writer silent for "
            f"{stale_after_s:.0f} s is taken over)"
        )


class LeaseLostError(StoreError):
    """This process no longer holds the run: another took it over (this one was silent past
    the stale bound) or it was finished. Nothing was written."""


class ConnectionLostError(StoreError):
    """The database server of an open store stopped answering: the connection broke, or no
    new one could be made. What was committed before is kept."""


class StoreFileLostError(StoreError):
    """The SQLite file an open store writes to was deleted, or another file was put in its
    place: what this process writes would reach no file anyone can open, so nothing more is
    written. ``path`` is the file."""

    def __init__(self, message: str, path: str) -> None:
        self.path = path
        super().__init__(message)
