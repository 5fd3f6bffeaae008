import os
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))
# Spawned ranks inherit the environment: they find the planted backends the same way.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        have_gpu = torch.cuda.is_available()
    except Exception:
        have_gpu = False
    if have_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):  # not `in item.keywords`: a checkout in a folder named gpu
            item.add_marker(skip)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, empty database: an SQLite file, then a new PostgreSQL database on the server
    named by $A2A_TUNE_TEST_POSTGRES_URL (that half is skipped when it is unset)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    from databases import POSTGRES_ENV, fresh_postgres_database, postgres_server

    server = postgres_server()
    if server is None:
        pytest.skip(f"no PostgreSQL server: set {POSTGRES_ENV} (CI starts one: .ci/postgres.sh)")
    with fresh_postgres_database(server) as url:
        yield url


@pytest.fixture(autouse=True)
def _isolated_user_profiles(tmp_path_factory, monkeypatch):
    """Tables a user measured on this machine must not leak into test lookups."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg")))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))  # the fingerprint cache
    monkeypatch.delenv("A2A_TUNE_PROFILE_DIR", raising=False)
    monkeypatch.delenv("A2A_TUNE_FINGERPRINT", raising=False)
    monkeypatch.delenv("A2A_TUNE_DB", raising=False)
    monkeypatch.delenv("A2A_TUNE_MAX_WORKSPACE_MIB", raising=False)  # a memory budget changes answers


@pytest.fixture
def fifo(tmp_path):
    """A named pipe where a table or a workload is expected: reading it would block forever."""
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path
