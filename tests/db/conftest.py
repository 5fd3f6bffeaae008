"""Fixtures of the store tests: an SQLite file's path, and an open store on `db_url` (SQLite,
then PostgreSQL when $A2A_TUNE_TEST_POSTGRES_URL names a server: tests/conftest.py)."""

from __future__ import annotations

import pytest

from a2a_tune.db import open_store


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "store.db"


@pytest.fixture
def store(db_url):
    with open_store(db_url) as s:
        yield s
