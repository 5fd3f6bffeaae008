"""Run a command with one directory read-only, for tests of readers that must leave a store
as they found it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def run_in_read_only(directory: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """Run argv with `directory` read-only: by permissions (not root), else a read-only bind
    mount in a private mount namespace (root ignores permissions)."""
    env = {**os.environ, "COLUMNS": "200"}
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        finally:
            directory.chmod(0o755)
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare(1): cannot make a read-only directory")
    script = (
        'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && touch "$0/probe" 2>/dev/null && exit 99; exec "$@"'
    )
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, str(directory), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if r.returncode == 99 or "unshare:" in r.stderr or "mount:" in r.stderr:
        pytest.skip(f"cannot make a read-only mount here: {r.stderr.strip()[:200]}")
    return r
