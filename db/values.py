"""The values a store row may hold, checked before any SQL: one line per refusal (ValueError).

Numpy and torch scalars are converted; NaN, infinities and values JSON cannot carry are
refused (PostgreSQL would reject them); a token count per rank has the point's one bound.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from a2a_tune.tuner.runtime.point import check_tokens


def _json(name: str, value: Any) -> Any:
    """Refuse values that would not survive a JSON column on every backend (numpy
    scalars, NaN/inf: PostgreSQL rejects them) with a clear error, before any SQL."""
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} is not storable as JSON: {exc}") from None
    return value


def _finite(name: str, value: Any, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def _positive(name: str, value: Any) -> float:
    """A time: finite and > 0 (a 0 µs round trip is a broken timer, and every ratio divides by it)."""
    out = _finite(name, value)
    if not out > 0:
        raise ValueError(f"{name} must be more than 0 µs, got {out}")
    return out


def _int(name: str, value: Any, *, optional: bool = False, minimum: int = 0) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    out = int(value.__index__())
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def _tokens(value: Any, *, optional: bool = False) -> int | None:
    """A token count per rank: the point's one bound (1..2^20), numpy/torch ints converted."""
    if value is None and optional:
        return None
    return check_tokens(_int("tokens_per_rank", value), "tokens_per_rank")


def _str(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _moment(name: str, value: Any, *, optional: bool = False) -> dt.datetime | None:
    """A time with its zone (a naive one would be read as UTC, whatever clock it came from)."""
    if value is None and optional:
        return None
    if not isinstance(value, dt.datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be a datetime with a time zone, got {value!r}")
    return value


def _figure(name: str, value: Any, *, integer: bool, many: bool) -> Any:
    """A figure's checked column value (``runtime.measurement.Figure``; None: not measured)."""
    if value is None:
        return None
    if many:
        return [_figure(f"{name}[]", v, integer=integer, many=False) for v in value]
    return _int(name, value) if integer else _finite(name, value)
