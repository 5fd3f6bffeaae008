"""The views read a table the one way the lookup reads it (issue 31.3): a FIFO or a device is
refused at once, the size is capped, and what the lookup refuses no view accepts."""

from __future__ import annotations

import os
import time

import pytest
from bad_tables import FIXTURE
from run_cli import a2a

from a2a_tune.tuner.runtime.files import MAX_TABLE_BYTES
from a2a_tune.tuner.views.load import load_profile_view, load_source
from a2a_tune.tuner.views.model import ViewError


@pytest.fixture
def oversized(tmp_path):
    """A table over the lookup's cap (sparse: no disk used)."""
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_TABLE_BYTES + 1)
    return path


def test_a_fifo_a_device_and_an_oversized_table_are_refused_at_once(fifo, oversized):
    start = time.monotonic()
    for path, problem in (
        (fifo, "not a regular file (a FIFO (named pipe))"),
        ("/dev/zero", "not a regular file (a character device)"),
        (oversized, "over the 16 MiB cap"),
    ):
        with pytest.raises(ViewError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            load_profile_view(path)
        with pytest.raises(ViewError, match="not a regular file|over the"):
            load_source(str(path))  # a positional file of diff/plot/report
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("command", ["show", "plot", "report"])
def test_views_on_a_fifo_exit_2_in_one_line(fifo, tmp_path, command):
    r = a2a(command, "--profile", str(fifo), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "a FIFO" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_diff_of_a_fifo_and_of_dev_zero_exit_2(fifo):
    for other in (str(fifo), "/dev/zero"):
        r = a2a("diff", str(FIXTURE), other)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "not a regular file" in r.stderr and "Traceback" not in r.stderr


def test_a_database_that_is_a_fifo_is_refused(fifo):
    r = a2a("show", "--db", str(fifo))
    assert r.returncode == 2 and "a FIFO" in r.stderr, r.stderr
    assert os.path.exists(fifo)


def test_a_db_path_component_over_255_bytes_is_one_line(tmp_path):
    r = a2a("show", "--db", str(tmp_path / ("x" * 300) / "a.db"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "File name too long" in r.stderr
