"""Run once per cluster: multi-node jobs on one machine (torchrun agents and srun-like tasks on
127.0.0.1, each node replaying its own recorded NVML machine), mixed clusters, backend reach,
lost nodes, and the table on every node (tests/support/cluster_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from cluster_job import CLI, FIXTURES, free_port, lookup, nodes, recording, srun, torchrun
from databases import fresh_postgres_database, measurement_count, postgres_server

from a2a_tune.db import open_store
from a2a_tune.kernels import get_backend, list_backends, register_backend
from a2a_tune.kernels.base import REACHES, SPANS, reaches
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv
from a2a_tune.tuner.cluster import ClusterView, MixedClusterError, RankReport, check_mixed
from a2a_tune.tuner.launch import JobRank, RankFailed, first_host, job_rank, rendezvous_address
from a2a_tune.tuner.nvml import RecordedNvml
from a2a_tune.tuner.probe import cpu_topology, probe

GB200 = [FIXTURES / "gb200_nvl72_slice" / f"node{i}.json" for i in range(4)]
VERSIONS = {"nccl": "2.27.3", "cuda": "12.9", "torch": "2.11.0", "flashinfer": None}
SHAPE = dict(hidden=64, topk=2, experts=8)


# ------------------------------------------------------------------------------ reach


def test_reach_says_which_ep_groups_a_backend_can_join():
    assert [[reaches(r, s) for s in SPANS] for r in REACHES] == [
        [True, False, False],  # island: one NVLink island on one node only
        [True, True, False],  # domain: also an NVLink domain across nodes (fabric memory)
        [True, True, True],  # anywhere: whatever the process group connects
    ]
    reach = {name: get_backend(name).reach for name in list_backends()}
    assert reach["nvlink_one_sided"] == reach["nvlink_low_latency"] == "island"  # CUDA IPC
    assert reach["flashinfer_nvlink_one_sided"] == reach["flashinfer_nvlink_two_sided"] == "domain"
    assert reach["allgather_reducescatter"] == reach["nccl_all2allv"] == "anywhere"


def test_a_backend_with_an_unknown_reach_is_refused_at_registration():
    class Everywhere(NcclAll2Allv):
        name = "test_bad_reach"
        reach = "everywhere"

    with pytest.raises(ValueError, match="reach 'everywhere' is not one of island, domain, anywhere"):
        register_backend(Everywhere)


def test_a_backend_declaring_one_field_per_engine_is_refused_when_its_class_is_made():
    """The engines' literals are one map; the older spelling would lose them silently."""
    with pytest.raises(TypeError, match="declares sglang_name, vllm_name: declare engine_names"):

        class OldStyle(NcclAll2Allv):
            name = "test_old_style"
            vllm_name = "nixl_ep"
            sglang_name = None

    class NewStyle(NcclAll2Allv):
        name = "test_new_style"
        engine_names = {"vllm": "nixl_ep"}

    assert NewStyle.engine_names == {"vllm": "nixl_ep"} and NcclAll2Allv.engine_names == {}


# ------------------------------------------------------------------------------ the launchers


def test_torchrun_and_srun_say_where_a_rank_is(monkeypatch):
    for key in [k for k in os.environ if k.startswith("SLURM_")] + ["RANK", "WORLD_SIZE", "LOCAL_RANK"]:
        monkeypatch.delenv(key, raising=False)
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert job_rank() is None  # a2a-tune spawns its own ranks
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert job_rank() is None  # an allocation's shell, or a one-task step: not a job of ranks
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert job_rank() == JobRank(5, 8, 1, "srun")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-10]")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    assert rendezvous_address() == ("gpu07", 23456)  # the step's first node, a port from the job id
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert rendezvous_address() == ("10.0.0.1", 29500)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert job_rank() == JobRank(3, 4, 3, "torchrun")  # torchrun under Slurm: torchrun's variables
    monkeypatch.setenv("RANK", "three")
    with pytest.raises(RankFailed, match="RANK='three' is not an integer"):
        job_rank()


def test_the_first_host_of_a_slurm_node_list():
    assert first_host("gpu[07-09,12],login1") == "gpu07"
    assert first_host("tray[01-18]-a,x") == "tray01-a"
    assert first_host("node1,node2") == "node1"
    assert first_host("single") == "single"


# ------------------------------------------------------------------------------ the cluster view


def _report(rank: int, local: int, topo, **versions) -> RankReport:
    return RankReport(rank, local, topo.to_dict(), {**VERSIONS, **versions})


def _view(*per_node, ranks_per_node: int = 2) -> ClusterView:
    """A view of nodes given as (topology, versions) pairs, `ranks_per_node` ranks on each."""
    reports = []
    for topo, versions in per_node:
        for local in range(ranks_per_node):
            reports.append(_report(len(reports), local, topo, **versions))
    return ClusterView.from_reports(reports)


def _node(path, **changes):
    data = json.loads(path.read_text())
    data.update({k: v for k, v in changes.items() if k != "links_down"})
    for link in data["devices"][1]["nvlinks"][: changes.get("links_down", 0)]:
        link["state"] = False
    return probe(RecordedNvml(data))


def test_two_gb200_trays_are_one_nvlink_domain_spanning_nodes():
    view = _view((_node(GB200[0]), {}), (_node(GB200[1]), {}))
    assert view.topology.fingerprint == "gb200.mnnvl18x8.nodes2"
    assert view.span() == ("domain", "4 ranks in one NVLink domain over 2 nodes")
    assert view.mixed() == []
    summary = view.summary()
    assert [(n["host"], n["ranks"], n["fingerprint"]) for n in summary["nodes"]] == [
        ("gb200-r07-tray01", [0, 1], "gb200.nvl18x4.node1"),
        ("gb200-r07-tray02", [2, 3], "gb200.nvl18x4.node1"),
    ]
    assert summary["ep_span"] == "domain" and "mixed" not in summary


def test_two_h200_nodes_are_islands_joined_by_the_network():
    a = _node(FIXTURES / "h200_nv18x2.json", hostname="h200-a")
    b = _node(FIXTURES / "h200_nv18x2.json", hostname="h200-b")
    view = _view((a, {}), (b, {}))
    assert view.topology.fingerprint == "h200.nvl18x2.nodes2"
    assert view.span() == ("network", "4 ranks on 2 nodes joined by the network")
    assert _view((a, {})).span() == ("island", "2 ranks in one NVLink island on one node")


def test_the_fabric_a_run_records_follows_where_each_rank_ran_not_its_number():
    """Two H200 nodes, ranks dealt round-robin (rank 0 on a, 1 on b, ...): every EP-2 group
    crosses the network, which numbering by rank (rank r = the probe's GPU r) would call one
    island. The run records what the ranks did (select's `fabric`)."""
    a = _node(FIXTURES / "h200_nv18x2.json", hostname="h200-a")
    b = _node(FIXTURES / "h200_nv18x2.json", hostname="h200-b")
    by_node = _view((a, {}), (b, {}))
    assert by_node.fabrics([2, 4]) == {"2": "island", "4": "network"}
    dealt = ClusterView.from_reports([_report(0, 0, a), _report(1, 0, b), _report(2, 1, a), _report(3, 1, b)])
    assert dealt.fabrics([2, 4]) == {"2": "network", "4": "network"}
    assert dealt.widest_span(2) == ("network", "2 ranks on 2 nodes joined by the network")


def test_ranks_without_nvlink_between_them_span_the_network():
    l40s = _node(FIXTURES / "l40s_pcie4.json")
    assert _view((l40s, {})).span() == ("network", "2 ranks on one node without NVLink between all of them")
    assert _view((cpu_topology(hostname="box"), {})).span()[0] == "network"  # CPU ranks: no GPU at all
    h200 = _node(FIXTURES / "h200_nv18x2.json")
    assert _view((h200, {}), ranks_per_node=3).span()[0] == "network"  # a third rank has no GPU of its own


def test_a_node_that_differs_is_named_in_one_line():
    trays = [_node(path) for path in GB200[:3]]
    old_driver = _node(GB200[2], driver_version="565.57.01")
    view = _view((trays[0], {}), (trays[1], {"nccl": "2.26.2"}), (old_driver, {}))
    assert view.mixed() == [
        "node gb200-r07-tray02 differs: nccl 2.26.2 (others: 2.27.3)",
        "node gb200-r07-tray03 differs: driver 565.57.01 (others: 570.133.20)",
    ]
    with pytest.raises(MixedClusterError) as info:
        check_mixed(view, allow=False)
    message = str(info.value)
    assert "\n" not in message and "gb200-r07-tray03" in message and "--allow-mixed" in message
    assert check_mixed(view, allow=True) == view.mixed()
    assert view.summary()["mixed"] == view.mixed()


def test_of_two_nodes_the_degraded_one_is_named_even_when_it_runs_rank_0():
    degraded = _node(GB200[0], links_down=2)
    view = _view((degraded, {}), (_node(GB200[1]), {}))
    assert view.mixed() == [
        "node gb200-r07-tray01 differs: hardware gb200.nvl18x4-degraded.node1 [GPU1 16/18 NVLinks active] "
        "(others: gb200.nvl18x4.node1)"
    ]


def test_another_gpu_model_is_a_mixed_cluster():
    view = _view((_node(FIXTURES / "h200_nv18x2.json"), {}), (_node(FIXTURES / "h100_hgx8.json"), {}))
    assert view.mixed() == [
        "node hgx-h100-07 differs: hardware h100-sxm.nvl18x8.node1 (others: h200.nvl18x2.node1); "
        "driver 550.127.05 (others: 580.159.04)"
    ]


# ------------------------------------------------------------------------------ jobs

TINY = {"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64, "model_type": "tiny"}


def _run_args(tmp_path, db: str, *extra: str, tokens: str = "1,4", iters: str = "3") -> list[str]:
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    backends = ["allgather_reducescatter", "nccl_all2allv", "planted_island_reach", "planted_domain_reach"]
    return [
        *extra,
        "--device",
        "cpu",
        "--model-config",
        str(config),
        "--tokens",
        tokens,
        "--warmup",
        "1",
        "--iters",
        iters,
        "--db",
        db,
        "--no-progress",
        *[arg for b in backends for arg in ("--backend", b)],
    ]


def _finish(procs, timeout=600) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of every process, once all have ended."""
    outputs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outputs)]


def _check_table_on_every_node(job_nodes, db: str, fingerprint: str, node_fingerprint: str, span: str):
    with open_store(db) as store:
        (run,) = store.runs()
        assert (run.status, run.fingerprint, run.world_size) == ("completed", fingerprint, 4)
        facts = store.hardware_for_run(run.id).facts
        measured = {m.backend for m in store.measurements(run.id)}
        not_applicable = {f.backend: f.reason for f in store.failures(run.id) if f.kind == "not_applicable"}
    assert len(facts["hostnames"]) == len(job_nodes)  # every node probed itself
    assert run.config["cluster"]["ep_span"] == span
    assert [n["ranks"] for n in run.config["cluster"]["nodes"]] == [[0, 1], [2, 3]]
    answers = []
    for node in job_nodes:
        table = json.loads((node.profiles / f"{fingerprint}.json").read_text())
        assert table["hardware"]["fingerprint"] == fingerprint and table["run"]["cluster"]["ep_span"] == span
        pointer = json.loads((node.profiles / f"{node_fingerprint}.cluster").read_text())
        assert pointer == {"clusters": [fingerprint]}
        answer = lookup(node, "--ep-size", "4", "--hidden", "64", "--topk", "2", "--experts", "8", "--tokens", "4")
        assert (answer["hardware_match"], answer["profile_fingerprint"]) == ("cluster", fingerprint)
        assert answer["source"] == str(node.profiles / f"{fingerprint}.json")  # this node's own copy
        answers.append({k: answer[k] for k in ("backend", "expected_us", "alternatives", "entry_shape", "reason")})
    assert answers[0] == answers[1]  # every node answers the same
    return measured, not_applicable


@pytest.mark.slow
def test_gb200_slice_under_torchrun_one_nvlink_domain_over_two_nodes(tmp_path):
    job_nodes = nodes(tmp_path, GB200[:2])
    db = f"sqlite:///{tmp_path / 'cluster.db'}"
    port = free_port()
    results = _finish([torchrun(n, 2, 2, port, _run_args(tmp_path, db, "run", "--ep-sizes", "4")) for n in job_nodes])
    assert [rc for rc, _, _ in results] == [0, 0], results
    out = results[0][1]
    assert "run 1 (completed) on gb200.mnnvl18x8.nodes2: 6 measured" in out
    words = " ".join(out.split())  # the reasons are a table that wraps at spaces
    assert (
        "planted_island_reach not applicable: reaches one NVLink island on one node; this EP group is 4 ranks " in words
    )
    assert out.count("wrote ") == 2 and "Traceback" not in results[0][2] + results[1][2]
    measured, not_applicable = _check_table_on_every_node(
        job_nodes, db, "gb200.mnnvl18x8.nodes2", "gb200.nvl18x4.node1", "domain"
    )
    # Fabric memory reaches across the trays of the domain; CUDA IPC does not.
    assert measured == {"allgather_reducescatter", "nccl_all2allv", "planted_domain_reach"}
    assert list(not_applicable) == ["planted_island_reach"]
    assert "one NVLink domain over 2 nodes" in not_applicable["planted_island_reach"]


@pytest.mark.slow
def test_h200_nodes_under_srun_islands_joined_by_the_network(tmp_path):
    recs = [recording(tmp_path, "h200_nv18x2.json", f"h200-{c}") for c in "ab"]
    job_nodes = nodes(tmp_path, recs)
    db = f"sqlite:///{tmp_path / 'cluster.db'}"
    port = free_port()
    procs = [p for n in job_nodes for p in srun(n, 2, 2, port, _run_args(tmp_path, db, "run", "--ep-sizes", "4"))]
    results = _finish(procs)
    assert [rc for rc, _, _ in results] == [0, 0, 0, 0], results
    assert "(srun job)" in results[0][1] and all(not out for _, out, _ in results[1:])  # rank 0 speaks for the job
    measured, not_applicable = _check_table_on_every_node(
        job_nodes, db, "h200.nvl18x2.nodes2", "h200.nvl18x2.node1", "network"
    )
    assert measured == {"allgather_reducescatter", "nccl_all2allv"}  # the network: NCCL's reach only
    assert sorted(not_applicable) == ["planted_domain_reach", "planted_island_reach"]
    assert all("4 ranks on 2 nodes joined by the network" in r for r in not_applicable.values())


@pytest.mark.slow
def test_a_mixed_cluster_stops_before_any_timing_unless_allowed(tmp_path):
    recs = [recording(tmp_path, "gb200_nvl72_slice/node0.json", "tray-a")]
    recs.append(recording(tmp_path, "gb200_nvl72_slice/node1.json", "tray-b", driver_version="575.51.03"))
    job_nodes = nodes(tmp_path, recs)
    db_file = tmp_path / "mixed.db"
    db = f"sqlite:///{db_file}"
    port = free_port()
    results = _finish([p for n in job_nodes for p in srun(n, 2, 1, port, _run_args(tmp_path, db, "run"))])
    assert [rc for rc, _, _ in results] == [1, 1]
    for _, _, err in results:
        (line,) = err.strip().splitlines()
        assert "mixed cluster: node tray-b differs: driver 575.51.03 (others: 570.133.20)" in line
        assert "--allow-mixed" in line
    if db_file.exists():  # refused before the store: no run to resume or select
        with open_store(db) as store:
            assert store.runs() == []

    args = _run_args(tmp_path, db, "run", "--allow-mixed")
    port = free_port()
    results = _finish([p for n in job_nodes for p in srun(n, 2, 1, port, args)])
    assert [rc for rc, _, _ in results] == [0, 0], results
    assert "warning: mixed cluster (--allow-mixed): node tray-b differs: driver" in results[0][2]
    for node in job_nodes:
        table = json.loads((node.profiles / "gb200.mnnvl18x8.nodes2.json").read_text())
        assert table["run"]["cluster"]["mixed"] == ["node tray-b differs: driver 575.51.03 (others: 570.133.20)"]
        assert table["hardware"]["facts"]["driver_versions"] == ["570.133.20", "575.51.03"]


@pytest.fixture
def shared_db(tmp_path):
    """The database a cluster shares: a fresh PostgreSQL database when a server is configured
    (as in CI), else an SQLite file."""
    server = postgres_server()
    if server is None:
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    with fresh_postgres_database(server) as url:
        yield url


@pytest.mark.slow
def test_a_killed_node_stops_the_job_in_one_line_and_resume_completes_it(tmp_path, shared_db):
    from a2a_tune.db import resolve_url

    db = resolve_url(shared_db)
    recs = [recording(tmp_path, "h200_nv18x2.json", f"h200-{c}") for c in "ab"]
    job_nodes = nodes(tmp_path, recs)
    args = _run_args(tmp_path, db, "sweep", "--ep-sizes", "4", tokens="1,2,4,8,16,32", iters="20")
    planned = 6 * 2  # token counts x the two backends the network reaches
    port = free_port()
    agents = [torchrun(n, 2, 2, port, args, A2A_TUNE_COLLECTIVE_TIMEOUT_S="60") for n in job_nodes]
    deadline = time.monotonic() + 300
    while measurement_count(db) < 3 and time.monotonic() < deadline and agents[0].poll() is None:
        time.sleep(0.2)
    assert agents[0].poll() is None, agents[0].communicate()
    agents[1].kill()  # node 1's torchrun agent; its ranks die with it (parent-death signal)
    killed = time.monotonic()
    (rc, out, err), _ = _finish(agents, timeout=120)
    stopped_after = time.monotonic() - killed
    assert rc != 0 and stopped_after < 60, (stopped_after, err)  # the bound: A2A_TUNE_COLLECTIVE_TIMEOUT_S
    # one line per surviving rank: it lost contact, or torchrun stopped it first (SIGTERM)
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert any("lost contact with the job" in line for line in ours), err
    assert all("--resume" in line for line in ours), err
    assert not any("a2a_tune" in line and "File " in line for line in err.splitlines())  # no traceback of ours
    stored = measurement_count(db)
    assert 3 <= stored < planned
    with open_store(db) as store:
        (run,) = store.runs()
        assert run.status != "completed"

    port = free_port()
    results = _finish([torchrun(n, 2, 2, port, [*args, "--resume"]) for n in job_nodes])
    assert [r[0] for r in results] == [0, 0], results
    assert f"{planned - stored} measured, {stored} already stored" in results[0][1]
    with open_store(db) as store:
        (run,) = store.runs()  # the same run, completed
        keys = [m.key for m in store.measurements(run.id)]
        assert run.status == "completed"
    assert len(keys) == len(set(keys)) == planned  # nothing lost, nothing measured twice


@pytest.mark.slow
def test_a_rank_that_cannot_reach_the_rendezvous_says_so_within_the_bound(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(A2A_TUNE_RENDEZVOUS_TIMEOUT_S="3", A2A_TUNE_BACKEND_MODULES="reach_backends")
    started = time.monotonic()
    r = subprocess.run(
        [*CLI, *_run_args(tmp_path, f"sqlite:///{tmp_path / 'x.db'}", "sweep")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and time.monotonic() - started < 60
    (line,) = r.stderr.strip().splitlines()
    assert "rank 1 of 2 (torchrun): rendezvous at 127.0.0.1:" in line and "nothing answers after 3 s" in line
