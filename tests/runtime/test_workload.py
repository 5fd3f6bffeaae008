"""Workload histograms (runtime/workload.py): the JSON and CSV forms, the rules and bounds a
workload must keep, one-line errors naming the file and the line, and the cache."""

from __future__ import annotations

import os
import time

import pytest
from hangs import bounded
from lookups import FIXTURES, FP, A, warnings_of

from a2a_tune.tuner.runtime import workload as wl
from a2a_tune.tuner.runtime.files import MAX_WORKLOAD_BYTES
from a2a_tune.tuner.runtime.lookup import FALLBACK_BACKEND, lookup
from a2a_tune.tuner.runtime.workload import (
    MAX_POINTS,
    WorkloadError,
    load_workload,
    parse_workload,
    parse_workload_text,
)

HALF = ((1, 0.5), (8, 0.5))


@pytest.fixture(autouse=True)
def _fresh():
    wl.clear_cache()
    yield
    wl.clear_cache()


@pytest.mark.parametrize(
    "text",
    [
        '{"1": 3, "8": 3}',
        "[[1, 3], [8, 3]]",
        "[[1.0, 1], [8, 1]]",  # an integral float is a count
        "tokens,weight\n1,3\n8,3\n",  # a header line
        "# steps of one hour\n1,0.25\n\n8;0.25  # semicolons too\n",
        "1\t2\n8\t2\n",  # tabs
        "1,1\n8,2\n1,1\n",  # a count listed twice adds up
    ],
)
def test_every_form_gives_the_same_normalised_workload(text):
    assert parse_workload_text(text) == HALF


def test_a_file_may_start_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "w.csv"
    path.write_bytes(b"\xef\xbb\xbftokens,weight\n1,1\n8,1\n")  # as spreadsheets write it
    assert load_workload(path) == HALF


def test_weights_are_ratios_and_zero_weights_drop_out():
    assert parse_workload({4: 0, 1: 2, 2: 6}) == ((1, 0.25), (2, 0.75))


@pytest.mark.parametrize(
    "data, problem",
    [
        ({-1: 1}, "tokens must be an integer >= 0, got -1"),
        ({"1.5": 1}, "tokens must be an integer >= 0, got 1.5"),
        ({True: 1}, "tokens must be an integer >= 0, got True"),
        ({1: -1}, "weight must be a finite number >= 0, got -1"),
        ({1: float("inf")}, "weight must be a finite number >= 0, got inf"),
        ({1: "lots"}, "weight must be a number >= 0, got 'lots'"),
        ({1: 0, 2: 0}, "every weight is 0"),
        ({}, "empty workload"),
        ([[1, 2, 3]], "[0]: expected a [tokens, weight] pair"),
        ("1,2", "expected an object {tokens: weight} or an array"),
        ({t: 1 for t in range(MAX_POINTS + 1)}, f"too many distinct token counts ({MAX_POINTS + 1} > {MAX_POINTS})"),
    ],
)
def test_what_is_no_workload_is_one_line(data, problem):
    with pytest.raises(WorkloadError) as info:
        parse_workload(data)
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_csv_errors_name_the_line():
    with pytest.raises(WorkloadError, match=r"^line 3: expected 2 columns \(tokens,weight\), got 3$"):
        parse_workload_text("tokens,weight\n1,1\n2,3,4\n")
    with pytest.raises(WorkloadError, match=r"^line 2: weight must be a number >= 0, got 'x'$"):
        parse_workload_text("1,1\n2,x\n")
    with pytest.raises(WorkloadError, match=r"^invalid JSON at line 1 column 2"):
        parse_workload_text("{oops")


def test_a_value_from_the_file_is_shown_safely():
    with pytest.raises(WorkloadError) as info:
        parse_workload({"8\n\x1b[2J": 1})
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text and "\\x1b[2J" in text


def test_a_file_error_names_the_file(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("1,1\n2,-1\n")
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert str(info.value) == f"{path}: line 2: weight must be a finite number >= 0, got -1.0"
    with pytest.raises(WorkloadError, match="cannot read: No such file or directory"):
        load_workload(tmp_path / "missing.csv")
    path.write_bytes(b"1,1\n\xff\xfe\n")
    with pytest.raises(WorkloadError, match="not UTF-8 text"):
        load_workload(path)


def test_a_file_over_the_cap_is_not_read(tmp_path):
    path = tmp_path / "huge.csv"
    with open(path, "wb") as f:
        f.truncate(MAX_WORKLOAD_BYTES + 1)
    with pytest.raises(WorkloadError, match="over the 4 MiB cap: not read"):
        load_workload(path)


def test_a_file_is_read_once_and_again_when_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "w.json"
    path.write_text('{"1": 1}')
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda f, *a, **k: opened.append(f) or real_open(f, *a, **k))
    assert load_workload(path) == ((1, 1.0),)
    assert load_workload(path) == ((1, 1.0),) and len(opened) == 1
    path.write_text('{"2": 1}')
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert load_workload(path) == ((2, 1.0),) and len(opened) == 2


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_workload_that_is_no_file_falls_back_at_once(kind, fifo, caplog):
    path = fifo if kind == "fifo" else "/dev/zero"
    c = bounded(lambda: lookup(profile=FIXTURES / f"{FP}.json", workload=path, **A))
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (warning,) = warnings_of(caplog)
    assert "not a regular file" in warning.getMessage()
