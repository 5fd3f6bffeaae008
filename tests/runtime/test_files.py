"""The one way the start-up path reads a file (runtime/files.py): a regular file under a cap,
opened without blocking; anything else is refused in one line without the path."""

from __future__ import annotations

import pytest
from hangs import bounded

from a2a_tune.tuner.runtime.files import FileRefused, read_capped


def test_read_capped_reads_regular_files_and_refuses_the_rest(tmp_path, fifo):
    f = tmp_path / "ok.txt"
    f.write_bytes(b"12345")
    assert read_capped(f, 5) == b"12345"
    f.write_bytes(b"123456")
    with pytest.raises(FileRefused, match=r"6 bytes, over the 5 bytes cap"):
        read_capped(f, 5)
    with pytest.raises(FileRefused, match=r"a FIFO"):
        bounded(lambda: read_capped(fifo, 100))
    with pytest.raises(FileRefused, match=r"a character device"):
        read_capped("/dev/zero", 100)
    with pytest.raises(FileRefused, match=r"a directory"):
        read_capped(tmp_path, 100)


def test_a_file_that_cannot_be_opened_is_an_os_error_not_a_refusal(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_capped(tmp_path / "missing", 10)
    (tmp_path / "link").symlink_to(tmp_path / "link")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        read_capped(tmp_path / "link", 10)


def test_a_refusal_is_one_line_without_the_path(tmp_path):
    f = tmp_path / "secret-name.txt"
    f.write_bytes(b"x" * (3 * 1024 * 1024))
    with pytest.raises(FileRefused) as info:
        read_capped(f, 1024 * 1024)
    assert str(info.value) == "3 MiB, over the 1 MiB cap: not read"
