"""The measurement store: read and write hardware, runs, measurements, failures and tuned knobs.

:func:`open_store` opens one by URL (``engine.py``: URLs, engines, read-only opening, the
schema's migrations); a run's one writer and its heartbeat are ``lease.py``. Guarantees:

- **Every write commits before it returns**: a sweep killed at any point keeps every
  measurement and failure whose ``add_*`` call returned.
- **Plain values out**: writes return integer ids, reads frozen dataclasses detached from any
  session (a measurement comes back as the one written); unknown ids raise
  :class:`NotFoundError`; "nothing yet" answers are ``None`` or an empty list.
- **Errors are one line** (:class:`StoreError`, the original chained); a server that went
  away is :class:`ConnectionLostError`.
- **Nothing written to no file**: an SQLite store checks before and after each transaction
  that its path still names the file it opened; once not, every call raises
  :class:`StoreFileLostError`.
- **Threads, not fork**: each call uses its own short session, so threads may share a Store;
  open it in the process that writes (rank 0).
- **One writer per run**: every write to a run is fenced by its lease (``lease.py``); a
  process that lost the run writes nothing (:class:`LeaseLostError`).
- **No duplicate**: ``add_measurement`` of a key the run holds raises
  :class:`DuplicateMeasurementError`, nothing overwritten (the sweep consults ``done_keys``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from a2a_tune.tuner.runtime.measurement import FIGURES, MEASUREMENT_COLUMNS, Measurement, MeasurementKey
from a2a_tune.tuner.runtime.text import one_line

from .damage import DamagedRowError, damaged, measurement_problem, read_one, read_rows, run_problem, warn, where_damaged
from .engine import _one_line, _sqlite_file, connection_lost, display_url, open_engine, resolve_url
from .errors import ConnectionLostError, DuplicateMeasurementError, NotFoundError, StoreError, StoreFileLostError
from .knobs import KnobRows
from .lease import LEASE_STALE_S, Writer, claim, fence, lease_values
from .models import (
    DEVICE_TYPES,
    FAILURE_KINDS,
    KEY_FIELDS,
    RUN_STATUSES,
    Failure,
    Hardware,
    Run,
    utcnow,
)
from .models import Measurement as MeasurementRow
from .values import _figure, _finite, _int, _json, _moment, _positive, _str, _tokens

MAX_REASON_CHARS = 2000
# The timing label of samples taken on virtual ranks (a2a_tune.kernels.virtual.VIRTUAL_TIMING).
VIRTUAL_TIMING = "virtual"


def open_store(url: str | None = None, *, readonly: bool = False) -> Store:
    """Open (creating if new or empty) the store at ``url`` (see :func:`resolve_url`).

    ``readonly``: for readers (show, select, report, diff): nothing is created, migrated or
    written, and a database in a read-only directory or on a read-only mount can be read.
    Raises :class:`StoreOutdatedError` for an older schema, :class:`StoreError` for a
    newer/unknown one, for a file that is not a database, or any failure to connect.
    """
    url = resolve_url(url)
    return Store(open_engine(url, readonly=readonly), url)


# --------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class HardwareRecord:
    id: int
    fingerprint: str
    facts_hash: str
    facts: dict[str, Any]
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class RunRecord:
    id: int
    hardware_id: int
    fingerprint: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    status: str
    device_type: str
    world_size: int
    versions: dict[str, Any]
    git_sha: str | None
    config: dict[str, Any]
    config_hash: str
    summary: dict[str, Any] | None
    # The writer holding the run (None while nobody does) and its last heartbeat.
    writer_host: str | None = None
    writer_pid: int | None = None
    writer_since: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None
    # When the run's command began and when the latest --resume did (None: not recorded; see Run).
    launched_at: dt.datetime | None = None
    resumed_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    id: int
    run_id: int
    backend: str
    kind: str
    reason: str
    num_experts: int | None
    topk: int | None
    hidden: int | None
    dtype: str | None
    ep_size: int | None
    tokens_per_rank: int | None
    routing: str | None
    created_at: dt.datetime

    @property
    def has_shape(self) -> bool:
        """True when every shape column is set (the failure is about one point)."""
        return all(getattr(self, f) is not None for f in KEY_FIELDS[1:])

    @property
    def key(self) -> MeasurementKey | None:
        if not self.has_shape:
            return None
        return MeasurementKey(*(getattr(self, f) for f in KEY_FIELDS))


def _record(cls: type, row: Any, **extra: Any) -> Any:
    names = [f.name for f in dataclasses.fields(cls) if f.name not in extra]
    return cls(**{n: getattr(row, n) for n in names}, **extra)


def _run_record(run: Run, fingerprint: str) -> RunRecord:
    record = _record(RunRecord, run, fingerprint=fingerprint)
    if run.writer_token is None:  # finished or never held: no current writer to show
        record = dataclasses.replace(record, writer_host=None, writer_pid=None, writer_since=None)
    return record


def _file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# --------------------------------------------------------------------------- validation


def _columns(m: Measurement) -> dict[str, Any]:
    """The checked columns of measurement ``m`` (numpy/torch scalars converted)."""
    c = m.columns()
    checked = {
        "backend": _str("backend", c["backend"]),
        "num_experts": _int("num_experts", c["num_experts"], minimum=1),
        "topk": _int("topk", c["topk"], minimum=1),
        "hidden": _int("hidden", c["hidden"], minimum=1),
        "dtype": _str("dtype", c["dtype"]),
        "ep_size": _int("ep_size", c["ep_size"], minimum=1),
        "tokens_per_rank": _tokens(c["tokens_per_rank"]),
        "routing": _str("routing", c["routing"]),
        "timing": _str("timing", c["timing"]),
        "median_us": _positive("median_us", c["median_us"]),
        "p10_us": _positive("p10_us", c["p10_us"]),
        "p90_us": _positive("p90_us", c["p90_us"]),
        "ci_low_us": _finite("ci_low_us", c["ci_low_us"], optional=True),
        "ci_high_us": _finite("ci_high_us", c["ci_high_us"], optional=True),
        "n": _int("n", c["n"]),
        "host_median_us": _finite("host_median_us", c["host_median_us"], optional=True),
        "samples": [_finite("samples[]", v) for v in c["samples"]],
        "knobs": _json("knobs", c["knobs"]),
    }
    for f in FIGURES:
        checked[f.column] = _figure(f.column, c[f.column], integer=f.integer, many=f.many)
    return checked


def _one_line_reason(reason: str) -> str:
    return one_line(reason, MAX_REASON_CHARS) or "(no reason given)"


# --------------------------------------------------------------------------- store


class Store(KnobRows):
    """Reads and writes runs, measurements and failures (and tuned knobs: ``knobs.py``). Obtain one with :func:`open_store`;
    see the module docstring for the guarantees. Usable as a context manager."""

    def __init__(self, engine: Engine, url: str) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._closed = False
        self.url = url
        path = _sqlite_file(url)
        # The SQLite file this store opened, by identity: one deleted or replaced under it
        # would take every later write with it, unseen (the connection keeps the old inode).
        self._file = None if path is None else (os.path.abspath(path), _file_identity(path))

    # -- lifecycle

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    def close(self) -> None:
        """Release connections (SQLite: checkpoints the WAL). Idempotent."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r}{', closed' if self._closed else ''})"

    @contextmanager
    def _session(self, what: str, *, conflicts: bool = False) -> Iterator[Session]:
        """One transaction, committed on success. ``conflicts=True`` lets IntegrityError
        through for the caller to interpret."""
        if self._closed:
            raise StoreError(f"store {self.display_url} is closed")
        self._check_file(what)  # a new connection would open whatever file is there now
        try:
            with self._sessions.begin() as session:
                yield session
        except IntegrityError as exc:
            if conflicts:
                raise
            raise StoreError(f"{what} on {self.display_url} failed: {_one_line(exc)}") from exc
        except SQLAlchemyError as exc:
            if connection_lost(exc):
                raise ConnectionLostError(
                    f"{what} on {self.display_url} failed: lost the connection to the database server "
                    f"({_one_line(exc)})"
                ) from exc
            raise StoreError(f"{what} on {self.display_url} failed: {_one_line(exc)}") from exc
        self._check_file(what)  # committed, but to the file this store opened?

    def _check_file(self, what: str) -> None:
        """Raise :class:`StoreFileLostError` once the store's SQLite file is not the file it
        opened any more (deleted, moved away, or another put in its place)."""
        if self._file is None:
            return
        path, opened = self._file
        now = _file_identity(path)
        if now == opened:
            return
        how = "it was deleted or moved away" if now is None else "another file was put in its place"
        raise StoreFileLostError(
            f"{what} on {self.display_url} stopped: {path} is no longer the file this process opened ({how}); "
            "nothing more is written to it",
            path,
        )

    @staticmethod
    def _run_or_raise(session: Session, run_id: int) -> Run:
        run = read_one(session, Run, run_id, run_id=run_id)
        if run is None:
            raise NotFoundError(f"no run {run_id} in this store")
        return run

    @staticmethod
    def _run_exists(session: Session, run_id: int) -> None:
        """NotFoundError unless run `run_id` exists (its row is not decoded: reading its
        measurements needs none of it)."""
        if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
            raise NotFoundError(f"no run {run_id} in this store")

    @staticmethod
    def _run_records(session: Session, query: Any) -> list[RunRecord]:
        """The runs `query` selects as records; DamagedRowError (one line naming the run and
        the field) for a run row a view cannot show (db.damage)."""
        try:
            rows = session.execute(query).all()
        except (ValueError, TypeError, OverflowError) as exc:
            for run_id in session.scalars(select(Run.id).order_by(Run.id)):
                field = where_damaged(session, Run, run_id)
                if field != "?":
                    raise DamagedRowError(damaged(run_id, "runs", run_id, field, exc)) from None
            raise StoreError(f"reading runs failed: {_one_line(exc)}") from None
        records = [_run_record(run, fp) for run, fp in rows]
        for r in records:
            field, problem = run_problem(r)
            if field:
                raise DamagedRowError(damaged(r.id, "runs", r.id, field, problem))
        return records

    @staticmethod
    def _hardware_record(row: Hardware, run_id: int | None = None) -> HardwareRecord:
        record = _record(HardwareRecord, row)
        if not isinstance(record.facts, dict):  # shown as none: the fingerprint still says which machine
            warn(run_id or 0, "hardware", row.id, "facts", "not a JSON object", "shown as none")
            record = dataclasses.replace(record, facts={})
        return record

    # -- hardware

    def get_or_create_hardware(self, fingerprint: str, facts_hash: str, facts: dict[str, Any]) -> int:
        """The id of the hardware row for (fingerprint, facts_hash), inserted if new.
        ``facts`` is stored only on insert (the hash identifies it)."""
        _str("fingerprint", fingerprint)
        _str("facts_hash", facts_hash)
        _json("facts", facts)
        query = select(Hardware.id).where(Hardware.fingerprint == fingerprint, Hardware.facts_hash == facts_hash)
        try:
            with self._session("recording hardware", conflicts=True) as s:
                found = s.scalar(query)
                if found is not None:
                    return found
                row = Hardware(fingerprint=fingerprint, facts_hash=facts_hash, facts=facts)
                s.add(row)
                s.flush()
                return row.id
        except IntegrityError as exc:
            # Another process inserted the same hardware between our read and write.
            with self._session("recording hardware") as s:
                found = s.scalar(query)
            if found is None:
                raise StoreError(f"recording hardware failed: {_one_line(exc)}") from exc
            return found

    def get_hardware(self, hardware_id: int) -> HardwareRecord:
        with self._session("reading hardware") as s:
            row = read_one(s, Hardware, hardware_id, run_id=0)
            if row is None:
                raise NotFoundError(f"no hardware {hardware_id} in this store")
            return self._hardware_record(row)

    def hardware_for_run(self, run_id: int) -> HardwareRecord:
        with self._session("reading hardware") as s:
            self._run_exists(s, run_id)
            hardware_id = s.scalar(select(Run.hardware_id).where(Run.id == run_id))
            return self._hardware_record(read_one(s, Hardware, hardware_id, run_id=run_id), run_id)

    # -- runs

    def start_run(
        self,
        hardware_id: int,
        *,
        device_type: str,
        world_size: int,
        versions: dict[str, Any],
        git_sha: str | None,
        config: dict[str, Any],
        config_hash: str,
        writer: Writer | None = None,
        launched_at: dt.datetime | None = None,
    ) -> int:
        """Insert a run with status "running", held by ``writer`` when given; returns its id.
        ``launched_at``: when the command that started the run's ranks began (their start-up
        is part of the run: ``show`` counts its duration from there); None: not known."""
        if device_type not in DEVICE_TYPES:
            raise ValueError(f"device_type must be one of {DEVICE_TYPES}, got {device_type!r}")
        world_size = _int("world_size", world_size, minimum=1)
        _json("versions", versions)
        _json("config", config)
        _str("config_hash", config_hash)
        _str("git_sha", git_sha, optional=True)
        _moment("launched_at", launched_at, optional=True)
        with self._session("starting a run") as s:
            if s.get(Hardware, hardware_id) is None:
                raise NotFoundError(f"no hardware {hardware_id} in this store")
            run = Run(
                hardware_id=hardware_id,
                status="running",
                device_type=device_type,
                world_size=world_size,
                versions=versions,
                git_sha=git_sha,
                config=config,
                config_hash=config_hash,
                launched_at=launched_at,
                **(lease_values(writer, utcnow()) if writer is not None else {}),
            )
            s.add(run)
            s.flush()
            return run.id

    def finish_run(
        self, run_id: int, status: str, summary: dict[str, Any] | None = None, *, writer: Writer | None = None
    ) -> None:
        """Set the final status ("completed", "interrupted" or "failed") and finished_at, and
        release the run; ``summary`` replaces the stored one when given. Only ``writer``, the
        run's holder, may (without a writer: only while nobody holds the run)."""
        if status not in RUN_STATUSES or status == "running":
            raise ValueError(f"finish status must be completed, interrupted or failed, got {status!r}")
        if summary is not None:
            _json("summary", summary)
        values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "writer_token": None}
        if summary is not None:
            values["summary"] = summary
        with self._session("finishing a run") as s:
            fence(s, run_id, writer, values)

    # -- the run's one writer

    def claim_run(
        self,
        run_id: int,
        writer: Writer,
        *,
        stale_after: float = LEASE_STALE_S,
        resumed_at: dt.datetime | None = None,
    ) -> None:
        """Take ``run_id`` for ``writer`` and mark it "running" again (``--resume``).

        Succeeds when nobody holds the run, ``writer`` already does (restarted ranks), the
        holder's last heartbeat is older than ``stale_after`` seconds, or the holder's pid is
        dead on this host. Otherwise raises :class:`RunBusyError` naming the holder (host,
        pid, since). A completed run is not resumed (:class:`StoreError`).

        ``resumed_at``: when the ``--resume`` command taking the run over began, recorded as
        the run's ``resumed_at`` (the latest resume's). The run keeps its ``launched_at``, the
        first command's start: the pause between the two belongs to neither, so ``show``
        counts a resumed run's duration from its latest resume. None (ranks restarted by the
        same command, a lost case recorded) leaves it as it is."""
        _moment("resumed_at", resumed_at, optional=True)
        with self._session("claiming a run") as s:
            claim(s, run_id, writer, stale_after, resumed_at)

    def heartbeat(self, run_id: int, writer: Writer) -> None:
        """Say ``writer`` is alive and still writing ``run_id``; raises :class:`LeaseLostError`
        when it no longer holds it."""
        with self._session("refreshing a run's heartbeat") as s:
            fence(s, run_id, writer)

    def find_resumable_run(self, hardware_id: int, config_hash: str) -> int | None:
        """The latest run on this hardware with this config hash, if it is not completed
        (running, interrupted or failed); None when there is none or the latest one
        completed (a newer completed run supersedes older unfinished ones). A "running"
        run may be a live sweep: the caller decides whether to take it over."""
        with self._session("finding a run to resume") as s:
            row = s.execute(
                select(Run.id, Run.status)
                .where(Run.hardware_id == hardware_id, Run.config_hash == config_hash)
                .order_by(Run.started_at.desc(), Run.id.desc())
                .limit(1)
            ).first()
        if row is None or row.status == "completed":
            return None
        return row.id

    def _run_query(self):  # noqa: ANN202 - internal
        return (
            select(Run, Hardware.fingerprint)
            .join(Hardware, Run.hardware_id == Hardware.id)
            .order_by(Run.started_at.desc(), Run.id.desc())
        )

    def get_run(self, run_id: int) -> RunRecord:
        with self._session("reading a run") as s:
            self._run_exists(s, run_id)
            return self._run_records(s, self._run_query().where(Run.id == run_id))[0]

    def runs(self, fingerprint: str | None = None) -> list[RunRecord]:
        """All runs, newest first; only those on ``fingerprint`` when given."""
        query = self._run_query()
        if fingerprint is not None:
            query = query.where(Hardware.fingerprint == fingerprint)
        with self._session("listing runs") as s:
            return self._run_records(s, query)

    def latest_run(self, fingerprint: str | None = None, status: str | None = "completed") -> RunRecord | None:
        """The newest run (on ``fingerprint`` if given) with ``status`` (any if None)."""
        query = self._run_query().limit(1)
        if fingerprint is not None:
            query = query.where(Hardware.fingerprint == fingerprint)
        if status is not None:
            query = query.where(Run.status == status)
        with self._session("reading runs") as s:
            found = self._run_records(s, query)
            return found[0] if found else None

    # -- measurements and failures

    def add_measurement(self, run_id: int, m: Measurement, *, writer: Writer | None = None) -> int:
        """Store the timed case ``m``, committed before returning; returns its id.

        Its numbers may be numpy/torch scalars (converted); a figure it does not carry is NULL
        (not measured). Raises ValueError naming the field for a value no column takes,
        :class:`DuplicateMeasurementError` when (run, key, timing) is already stored, and
        :class:`LeaseLostError` / :class:`RunBusyError` when ``writer`` does not hold the run
        (see :meth:`finish_run`). Virtual-rank timings (``timing`` "virtual...": one device standing
        for every rank, ``a2a_tune.kernels.virtual``) are refused: they are no machine's figures.
        """
        if str(m.timing).startswith(VIRTUAL_TIMING):
            raise StoreError(
                f"{m.backend}: virtual-rank timings move bytes through one device's memory, not the link: "
                "never stored as a machine's measurements"
            )
        row = MeasurementRow(run_id=run_id, **_columns(m))
        key = (run_id, *(getattr(row, f) for f in KEY_FIELDS), row.timing)
        try:
            with self._session("adding a measurement", conflicts=True) as s:
                fence(s, run_id, writer)
                s.add(row)
                s.flush()
                return row.id
        except IntegrityError as exc:
            with self._session("adding a measurement") as s:
                clash = s.scalar(
                    select(MeasurementRow.id).where(
                        MeasurementRow.run_id == run_id,
                        MeasurementRow.timing == row.timing,
                        *(getattr(MeasurementRow, f) == getattr(row, f) for f in KEY_FIELDS),
                    )
                )
            if clash is not None:
                raise DuplicateMeasurementError(key) from exc
            raise StoreError(f"adding a measurement failed: {_one_line(exc)}") from exc

    def add_failure(
        self,
        run_id: int,
        *,
        backend: str,
        kind: str,
        reason: str,
        num_experts: int | None = None,
        topk: int | None = None,
        hidden: int | None = None,
        dtype: str | None = None,
        ep_size: int | None = None,
        tokens_per_rank: int | None = None,
        routing: str | None = None,
        writer: Writer | None = None,
    ) -> int:
        """Record why ``backend`` was not timed, committed before returning; returns its id.

        Leave the shape out for a failure that is not about one point ("unavailable").
        A multi-line ``reason`` is joined into one line (and capped at MAX_REASON_CHARS).
        """
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind must be one of {FAILURE_KINDS}, got {kind!r}")
        row = Failure(
            run_id=run_id,
            backend=_str("backend", backend),
            kind=kind,
            reason=_one_line_reason(reason),
            num_experts=_int("num_experts", num_experts, optional=True, minimum=1),
            topk=_int("topk", topk, optional=True, minimum=1),
            hidden=_int("hidden", hidden, optional=True, minimum=1),
            dtype=_str("dtype", dtype, optional=True),
            ep_size=_int("ep_size", ep_size, optional=True, minimum=1),
            tokens_per_rank=_tokens(tokens_per_rank, optional=True),
            routing=_str("routing", routing, optional=True),
        )
        with self._session("adding a failure") as s:
            fence(s, run_id, writer)
            s.add(row)
            s.flush()
            return row.id

    def done_keys(self, run_id: int) -> set[MeasurementKey]:
        """Keys a resumed sweep can skip: those of the run's measurements (any timing) and
        of its failures that carry a full shape. Shapeless failures ("unavailable") are
        not points, so they add nothing."""
        m_cols = [getattr(MeasurementRow, f) for f in KEY_FIELDS]
        f_cols = [getattr(Failure, f) for f in KEY_FIELDS]
        with self._session("reading done keys") as s:
            self._run_or_raise(s, run_id)
            keys = {MeasurementKey(*r) for r in s.execute(select(*m_cols).where(MeasurementRow.run_id == run_id))}
            shaped = [getattr(Failure, f).is_not(None) for f in KEY_FIELDS[1:]]
            keys.update(MeasurementKey(*r) for r in s.execute(select(*f_cols).where(Failure.run_id == run_id, *shaped)))
        return keys

    def measurements(self, run_id: int) -> list[Measurement]:
        """The run's measurements in insertion order, each read back as the one it was written;
        a damaged row is left out with a warning naming it (db.damage)."""
        columns = [MeasurementRow.id] + [getattr(MeasurementRow, c) for c in MEASUREMENT_COLUMNS]
        kept = []
        with self._session("reading measurements") as s:
            self._run_exists(s, run_id)
            for row in read_rows(s, MeasurementRow, columns, MeasurementRow.run_id == run_id, run_id=run_id):
                values = dict(row._mapping)
                row_id = values.pop("id")
                field, problem = measurement_problem(values)
                if not field:
                    try:
                        kept.append(Measurement.from_columns(values))
                        continue
                    except (ValueError, TypeError) as exc:
                        field, problem = "?", exc
                warn(run_id, "measurements", row_id, field, problem)
        return kept

    def case_times(self, run_id: int) -> list[tuple[int, int, int, int, str, dt.datetime]]:
        """(tokens_per_rank, hidden, topk, ep_size, dtype, created_at) of the run's measurements
        in the order they were stored: what each case cost (the plan's estimate, tuner.cost)."""
        row = MeasurementRow
        columns = [row.tokens_per_rank, row.hidden, row.topk, row.ep_size, row.dtype, row.created_at]
        with self._session("reading measurement times") as s:
            self._run_exists(s, run_id)
            found = s.execute(select(*columns).where(row.run_id == run_id).order_by(row.id)).all()
            return [tuple(r) for r in found]

    def failures(self, run_id: int) -> list[FailureRecord]:
        """The run's failures in insertion order."""
        with self._session("reading failures") as s:
            self._run_exists(s, run_id)
            rows = read_rows(s, Failure, [Failure], Failure.run_id == run_id, run_id=run_id)
            return [_record(FailureRecord, r[0]) for r in rows]
