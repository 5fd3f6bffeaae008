#!/usr/bin/env python3
"""Measurements per run in an a2a-tune SQLite database, and any case measured twice in a run
(a resumed sweep must repeat nothing). Usage: python scripts/db_counts.py path/to/a2a_tune.db"""

import sqlite3
import sys

con = sqlite3.connect(sys.argv[1])
for run_id, status, n in con.execute(
    "SELECT r.id, r.status, COUNT(m.id) FROM runs r LEFT JOIN measurements m ON m.run_id = r.id GROUP BY r.id"
):
    dup = con.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM measurements WHERE run_id = ? GROUP BY backend, num_experts, topk, hidden,"
        " dtype, ep_size, tokens_per_rank, routing HAVING COUNT(*) > 1)",
        (run_id,),
    ).fetchone()[0]
    print(f"run {run_id}: status {status}, {n} measurements, {dup} cases measured twice")
