"""Topology probe on recorded NVML answers: each test pins one machine fact or driver quirk."""

from __future__ import annotations

import copy
import json
import platform
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import paths
import pytest
from rich.console import Console

from a2a_tune.tuner.nvml import NvmlQueryError, RealNvml, RecordedNvml, record
from a2a_tune.tuner.probe import (
    DegradedGpu,
    FabricDomain,
    Island,
    NvlinkPair,
    Topology,
    merge_nodes,
    probe,
    render_summary,
    sku_slug,
)

FIXTURES = paths.FIXTURES / "nvml"
# One recording per compute tray, as each node of a multi-node launch records itself.
GB200_TRAYS = sorted((FIXTURES / "gb200_nvl72_slice").glob("node*.json"))
GB200_CLUSTER = "4d1c7a52-93e0-4b6f-a8d2-5f0e3c7b9a16"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def probe_fixture(name: str | dict[str, Any], **kwargs: Any) -> Topology:
    return probe(RecordedNvml(load(name) if isinstance(name, str) else name), **kwargs)


def gb200_cluster() -> Topology:
    return merge_nodes([probe(RecordedNvml(path)) for path in GB200_TRAYS])


def rendered(topo: Topology) -> str:
    console = Console(record=True, width=200)
    console.print(render_summary(topo))
    return console.export_text()


# -- 2x H200, direct NV18 ----------------------------------------------------------------


def test_recorded_h200_pair_is_one_nv18_island_behind_a_switch() -> None:
    # The real 2x H200 VM: NVML reports every link as going to an NVSwitch (the VM is a
    # slice of an NVSwitch board), although nvidia-smi topo prints NV18 between the GPUs.
    topo = probe_fixture("h200_nv18x2.json")
    assert topo.fingerprint == "h200.nvl18x2.node1"
    assert topo.islands == (
        Island(gpus=(0, 1), nodes=(0,), via_switch=True, link_counts=(18, 18), speed_mbps=26562, direct_pairs=()),
    )
    assert topo.degraded == ()
    assert topo.pcie_only_pairs == ()
    assert (topo.node_count, topo.hostname, topo.driver_version) == (1, "vm", "580.159.04")
    gpu = topo.gpus[1]
    assert (gpu.name, gpu.sku, gpu.compute_capability) == ("NVIDIA H200", "h200", (9, 0))
    assert gpu.memory_total_bytes == 150754820096
    assert gpu.pci_bus_id == "00000000:00:07.0"
    assert gpu.active_links == list(range(18))


def test_directly_joined_pair_is_one_island_with_a_direct_nv18_pair() -> None:
    topo = probe_fixture("direct_nv18_pair.json")
    assert topo.fingerprint == "h200.nvl18x2.node1"
    assert topo.islands == (
        Island(
            gpus=(0, 1),
            nodes=(0,),
            via_switch=False,
            link_counts=(18, 18),
            speed_mbps=26562,
            direct_pairs=(NvlinkPair(a=0, b=1, links=18, speed_mbps=26562),),
        ),
    )


def test_h200_all_zero_cluster_uuid_is_not_a_multi_node_domain() -> None:
    topo = probe_fixture("h200_nv18x2.json")
    fabric = topo.gpus[0].fabric
    assert fabric is not None
    assert (fabric.state, fabric.clique_id) == ("completed", 0)
    assert fabric.cluster_uuid == "00000000-0000-0000-0000-000000000000"
    assert fabric.in_domain is False
    assert topo.fabric_domains == ()


def test_h200_invalid_argument_beyond_link_17_is_not_present() -> None:
    topo = probe_fixture("h200_nv18x2.json")
    assert [link.index for link in topo.gpus[0].links] == list(range(18))


# -- 8x H100 HGX ---------------------------------------------------------------------------


def test_hgx_h100_switch_links_make_one_island_of_eight() -> None:
    topo = probe_fixture("h100_hgx8.json")
    assert topo.fingerprint == "h100-sxm.nvl18x8.node1"
    assert topo.islands == (
        Island(
            gpus=tuple(range(8)),
            nodes=(0,),
            via_switch=True,
            link_counts=(18,) * 8,
            speed_mbps=26562,
            direct_pairs=(),
        ),
    )
    assert topo.fabric_domains == ()
    assert topo.degraded == ()
    assert topo.pcie_only_pairs == ()


def test_hgx_h100_not_supported_for_unused_link_indices_is_not_present() -> None:
    topo = probe_fixture("h100_hgx8.json")
    assert all(len(gpu.links) == 18 and gpu.inactive_links == [] for gpu in topo.gpus)


def test_hgx_h100_fabric_not_supported_is_recorded_not_a_domain() -> None:
    topo = probe_fixture("h100_hgx8.json")
    fabric = topo.gpus[0].fabric
    assert fabric is not None and (fabric.state, fabric.in_domain) == ("not_supported", False)


def test_degraded_gpu_is_reported_with_its_four_down_links() -> None:
    topo = probe_fixture("h100_degraded.json")
    assert topo.fingerprint == "h100-sxm.nvl18x8-degraded.node1"
    assert topo.degraded == (DegradedGpu(gpu=3, active_links=14, expected_links=18, down_links=(4, 5, 6, 7)),)
    assert topo.islands[0].link_counts == (18, 18, 18, 14, 18, 18, 18, 18)
    assert topo.islands[0].links_per_gpu == 18


def test_sku_link_count_flags_a_node_where_every_gpu_lost_the_same_links() -> None:
    data = load("h100_hgx8.json")
    for device in data["devices"]:
        device["nvlinks"][17]["state"] = False
    topo = probe_fixture(data)
    assert topo.fingerprint == "h100-sxm.nvl17x8-degraded.node1"
    assert [(d.gpu, d.active_links, d.expected_links, d.down_links) for d in topo.degraded] == [
        (i, 17, 18, (17,)) for i in range(8)
    ]


# -- GB200 NVL72 slice: 4 trays x 4 GPUs ---------------------------------------------------


def test_gb200_invalid_argument_link_indices_are_not_counted_as_down() -> None:
    tray = probe(RecordedNvml(GB200_TRAYS[0]))
    assert all(len(gpu.links) == 18 for gpu in tray.gpus)
    assert all(gpu.inactive_links == [] for gpu in tray.gpus)
    assert tray.degraded == ()


def test_gb200_single_tray_sees_its_four_gpus_on_the_switch() -> None:
    tray = probe(RecordedNvml(GB200_TRAYS[0]))
    assert tray.fingerprint == "gb200.nvl18x4.node1"
    assert tray.islands[0].gpus == (0, 1, 2, 3)
    assert tray.islands[0].speed_mbps == 53125
    assert tray.fabric_domains == (
        FabricDomain(cluster_uuid=GB200_CLUSTER, clique_id=32766, gpus=(0, 1, 2, 3), nodes=(0,)),
    )


def test_gb200_unreadable_remote_bus_id_still_joins_the_switch() -> None:
    tray = probe(RecordedNvml(GB200_TRAYS[0]))
    link = tray.gpus[0].links[0]
    assert (link.remote_bus_id, link.remote_type, link.version) == (None, "switch", 7)


def test_gb200_four_tray_merge_is_one_fabric_domain_of_sixteen_gpus() -> None:
    cluster = gb200_cluster()
    assert cluster.node_count == 4
    assert cluster.hostnames == tuple(f"gb200-r07-tray{n:02d}" for n in range(1, 5))
    assert cluster.fabric_domains == (
        FabricDomain(
            cluster_uuid=GB200_CLUSTER,
            clique_id=32766,
            gpus=tuple(range(16)),
            nodes=(0, 1, 2, 3),
        ),
    )
    assert cluster.islands == (
        Island(
            gpus=tuple(range(16)),
            nodes=(0, 1, 2, 3),
            via_switch=True,
            link_counts=(18,) * 16,
            speed_mbps=53125,
            direct_pairs=(),
        ),
    )
    assert cluster.fingerprint == "gb200.mnnvl18x16.nodes4"
    assert cluster.pcie_only_pairs == ()
    assert [(g.node, g.local_index) for g in cluster.gpus[4:6]] == [(1, 0), (1, 1)]


def test_merge_ignores_rank_order_and_repeated_hosts() -> None:
    trays = [probe(RecordedNvml(path)) for path in GB200_TRAYS]
    shuffled = [trays[2], trays[0], trays[3], trays[0], trays[1], trays[2]]
    assert merge_nodes(shuffled) == gb200_cluster()


def test_hgx_nodes_without_shared_fabric_stay_separate_islands() -> None:
    first = probe_fixture("h100_hgx8.json", hostname="hgx-a")
    second = probe_fixture("h100_hgx8.json", hostname="hgx-b")
    cluster = merge_nodes([first, second])
    assert cluster.fingerprint == "h100-sxm.nvl18x8.nodes2"
    assert [island.gpus for island in cluster.islands] == [tuple(range(8)), tuple(range(8, 16))]
    assert cluster.pcie_only_pairs == ()  # across nodes the path is the network, not PCIe


def test_gpus_outside_the_fabric_domain_keep_their_own_islands() -> None:
    h200 = probe_fixture("h200_nv18x2.json")
    cluster = merge_nodes([*(probe(RecordedNvml(path)) for path in GB200_TRAYS), h200])
    assert cluster.fingerprint == "gb200+h200.mnnvl18x16+nvl18x2.nodes5"
    assert [island.gpus for island in cluster.islands] == [tuple(range(16)), (16, 17)]
    assert cluster.fabric_domains[0].gpus == tuple(range(16))


# -- 4x L40S, PCIe only --------------------------------------------------------------------


def test_l40s_has_no_nvlink_and_every_pair_is_pcie_only() -> None:
    topo = probe_fixture("l40s_pcie4.json")
    assert topo.fingerprint == "l40s.pciex4.node1"
    assert topo.islands == ()
    assert topo.pcie_only_pairs == ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
    assert all(gpu.links == () and gpu.fabric is None for gpu in topo.gpus)
    assert topo.degraded == ()
    assert topo.gpus[0].compute_capability == (8, 9)


# -- degrading field by field --------------------------------------------------------------


class MemoryQueryFailsOnGpu1(RecordedNvml):
    def memory_total_bytes(self, device: int) -> int:
        if device == 1:
            raise NvmlQueryError("Unknown", "simulated")
        return super().memory_total_bytes(device)


def test_one_failing_query_degrades_that_field_to_none_and_the_probe_succeeds() -> None:
    topo = probe(MemoryQueryFailsOnGpu1(load("h200_nv18x2.json")))
    assert topo.gpus[1].memory_total_bytes is None
    assert topo.gpus[0].memory_total_bytes == 143771 * 2**20
    assert topo.gpus[1].name == "NVIDIA H200"
    assert topo.fingerprint == "h200.nvl18x2.node1"


def test_remote_bus_id_unreadable_on_one_side_keeps_the_direct_pair() -> None:
    data = load("direct_nv18_pair.json")
    for link in data["devices"][1]["nvlinks"][:18]:
        link["remote_pci_bus_id"] = {"error": "Unknown"}
    topo = probe_fixture(data)
    assert topo.islands[0].direct_pairs == (NvlinkPair(a=0, b=1, links=18, speed_mbps=26562),)
    assert topo.fingerprint == "h200.nvl18x2.node1"


def test_link_state_unknown_error_is_present_but_neither_active_nor_down() -> None:
    data = load("h200_nv18x2.json")
    data["devices"][0]["nvlinks"][0] = {"state": {"error": "Unknown"}}
    gpu = probe_fixture(data).gpus[0]
    assert (len(gpu.links), gpu.links[0].active) == (18, None)
    assert (len(gpu.active_links), gpu.inactive_links) == (17, [])


# -- no NVML -------------------------------------------------------------------------------


def test_nvml_init_failure_gives_the_cpu_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    topo = probe(hostname="login-01")
    assert topo.fingerprint == "cpu-x86_64.node1"
    assert (topo.gpus, topo.islands, topo.hostname) == ((), (), "login-01")


def test_missing_pynvml_gives_the_cpu_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert probe().fingerprint == "cpu-aarch64.node1"


def test_recorded_init_error_gives_the_cpu_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    data = load("l40s_pcie4.json")
    data["init"] = {"error": "LibraryNotFound"}
    assert probe_fixture(data).fingerprint == "cpu-x86_64.node1"


def test_importing_the_probe_loads_neither_pynvml_nor_rich() -> None:
    code = (
        "import sys, a2a_tune.tuner.probe, a2a_tune.tuner.nvml;"
        "print(sorted(m for m in ('pynvml', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- RealNvml over a patched pynvml --------------------------------------------------------


@pytest.fixture
def one_h200_pynvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    """pynvml answering like one H200 whose link 0 is up, link 1 down, links >= 2 absent."""
    import pynvml

    def fail(code: int) -> Any:
        def raiser(*args: Any) -> Any:
            raise pynvml.NVMLError(code)

        return raiser

    def fabric(handle: Any, ref: Any) -> int:
        # pynvml hands its argument to C unchanged: only a reference is a valid pointer.
        # Passing the struct itself segfaulted on a real H200 (driver 580.159.04).
        assert type(ref).__name__ == "CArgObject", "fabric info struct must be passed by reference"
        info = ref._obj
        info.clusterUuid[:] = list(range(1, 17))
        info.cliqueId = 32766
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        info.status = 0
        return 0

    def nvlink_state(handle: Any, link: int) -> int:
        if link >= 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link == 0 else 0

    def field_values(handle: Any, fields: list[Any]) -> list[Any]:
        (field,) = fields
        ok = field == (pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, 0)
        return [
            SimpleNamespace(
                nvmlReturn=0 if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                value=SimpleNamespace(uiVal=26562 if ok else 0),
            )
        ]

    answers = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda index: ("handle", index),
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=143771 * 2**20, used=5),
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=b"00000000:1B:00.0"),
        "nvmlDeviceGetUUID": fail(pynvml.NVML_ERROR_UNKNOWN),
        "nvmlDeviceGetGpuFabricInfoV": fabric,
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkVersion": lambda h, link: pynvml.NVML_NVLINK_VERSION_4_0,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: SimpleNamespace(busId=b"00000000:43:00.0"),
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
        "nvmlDeviceGetFieldValues": field_values,
    }
    for name, answer in answers.items():
        monkeypatch.setattr(pynvml, name, answer)
    return pynvml


def test_real_nvml_turns_pynvml_answers_into_recorded_values(one_h200_pynvml: Any) -> None:
    raw = record(RealNvml(), max_links=3)
    device = raw["devices"][0]
    assert (raw["driver_version"], raw["device_count"]) == ("580.159.04", 1)
    assert device["uuid"] == {"error": "Unknown"}
    assert device["compute_capability"] == [9, 0]
    assert device["fabric_info"] == {
        "cluster_uuid": "01020304-0506-0708-090a-0b0c0d0e0f10",
        "clique_id": 32766,
        "state": "completed",
        "status": "Success",
    }
    assert device["nvlinks"] == [
        {
            "state": True,
            "version": 6,
            "remote_pci_bus_id": "00000000:43:00.0",
            "remote_device_type": "gpu",
            "speed_mbps": 26562,
        },
        {
            "state": False,
            "version": 6,
            "remote_pci_bus_id": "00000000:43:00.0",
            "remote_device_type": "gpu",
            "speed_mbps": None,  # no speed field answers for link 1: degrade, don't fail
        },
        {"state": {"error": "InvalidArgument"}},
    ]


def test_real_nvml_probe_survives_a_failing_uuid_query(one_h200_pynvml: Any) -> None:
    topo = probe(RealNvml(), hostname="h200-bench-01")
    assert topo.gpus[0].uuid is None
    assert topo.gpus[0].pci_bus_id == "00000000:1B:00.0"
    assert topo.gpus[0].active_links == [0]


# -- facts hash, serialisation, recording ---------------------------------------------------


def test_facts_hash_ignores_hostnames_uuids_and_driver_version() -> None:
    data = load("h200_nv18x2.json")
    other = copy.deepcopy(data)
    other["hostname"] = "somewhere-else"
    other["driver_version"] = "999.1"
    for device in other["devices"]:
        device["uuid"] = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"
    assert probe_fixture(other).facts_hash == probe_fixture(data).facts_hash
    assert probe_fixture(data, hostname="x").facts_hash == probe_fixture(data).facts_hash
    assert len(probe_fixture(data).facts_hash) == 16


def test_facts_hash_changes_when_a_link_goes_down() -> None:
    healthy = load("h200_nv18x2.json")
    broken = copy.deepcopy(healthy)
    broken["devices"][0]["nvlinks"][5]["state"] = False
    topo = probe_fixture(broken)
    assert topo.facts_hash != probe_fixture(healthy).facts_hash
    assert topo.fingerprint == "h200.nvl18x2-degraded.node1"
    assert topo.degraded == (DegradedGpu(gpu=0, active_links=17, expected_links=18, down_links=(5,)),)


@pytest.mark.parametrize(
    "make",
    [
        lambda: probe_fixture("h200_nv18x2.json"),
        lambda: probe_fixture("h100_degraded.json"),
        lambda: probe_fixture("l40s_pcie4.json"),
        gb200_cluster,
        lambda: probe(RecordedNvml({**load("l40s_pcie4.json"), "init": {"error": "Unknown"}})),
    ],
    ids=["h200", "h100-degraded", "l40s", "gb200-cluster", "cpu"],
)
def test_to_dict_from_dict_round_trips(make: Any) -> None:
    topo = make()
    data = json.loads(json.dumps(topo.to_dict()))
    assert (data["fingerprint"], data["facts_hash"]) == (topo.fingerprint, topo.facts_hash)
    assert data["node_count"] == topo.node_count
    assert Topology.from_dict(data) == topo


@pytest.mark.parametrize(
    "name", ["h200_nv18x2.json", "h100_hgx8.json", "l40s_pcie4.json", "gb200_nvl72_slice/node2.json"]
)
def test_recording_a_recorded_source_reproduces_the_fixture(name: str) -> None:
    data = load(name)
    expected = {key: value for key, value in data.items() if not key.startswith("_")}
    assert record(RecordedNvml(data)) == expected


def test_recorded_source_without_an_answer_says_not_recorded() -> None:
    data = load("h200_nv18x2.json")
    del data["devices"][0]["name"]
    with pytest.raises(NvmlQueryError) as caught:
        RecordedNvml(data).name(0)
    assert caught.value.code_name == "NotRecorded"
    assert probe_fixture(data).gpus[0].sku == "unknown"


# -- naming and rendering ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml_name", "slug"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4"),
        (None, "unknown"),
    ],
)
def test_sku_slug_of_nvml_names(nvml_name: str | None, slug: str) -> None:
    assert sku_slug(nvml_name) == slug


def test_render_summary_shows_the_fingerprint_and_the_island_line() -> None:
    text = rendered(probe_fixture("direct_nv18_pair.json"))
    assert "h200.nvl18x2.node1" in text
    assert "GPU0<->GPU1: 18 links x 26.562 GB/s = 478 GB/s" in text
    assert "00000000:00:06.0" in text
    switched = rendered(probe_fixture("h200_nv18x2.json"))
    assert "GPU0,GPU1 via NVSwitch: 18 links/GPU x 26.562 GB/s = 478 GB/s per GPU" in switched


def test_render_summary_shows_down_links_and_bus_ids_verbatim() -> None:
    text = rendered(probe_fixture("h100_degraded.json"))
    assert "h100-sxm.nvl18x8-degraded.node1" in text
    assert "GPU0-7 via NVSwitch: 18 links/GPU x 26.562 GB/s = 478 GB/s per GPU" in text
    assert "GPU3: 14/18 links active; down: 4, 5, 6, 7" in text
    assert "00000000:AB:00.0" in text  # rich would turn ":AB:" into an emoji in markup


def test_render_summary_of_the_gb200_cluster_names_the_domain() -> None:
    text = rendered(gb200_cluster())
    assert "gb200.mnnvl18x16.nodes4" in text
    assert f"cluster {GB200_CLUSTER} clique 32766: 16 GPUs on 4 node(s)" in text
    assert "GPU0-15 via NVSwitch over 4 nodes: 18 links/GPU x 53.125 GB/s = 956 GB/s per GPU" in text


def test_render_summary_lists_pcie_only_pairs() -> None:
    text = rendered(probe_fixture("l40s_pcie4.json"))
    assert "GPU0-GPU1, GPU0-GPU2, GPU0-GPU3, GPU1-GPU2, GPU1-GPU3, GPU2-GPU3" in text


# -- the live probe runs in a child process -------------------------------------------------


def test_live_probe_without_nvml_is_cpu_only_and_silent(caplog: pytest.LogCaptureFixture) -> None:
    topo = probe()  # this test machine has no NVIDIA driver
    assert topo.fingerprint.startswith("cpu-") and topo.gpus == ()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_crashing_nvml_child_gives_cpu_only_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import a2a_tune.tuner.nvml as nvml_mod

    crashed = SimpleNamespace(returncode=-11, stdout="", stderr="Fatal Python error: Segmentation fault")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: crashed)
    with pytest.raises(NvmlQueryError, match="ProbeCrashed: NVML probe process exited with code -11"):
        nvml_mod.record_live()
    topo = probe()
    assert topo.fingerprint.startswith("cpu-")
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "NVML probe failed (ProbeCrashed" in warning.getMessage()


def test_live_probe_child_answers_in_the_recording_format(monkeypatch: pytest.MonkeyPatch) -> None:

    recording = load("h200_nv18x2.json")
    answered = SimpleNamespace(returncode=0, stdout=json.dumps(recording), stderr="")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: answered)
    assert probe().fingerprint == "h200.nvl18x2.node1"
