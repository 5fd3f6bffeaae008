"""The Store (a2a_tune.db.store): records in and out, durability, resume, threads, the file it
opened, a lost server, and one database shared by several machines. Tests taking `db_url`
(or `store`) run on an SQLite file and on a fresh PostgreSQL database (when
$A2A_TUNE_TEST_POSTGRES_URL names a server, see tests/support/databases.py)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from cluster_job import nodes, recording
from databases import POSTGRES_ENV, fresh_postgres_database, postgres_server
from sqlalchemy.engine import make_url
from stored import SHAPE, VERSIONS, assert_one_clean_line, measurement, new_run, sqlite_url, start_run

from a2a_tune.db import (
    ConnectionLostError,
    DuplicateMeasurementError,
    LeaseHeartbeat,
    MeasurementKey,
    NotFoundError,
    StoreError,
    StoreFileLostError,
    Writer,
    open_store,
    resolve_url,
)
from a2a_tune.db.models import FIGURE_FIELDS
from a2a_tune.tuner.runtime.point import MAX_TOKENS_PER_RANK, Point

# ----------------------------------------------------------------------------- round trip


def test_round_trip_of_hardware_run_measurement_failure(db_url):
    facts = {"gpus": [{"name": "NVIDIA H200", "nvlinks": 18}], "nodes": 1}
    with open_store(db_url) as s:
        hw = s.get_or_create_hardware("h200-sxm.nvl18x1.node1", "abc123", facts)
        assert s.get_or_create_hardware("h200-sxm.nvl18x1.node1", "abc123", {"ignored": True}) == hw
        other_hw = s.get_or_create_hardware("h200-sxm.nvl18x1.node1", "def456", facts)
        assert other_hw != hw
        run = s.start_run(
            hw,
            device_type="cuda",
            world_size=2,
            versions=VERSIONS,
            git_sha=None,
            config={"tokens": [1, 2, 4], "routings": ["uniform", "skewed"]},
            config_hash="cfg-a",
        )
        m_id = s.add_measurement(run, measurement())
        f_id = s.add_failure(run, backend="nvlink_one_sided", kind="incorrect", reason="max abs err 0.5", **SHAPE)
        s.finish_run(run, "completed", summary={"points": 1})

    # Everything above is read back by a fresh store: nothing lived only in memory.
    with open_store(db_url) as s:
        h = s.get_hardware(hw)
        assert (h.fingerprint, h.facts_hash, h.facts) == ("h200-sxm.nvl18x1.node1", "abc123", facts)
        assert s.hardware_for_run(run) == h

        r = s.get_run(run)
        assert (r.status, r.device_type, r.world_size, r.git_sha) == ("completed", "cuda", 2, None)
        assert r.versions == VERSIONS and r.config["routings"] == ["uniform", "skewed"]
        assert (r.config_hash, r.summary, r.fingerprint, r.hardware_id) == ("cfg-a", {"points": 1}, h.fingerprint, hw)
        assert r.started_at.tzinfo is not None and r.finished_at is not None
        assert r.started_at <= r.finished_at <= dt.datetime.now(dt.timezone.utc)

        [m] = s.measurements(run)
        assert isinstance(m_id, int)
        assert m == measurement()  # read back as itself
        assert m.key == MeasurementKey("nccl_all2allv", *SHAPE.values())

        [f] = s.failures(run)
        assert (f.id, f.backend, f.kind, f.reason) == (f_id, "nvlink_one_sided", "incorrect", "max abs err 0.5")
        assert f.has_shape and f.key == MeasurementKey("nvlink_one_sided", *SHAPE.values())


def test_runs_newest_first_and_latest_run_filters(store):
    _, r1 = new_run(store, fingerprint="h200-a")
    _, r2 = new_run(store, fingerprint="l40s-b")
    _, r3 = new_run(store, fingerprint="h200-a")
    store.finish_run(r1, "completed")
    store.finish_run(r2, "completed")
    store.finish_run(r3, "interrupted")

    assert [r.id for r in store.runs()] == [r3, r2, r1]
    assert [r.id for r in store.runs("h200-a")] == [r3, r1]
    assert store.runs("nope") == []
    assert store.latest_run().id == r2
    assert store.latest_run("h200-a").id == r1
    assert store.latest_run("h200-a", status=None).id == r3
    assert store.latest_run("h200-a", status="interrupted").id == r3
    assert store.latest_run("nope") is None


def test_numbers_are_normalised_and_bad_values_refused(store):
    class IndexLike:  # what numpy/torch integer scalars look like to us
        def __index__(self):
            return 64

    class FloatLike:
        def __float__(self):
            return 12.5

    _, run = new_run(store)
    store.add_measurement(run, measurement(num_experts=IndexLike(), median_us=FloatLike(), knobs=None))
    [m] = store.measurements(run)
    assert (m.num_experts, m.median_us, m.knobs) == (64, 12.5, {})
    assert type(m.num_experts) is int and type(m.median_us) is float

    with pytest.raises(ValueError, match="median_us"):
        store.add_measurement(run, measurement(tokens_per_rank=1, median_us=float("nan")))
    with pytest.raises(ValueError, match="knobs"):
        store.add_measurement(run, measurement(tokens_per_rank=1, knobs={"x": object()}))
    with pytest.raises(ValueError, match="kind"):
        store.add_failure(run, backend="x", kind="flaky", reason="?")
    with pytest.raises(ValueError, match="status"):
        store.finish_run(run, "done")
    with pytest.raises(TypeError):
        store.add_measurement(run, measurement(), phase="decode")
    with pytest.raises(NotFoundError):
        store.add_measurement(run + 100, measurement())
    with pytest.raises(NotFoundError):
        store.get_run(run + 100)
    with pytest.raises(NotFoundError):
        store.start_run(999, device_type="cpu", world_size=1, versions={}, git_sha=None, config={}, config_hash="x")
    assert len(store.measurements(run)) == 1  # refused writes left nothing behind


def test_failure_reason_is_stored_on_one_line(store):
    _, run = new_run(store)
    store.add_failure(run, backend="deepep", kind="error", reason="Traceback:\n  boom\n\nRuntimeError: x\n")
    [f] = store.failures(run)
    assert f.reason == "Traceback: boom RuntimeError: x"
    assert not f.has_shape and f.key is None


def test_duplicate_measurement_raises_and_keeps_the_first(store):
    _, run = new_run(store)
    store.add_measurement(run, measurement(median_us=10.0))
    with pytest.raises(DuplicateMeasurementError) as info:
        store.add_measurement(run, measurement(median_us=99.0))
    assert info.value.key[0] == run and "nccl_all2allv" in str(info.value)
    # Same point timed another way is not a duplicate.
    store.add_measurement(run, measurement(timing="graph"))
    ms = store.measurements(run)
    assert [(m.timing, m.median_us) for m in ms] == [("eager", 10.0), ("graph", 41.5)]


@pytest.mark.parametrize("tokens", [0, MAX_TOKENS_PER_RANK + 1])
def test_the_store_refuses_a_token_count_outside_the_points_bound(store, tokens):
    """The one bound for token counts (runtime.point.check_tokens), as the CLI, the table and
    lookup hold it: nothing is written."""
    _, run = new_run(store)
    with pytest.raises(ValueError, match=rf"tokens_per_rank must be in 1\.\.{MAX_TOKENS_PER_RANK}, got {tokens}"):
        store.add_measurement(run, measurement(tokens_per_rank=tokens))
    with pytest.raises(ValueError, match=rf"must be in 1\.\.{MAX_TOKENS_PER_RANK}, got {tokens}"):
        store.add_failure(
            run, backend="nvlink_one_sided", kind="error", reason="x", **dict(SHAPE, tokens_per_rank=tokens)
        )
    assert store.measurements(run) == [] and store.failures(run) == []
    store.add_measurement(run, measurement(tokens_per_rank=MAX_TOKENS_PER_RANK))  # the bound itself is a count


def test_virtual_rank_timings_are_never_stored_as_a_machine_s_measurements(store):
    import a2a_tune.db.store as store_mod
    from a2a_tune.kernels.virtual import VIRTUAL_TIMING, VirtualTimings

    _, run = new_run(store)
    timed = VirtualTimings("nvlink_one_sided", 8, "cuda:0", us=[12.0, 13.5])  # 8 ranks on one GPU
    assert timed.timing == VIRTUAL_TIMING == store_mod.VIRTUAL_TIMING
    with pytest.raises(StoreError, match="^nvlink_one_sided: virtual-rank timings .* never stored"):
        store.add_measurement(run, measurement(backend=timed.backend, timing=timed.timing, samples=timed.us))
    with pytest.raises(StoreError, match="virtual-rank timings"):
        store.add_measurement(run, measurement(timing=f"{VIRTUAL_TIMING}-graph"))
    assert store.measurements(run) == []


# ----------------------------------------------------------------------------- durability / resume


def test_measurement_survives_a_process_that_dies_without_closing(db_url):
    with open_store(db_url) as s:
        _, run = new_run(s)
    script = textwrap.dedent(
        f"""
        import os, sys
        from a2a_tune.db import open_store
        from a2a_tune.tuner.runtime.measurement import Measurement
        from a2a_tune.tuner.runtime.point import Point
        store = open_store({db_url!r})
        mid = store.add_measurement({run}, Measurement("nccl_all2allv", Point(2, 7168, 8, 64, "bf16", "skewed", 7),
            timing="graph", median_us=3.25, p10_us=3.0, p90_us=4.0, n=2, samples=[3.0, 3.5]))
        store.add_failure({run}, backend="deepep", kind="timeout", reason="no answer in 60 s")
        print(mid, flush=True)
        os._exit(0)  # no close, no commit at exit, no atexit handlers
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    mid = int(proc.stdout.strip())

    with open_store(db_url) as s:
        [m] = s.measurements(run)
        assert isinstance(mid, int) and (m.tokens_per_rank, m.routing, m.samples) == (7, "skewed", [3.0, 3.5])
        assert [f.kind for f in s.failures(run)] == ["timeout"]


def test_done_keys_holds_measurements_and_shaped_failures_only(store):
    _, run = new_run(store)
    _, other_run = new_run(store, config_hash="other")
    store.add_measurement(run, measurement(timing="eager"))
    store.add_measurement(run, measurement(timing="graph"))  # same key, other timing
    store.add_failure(run, backend="nvlink_one_sided", kind="incorrect", reason="wrong rows", **SHAPE)
    store.add_failure(run, backend="flashinfer_nvlink_one_sided", kind="unavailable", reason="package not installed")
    partial = dict(SHAPE, tokens_per_rank=None)
    store.add_failure(run, backend="nvlink_low_latency", kind="error", reason="setup failed", **partial)
    store.add_measurement(other_run, measurement(backend="allgather_reducescatter"))

    keys = store.done_keys(run)
    shape = tuple(SHAPE.values())
    # Plain tuples compare and hash equal to MeasurementKey: the sweep may build either.
    assert keys == {("nccl_all2allv", *shape), ("nvlink_one_sided", *shape)}
    assert all(isinstance(k, MeasurementKey) for k in keys)
    assert MeasurementKey.of("nccl_all2allv", Point(**SHAPE)).point == Point(**SHAPE)
    assert store.done_keys(other_run) == {("allgather_reducescatter", *shape)}


def test_find_resumable_run(store):
    hw, r1 = new_run(store, config_hash="A")
    assert store.find_resumable_run(hw, "A") == r1  # still "running" (the sweep died)
    assert store.find_resumable_run(hw, "B") is None
    other_hw = store.get_or_create_hardware("l40s", "x", {})
    assert store.find_resumable_run(other_hw, "A") is None

    store.finish_run(r1, "interrupted")
    assert store.find_resumable_run(hw, "A") == r1
    _, r2 = new_run(store, config_hash="A")
    store.finish_run(r2, "failed")
    assert store.find_resumable_run(hw, "A") == r2  # the latest unfinished one

    me = Writer.this_process()
    store.claim_run(r2, me)
    assert store.get_run(r2).status == "running" and store.get_run(r2).finished_at is None
    store.finish_run(r2, "completed", writer=me)
    # A completed run with this config supersedes the older interrupted r1.
    assert store.find_resumable_run(hw, "A") is None


def test_a_run_keeps_its_commands_start_and_its_latest_resume(db_url):
    """Issue 37: a run records when its command began (before its ranks started), a --resume when
    it began, keeping the first start; a claim that is no resume (ranks restarted by the same
    command) changes neither. Each is a time with its zone, refused otherwise before any SQL."""
    launched = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=30)
    resumed = launched + dt.timedelta(seconds=20)
    me = Writer.this_process()
    with open_store(db_url) as s:
        hw, untimed = new_run(s)
        run = start_run(s, hw, config={}, config_hash="c", launched_at=launched)
        assert (s.get_run(untimed).launched_at, s.get_run(untimed).resumed_at) == (None, None)
        r = s.get_run(run)
        assert (r.launched_at, r.resumed_at) == (launched, None) and r.launched_at < r.started_at
        s.finish_run(run, "interrupted")
        s.claim_run(run, me, resumed_at=resumed)
        s.claim_run(run, me)  # the same command's ranks restarted
        s.finish_run(run, "completed", writer=me)
        r = s.get_run(run)
        assert (r.launched_at, r.resumed_at) == (launched, resumed) and r.resumed_at < r.finished_at
        for bad in (launched.replace(tzinfo=None), launched.isoformat(), launched.timestamp()):
            with pytest.raises(ValueError, match="launched_at must be a datetime with a time zone"):
                start_run(s, hw, config={}, config_hash="c", launched_at=bad)
            with pytest.raises(ValueError, match="resumed_at must be a datetime with a time zone"):
                s.claim_run(untimed, me, resumed_at=bad)
        assert [r.id for r in s.runs()] == [run, untimed] and s.get_run(untimed).resumed_at is None


# ----------------------------------------------------------------------------- opening


def test_open_store_uses_default_file_then_env_var(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("A2A_TUNE_DB", raising=False)
    with open_store() as s:
        new_run(s)
    assert (tmp_path / "a2a_tune.db").is_file()

    env_file = tmp_path / "sub" / "env.db"
    env_file.parent.mkdir()
    monkeypatch.setenv("A2A_TUNE_DB", str(env_file))  # a plain path is fine
    with open_store() as s:
        assert s.runs() == []
        new_run(s)
    assert env_file.is_file()
    with open_store(str(tmp_path / "a2a_tune.db")) as s:
        assert len(s.runs()) == 1


def test_in_memory_database_works():
    with open_store("sqlite://") as s:
        hw, run = new_run(s)
        s.add_measurement(run, measurement())
        f_id = s.add_failure(run, backend="deepep", kind="unavailable", reason="package not installed")
        s.finish_run(run, "completed", summary={"measured": 1})
        [m] = s.measurements(run)
        assert m.key == MeasurementKey("nccl_all2allv", *SHAPE.values()) and m == measurement()
        [f] = s.failures(run)
        assert (f.id, f.backend, f.kind, f.reason, f.has_shape) == (
            f_id,
            "deepep",
            "unavailable",
            "package not installed",
            False,
        )
        [r] = s.runs()
        assert (r.id, r.hardware_id, r.status, r.summary, r.versions) == (
            run,
            hw,
            "completed",
            {"measured": 1},
            VERSIONS,
        )
    with open_store("sqlite://") as s:
        assert s.runs() == []  # another in-memory database: nothing outlives its store


def test_closed_store_refuses_use(db_url):
    s = open_store(db_url)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.runs()


def test_figures_are_stored_beside_the_round_trip_and_read_back(db_url):
    figures = dict(
        dispatch_median_us=19.5,
        combine_median_us=23.25,
        dispatch_samples=[19.0, 19.5, 20.0],
        combine_samples=[23.0, 23.25, 24.0],
        dispatch_logical_bytes=1835008.0,
        dispatch_link_bytes=917504.5,
        combine_logical_bytes=3670016.0,
        combine_link_bytes=1835009.0,
        workspace_bytes=6 * 2**30,  # beyond 32 bits
        group_us=[18.5, 19.25],  # each EP group's median, in group order
    )
    with open_store(db_url) as s:
        _, run = new_run(s)
        s.add_measurement(run, measurement(**figures))
        s.add_measurement(run, measurement(tokens_per_rank=1))  # none given: not measured
    with open_store(db_url, readonly=True) as s:
        with_figures, without = s.measurements(run)
    assert {f: with_figures.columns()[f] for f in FIGURE_FIELDS} == figures
    assert with_figures.figure("dispatch_us") == 19.5 and with_figures.figure("workspace_bytes") == 6 * 2**30
    assert without.figures == {} and all(without.columns()[f] is None for f in FIGURE_FIELDS)


@pytest.mark.parametrize(
    "bad, error",
    [
        (dict(dispatch_median_us=float("nan")), ValueError),
        (dict(combine_samples=[1.0, float("inf")]), ValueError),
        (dict(workspace_bytes=-1), ValueError),
        (dict(workspace_bytes=1.5), ValueError),
    ],
)
def test_a_figure_that_cannot_be_stored_is_refused_before_any_sql(store, bad, error):
    _, run = new_run(store)
    with pytest.raises(error):
        store.add_measurement(run, measurement(**bad))
    assert store.measurements(run) == []


# ----------------------------------------------------------------------------- threads


def test_concurrent_writers_from_threads_lose_nothing(store):
    _, run = new_run(store)
    errors = []

    def write(tokens):
        try:
            hw = store.get_or_create_hardware("shared", "hash", {})
            store.add_measurement(run, measurement(tokens_per_rank=tokens, knobs={"hw": hw}))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(1, 17)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ms = store.measurements(run)
    assert sorted(m.tokens_per_rank for m in ms) == list(range(1, 17))
    assert len({m.knobs["hw"] for m in ms}) == 1


# ----------------------------------------------------------------------------- the file it opened


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("how", ["deleted", "moved", "replaced"])
def test_a_store_whose_file_is_gone_writes_nothing_more(tmp_path, how):
    db = tmp_path / "store.db"
    other = tmp_path / "other.db"
    with open_store(sqlite_url(other)) as s:
        new_run(s, fingerprint="someone-else")
    store = open_store(sqlite_url(db))
    _, run = new_run(store)
    me = Writer.this_process()
    store.claim_run(run, me)
    store.add_measurement(run, measurement(), writer=me)
    if how == "deleted":
        db.unlink()
    elif how == "moved":
        db.rename(tmp_path / "moved.db")
    else:
        os.replace(other, db)  # another store put in its place
    kept = _sha(db) if db.exists() else None
    with pytest.raises(StoreFileLostError) as info:
        store.add_measurement(run, measurement(tokens_per_rank=256), writer=me)
    message = str(info.value)
    assert_one_clean_line(message)
    assert info.value.path == str(db) and f"{db} is no longer the file this process opened" in message
    assert ("another file was put in its place" if how == "replaced" else "deleted or moved away") in message
    for write in (
        lambda: store.add_failure(run, backend="deepep", kind="error", reason="late", writer=me),
        lambda: store.finish_run(run, "completed", writer=me),
        lambda: store.runs(),
    ):
        with pytest.raises(StoreFileLostError):
            write()
    with LeaseHeartbeat(store, run, me, interval=0.01) as beat:  # the heartbeat stops too, saying why
        deadline = time.monotonic() + 10
        while beat.lost is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "is no longer the file this process opened" in beat.lost
    store.close()
    if how == "replaced":
        assert _sha(db) == kept  # the file now in its place is not written to
    else:
        assert not db.exists()  # and no new one was made


def test_a_fresh_store_at_the_same_path_gets_nothing_of_ours(tmp_path):
    """A new pooled connection would open whatever file is at the path now: the check comes first."""
    db = tmp_path / "store.db"
    store = open_store(sqlite_url(db))
    _, run = new_run(store)
    db.unlink()
    open_store(sqlite_url(db)).close()  # someone starts over: a fresh, empty store at the same path
    with pytest.raises(StoreFileLostError, match="another file was put in its place"):
        store.add_measurement(run, measurement())
    store.close()
    with open_store(sqlite_url(db)) as fresh:
        assert fresh.runs() == []


# ----------------------------------------------------------------------------- a lost server


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_lost_server_is_a_connection_lost_error_in_one_line(db_url):
    from tcp_proxy import Proxy

    url = make_url(resolve_url(db_url))
    proxy = Proxy(url.host, url.port)
    via = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    store = open_store(via)
    try:
        _, run = new_run(store)
        store.add_measurement(run, measurement())
        proxy.cut()  # the server is gone: open connections drop, new ones are refused
        for attempt in range(2):  # the broken pooled connection, then a refused new one
            with pytest.raises(ConnectionLostError) as info:
                store.add_measurement(run, measurement(tokens_per_rank=256 + attempt))
            message = str(info.value)
            assert_one_clean_line(message)
            assert message.startswith("adding a measurement on postgresql+psycopg://")
            assert "failed: lost the connection to the database server (" in message
            assert url.password not in message
    finally:
        store.close()
    with open_store(db_url) as s:  # what was committed before is kept
        assert [m.tokens_per_rank for m in s.measurements(run)] == [SHAPE["tokens_per_rank"]]


def test_other_store_errors_are_not_a_lost_connection(store):
    _, run = new_run(store)
    store.add_measurement(run, measurement())
    with pytest.raises(DuplicateMeasurementError) as info:
        store.add_measurement(run, measurement())
    assert not isinstance(info.value, ConnectionLostError)
    with pytest.raises(NotFoundError) as info:
        store.get_run(run + 100)
    assert not isinstance(info.value, ConnectionLostError)


# ----------------------------------------------------------------------------- one database, several machines
# Two sweeps write into it at the same time, and the operator's commands read it.

MACHINES = {"box-a": ("h200_nv18x2.json", "h200.nvl18x2.node1"), "box-b": ("l40s_pcie4.json", "l40s.pciex4.node1")}
PLANNED = 2 * 2  # token counts x backends, per machine


def _a2a(node, *args: str) -> subprocess.CompletedProcess:
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
        pytest.skip("SQLite stores: tests/views/test_views.py and tests/tuner/test_cli.py")
    assert [rc for rc, _, _ in results] == [0, 0]
    with open_store(url) as store:
        run_ids = sorted(r.id for r in store.runs())
    password = make_url(resolve_url(url)).password
    shown = _a2a(machines[0], "show", "--db", url, "--run", str(run_ids[0]), "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["fingerprint"] in {fp for _, fp in MACHINES.values()}
    diff = _a2a(machines[0], "diff", "--db", url, "--run", str(run_ids[0]), "--run", str(run_ids[1]))
    assert diff.returncode in (0, 1), diff.stderr  # 2 would be bad input
    report = _a2a(machines[0], "report", "--db", url, "--run", str(run_ids[1]), "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert "<html" in (tmp_path / "r.html").read_text().lower()
    selected = _a2a(machines[0], "select", "--db", url, "--run", str(run_ids[1]), "--out", str(tmp_path / "tables"))
    assert selected.returncode == 0, selected.stderr
    assert len(list((tmp_path / "tables").glob("*.json"))) == 1
    for r in (shown, diff, report, selected):
        assert not password or password not in r.stdout + r.stderr
