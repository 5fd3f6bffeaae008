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
