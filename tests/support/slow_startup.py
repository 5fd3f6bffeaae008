"""A slow start-up, as a heavy out-of-tree backend's import makes one: named in
A2A_TUNE_BACKEND_MODULES, it is imported by the sweep's process as it checks the plan (before
any rank starts) and by each rank, and each import takes STARTUP_S seconds. It registers no
backend."""

from __future__ import annotations

import time

STARTUP_S = 3.0

time.sleep(STARTUP_S)
