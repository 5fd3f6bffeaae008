"""Rows a hand edit, another tool or a half-restored backup damaged: the store's reads check what
they hand out, so a read-only view gets one line naming the run, the row and the field, never a
traceback. PostgreSQL types its columns and refuses most damage on write; SQLite holds whatever
was put there (``median_us = 'abc'``, ``samples = '{{{'``, ``started_at = 'notadate'``).

The rule (docs/reliability.md, "Damaged stores"):

- a measurement or failure row that cannot be read, or whose times are not positive finite
  numbers, is left out with one warning naming the run, the row and the field; the rest of the
  run is shown, selected and evaluated;
- a run row that cannot be read (its start time, config, versions) is a StoreError naming the
  run and the field: one line, exit 2 in the views;
- hardware facts that are not a JSON object are shown as none, with one warning.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy import select

from a2a_tune.tuner.runtime.point import POINT_FIELDS, Point, PointError, check_tokens
from a2a_tune.tuner.runtime.text import one_line

from .errors import StoreError

log = logging.getLogger("a2a_tune.db")

_READ_ERRORS = (ValueError, TypeError, OverflowError)  # a column's decoder on a damaged value
_TIMES = ("median_us", "p10_us", "p90_us")


class DamagedRowError(StoreError):
    """A row the store cannot hand out (one line naming the run, the table, the row, the field)."""


def read_rows(session: Any, model: Any, columns: list, *where: Any, run_id: int) -> list:
    """The rows of `columns` (of `model`'s table) matching `where`, in id order; rows that
    cannot be decoded are left out with one warning each (`where_damaged` names the field)."""
    query = select(*columns).where(*where).order_by(model.id)
    try:
        return session.execute(query).all()
    except _READ_ERRORS:
        pass
    rows = []
    for row_id in session.scalars(select(model.id).where(*where).order_by(model.id)):
        try:
            rows += session.execute(query.where(model.id == row_id)).all()
        except _READ_ERRORS as exc:
            warn(run_id, model.__tablename__, row_id, where_damaged(session, model, row_id), exc)
    return rows


def read_one(session: Any, model: Any, row_id: int, *, run_id: int) -> Any:
    """`session.get(model, row_id)`, or DamagedRowError naming the field that cannot be read."""
    try:
        return session.get(model, row_id)
    except _READ_ERRORS as exc:
        field = where_damaged(session, model, row_id)
        raise DamagedRowError(damaged(run_id, model.__tablename__, row_id, field, exc)) from None


def where_damaged(session: Any, model: Any, row_id: int) -> str:
    """The first column of row `row_id` whose value cannot be decoded ("?" if none alone fails)."""
    for column in model.__table__.columns:
        try:
            session.execute(select(column).where(model.id == row_id)).all()
        except _READ_ERRORS:
            return column.name
    return "?"


def damaged(run_id: int, table: str, row_id: int, field: str, problem: Any) -> str:
    """One line: where the damage is and what to do about it."""
    return (
        f"run {run_id}: {table} row {row_id}: {field}: {one_line(problem, 120)} "
        "(a damaged store: fix or delete that row)"
    )


def warn(run_id: int, table: str, row_id: int, field: str, problem: Any, done: str = "left out") -> None:
    log.warning("a2a-tune: %s; %s", damaged(run_id, table, row_id, field, problem), done)


def measurement_problem(values: Any) -> tuple[str, str]:
    """(field, problem) of a measurement's columns (a mapping) that no view or select can
    use, or ("", ""): the point's bounds (``runtime.point``: a row of another version or a
    hand edit), then the times."""
    point = Point(*(values[name] for name in POINT_FIELDS))
    problem = point.shape.problem()
    if problem is None:
        try:
            check_tokens(point.tokens_per_rank, "tokens_per_rank")
        except PointError as exc:
            problem = str(exc)
    if problem:
        return "point", problem
    for name in _TIMES:
        value = values[name]
        if not _number(value) or not (0 < value < math.inf):
            return name, f"{one_line(repr(value), 40)} is not a positive finite time"
    samples = values["samples"]
    if not isinstance(samples, list) or not all(_number(v) and math.isfinite(v) for v in samples):
        return "samples", "not a list of finite numbers"
    if values["knobs"] is not None and not isinstance(values["knobs"], dict):
        return "knobs", "not a JSON object"
    return "", ""


def run_problem(record: Any) -> tuple[str, str]:
    """(field, problem) of a run record a view cannot show, or ("", "")."""
    if not isinstance(record.config, dict):
        return "config", f"{one_line(repr(record.config), 40)} is not a JSON object"
    if not isinstance(record.versions, dict):
        return "versions", f"{one_line(repr(record.versions), 40)} is not a JSON object"
    if record.summary is not None and not isinstance(record.summary, dict):
        return "summary", "not a JSON object"
    return "", ""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
