import logging

import pytest
from lookups import FIXTURES

from a2a_tune.tuner.runtime.profiles import clear_cache


@pytest.fixture(autouse=True)
def _fresh_runtime(caplog):
    """Every runtime test starts with nothing loaded, probed or warned, and sees the warnings."""
    clear_cache()
    caplog.set_level(logging.WARNING, logger="a2a_tune")
    yield
    clear_cache()


@pytest.fixture
def fixture_dir(monkeypatch):
    """The fixture table's directory as $A2A_TUNE_PROFILE_DIR."""
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(FIXTURES))
    return FIXTURES
