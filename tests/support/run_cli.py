"""`a2a-tune` as a subprocess, the way a user runs it (wide terminal so rich does not wrap)."""

from __future__ import annotations

import os
import subprocess
import sys


def a2a(*args: str, env_extra: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
