"""One database for several machines: two sweeps write into it at the same time, and the
operator's commands read it. On an SQLite file and on PostgreSQL (when
$A2A_TUNE_TEST_POSTGRES_URL names a server; see tests/support/databases.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cluster_job import nodes, recording
from databases import POSTGRES_ENV, fresh_postgres_database, postgres_server
from sqlalchemy.engine import make_url

from a2a_tune.db import open_store, resolve_url

MACHINES = {"box-a": ("h200_nv18x2.json", "h200.nvl18x2.node1"), "box-b": ("l40s_pcie4.json", "l40s.pciex4.node1")}
PLANNED = 2 * 2  # token counts x backends, per machine


def a2a(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", *args],
        env=node.env(),
        cwd=node.root,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared(request, tmp_path_factory):
    """Two machines' `a2a-tune run`, started together, storing into one new database."""
    tmp = tmp_path_factory.mktemp("shared")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'shared.db'}"
        context = None
    else:
        server = postgres_server()
        if server is None:
            pytest.skip(f"no PostgreSQL server: set {POSTGRES_ENV}")
        context = fresh_postgres_database(server)
        url = context.__enter__()
    machines = nodes(tmp, [recording(tmp, fixture, host) for host, (fixture, _) in MACHINES.items()])
    args = ["run", "--device", "cpu", "--world", "2", "--preset", "mixtral-8x7b", "--tokens", "1,4"]
    args += ["--warmup", "1", "--iters", "3", "--no-progress", "--db", url]
    args += ["--backend", "allgather_reducescatter", "--backend", "nccl_all2allv"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "a2a_tune.tuner.cli", *args],
            env=m.env(),
            cwd=m.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in machines
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    yield url, machines, [(p.returncode, *o) for p, o in zip(procs, outputs)]
    if context is not None:
        context.__exit__(None, None, None)


def test_two_machines_sweep_into_one_database_at_once(shared):
    url, machines, results = shared
    assert [rc for rc, _, _ in results] == [0, 0], results
    with open_store(url) as store:
        runs = sorted(store.runs(), key=lambda r: r.fingerprint)
        assert [r.fingerprint for r in runs] == sorted(fp for _, fp in MACHINES.values())
        for run in runs:
            keys = [m.key for m in store.measurements(run.id)]
            assert run.status == "completed" and len(keys) == len(set(keys)) == PLANNED  # none lost, none twice
            assert {k.ep_size for k in keys} == {2}
    for machine, (_, fingerprint) in zip(machines, MACHINES.values()):
        assert (machine.profiles / f"{fingerprint}.json").exists()  # each machine got its own table


def test_the_operators_commands_read_the_shared_database(shared, tmp_path):
    url, machines, results = shared
    if url.startswith("sqlite"):
        pytest.skip("SQLite stores: tests/test_views.py and tests/test_cli.py")
    assert [rc for rc, _, _ in results] == [0, 0]
    with open_store(url) as store:
        run_ids = sorted(r.id for r in store.runs())
    password = make_url(resolve_url(url)).password
    shown = a2a(machines[0], "show", "--db", url, "--run", str(run_ids[0]), "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["fingerprint"] in {fp for _, fp in MACHINES.values()}
    diff = a2a(machines[0], "diff", "--db", url, "--run", str(run_ids[0]), "--run", str(run_ids[1]))
    assert diff.returncode in (0, 1), diff.stderr  # 2 would be bad input
    report = a2a(machines[0], "report", "--db", url, "--run", str(run_ids[1]), "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert "<html" in (tmp_path / "r.html").read_text().lower()
    selected = a2a(machines[0], "select", "--db", url, "--run", str(run_ids[1]), "--out", str(tmp_path / "tables"))
    assert selected.returncode == 0, selected.stderr
    assert len(list((tmp_path / "tables").glob("*.json"))) == 1
    for r in (shown, diff, report, selected):
        assert not password or password not in r.stdout + r.stderr
