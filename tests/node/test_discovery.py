"""Discovery through the real pynvml calls, answered by the simulated NVML and sysfs tree."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from nvplugin.errors import InputError, NvpluginError
from nvplugin.node import nvml as nvml_module
from nvplugin.node.model import Pcie
from nvplugin.node.nvml import Nvml
from nvplugin.node.sysfs import read_cpu_layout, read_numa_distances, read_numa_node
from nvplugin.nodefile.reader import builtin_names, load_node, parse_node
from nvplugin.nodesession import load_topology, open_node
from nvplugin.sim.fakenvml import SimulatedNvml, UnmodelledNvmlCall
from tests.support.nodefiles import UNEVEN_FABRIC

pynvml = nvml_module.bindings()

BUILTINS = builtin_names()

# (node, a, b, PCIe relation, NVLinks, score): the facts each built-in must reproduce.
PAIRS = [
    ("workstation-4gpu", 0, 1, Pcie.PIX, 0, 50),
    ("workstation-4gpu", 2, 3, Pcie.PIX, 0, 50),
    ("workstation-4gpu", 0, 3, Pcie.SYS, 2, 210),
    ("workstation-4gpu", 1, 2, Pcie.SYS, 2, 210),
    ("workstation-4gpu", 0, 2, Pcie.SYS, 0, 10),
    ("workstation-4gpu", 1, 3, Pcie.SYS, 0, 10),
    ("dgx-1", 0, 1, Pcie.PIX, 1, 150),
    ("dgx-1", 0, 3, Pcie.PHB, 2, 230),
    ("dgx-1", 1, 2, Pcie.PHB, 2, 230),
    ("dgx-1", 2, 3, Pcie.PIX, 2, 250),
    ("dgx-1", 6, 7, Pcie.PIX, 2, 250),
    ("dgx-1", 4, 7, Pcie.PHB, 2, 230),
    ("dgx-1", 5, 6, Pcie.PHB, 2, 230),
    ("dgx-1", 0, 4, Pcie.SYS, 2, 210),
    ("dgx-1", 1, 5, Pcie.SYS, 2, 210),
    ("dgx-1", 2, 6, Pcie.SYS, 1, 110),
    ("dgx-1", 0, 5, Pcie.SYS, 0, 10),
    ("dgx-a100", 0, 1, Pcie.PXB, 12, 1240),
    ("dgx-a100", 0, 2, Pcie.SYS, 12, 1210),
    ("dgx-a100", 3, 7, Pcie.SYS, 12, 1210),
    ("dgx-a100-mig", 0, 1, Pcie.PXB, 12, 1240),
    ("dgx-h100", 0, 3, Pcie.NODE, 18, 1820),
    ("dgx-h100", 0, 4, Pcie.SYS, 18, 1810),
    ("dgx-2", 0, 1, Pcie.PIX, 6, 650),
    ("dgx-2", 0, 2, Pcie.PXB, 6, 640),
    ("dgx-2", 0, 4, Pcie.NODE, 6, 620),
    ("dgx-2", 0, 15, Pcie.SYS, 6, 610),
    ("dgx-2", 8, 9, Pcie.PIX, 6, 650),
    ("pcie-8gpu", 0, 1, Pcie.PIX, 0, 50),
    ("pcie-8gpu", 0, 2, Pcie.NODE, 0, 20),
    ("pcie-8gpu", 3, 4, Pcie.SYS, 0, 10),
    ("no-numa", 0, 3, Pcie.PHB, 0, 30),
    ("mixed-a100-t4", 0, 1, Pcie.PIX, 12, 1250),
    ("mixed-a100-t4", 2, 3, Pcie.PIX, 0, 50),
    ("mixed-a100-t4", 1, 2, Pcie.NODE, 0, 20),
    ("mixed-a100-t4", 0, 4, Pcie.SYS, 0, 10),
    ("mixed-a100-t4", 4, 5, Pcie.PIX, 12, 1250),
]

# (node, GPU count, NUMA node of each GPU, NUMA node count, CPUs, CPU list of GPU0's node)
NODES = [
    ("workstation-4gpu", 4, [0, 0, 1, 1], 2, 64, "0-15,32-47"),
    ("dgx-1", 8, [0] * 4 + [1] * 4, 2, 80, "0-19,40-59"),
    ("dgx-a100", 8, [3, 3, 1, 1, 7, 7, 5, 5], 8, 256, "48-63,176-191"),
    ("dgx-a100-mig", 8, [3, 3, 1, 1, 7, 7, 5, 5], 8, 256, "48-63,176-191"),
    ("dgx-h100", 8, [0] * 4 + [1] * 4, 2, 224, "0-55,112-167"),
    ("dgx-2", 16, [0] * 8 + [1] * 8, 2, 96, "0-23,48-71"),
    ("pcie-8gpu", 8, [0] * 4 + [1] * 4, 2, 128, "0-31,64-95"),
    ("no-numa", 4, [None] * 4, 1, 48, None),
    ("mixed-a100-t4", 8, [0] * 4 + [1] * 4, 2, 128, "0-31,64-95"),
]


@pytest.fixture(scope="module")
def discovered() -> dict[str, object]:
    return {name: load_topology(name) for name in BUILTINS}


def test_every_builtin_is_covered() -> None:
    assert sorted(BUILTINS) == sorted(n[0] for n in NODES)
    assert set(BUILTINS) == {p[0] for p in PAIRS}


@pytest.mark.parametrize("name", BUILTINS)
def test_discovery_finds_what_the_node_file_says(name: str) -> None:
    with open_node(name) as node:
        assert node.topology == load_node(name).topology()
        assert node.topology.name == name
        assert node.sim is not None and node.sim.calls["nvmlInit"] == 1


@pytest.mark.parametrize(("name", "a", "b", "pcie", "nvlinks", "score"), PAIRS)
def test_pair_relations_and_scores(
    discovered: dict[str, object], name: str, a: int, b: int, pcie: Pcie, nvlinks: int, score: int
) -> None:
    from nvplugin.node.model import Topology

    topo = discovered[name]
    assert isinstance(topo, Topology)
    link = topo.link(a, b)
    assert (link.pcie, link.nvlinks, topo.score(a, b)) == (pcie, nvlinks, score)
    assert topo.link(b, a) == link


@pytest.mark.parametrize(("name", "count", "numa", "nodes", "cpus", "cpulist"), NODES)
def test_gpus_numa_and_cpus(
    discovered: dict[str, object],
    name: str,
    count: int,
    numa: list[int | None],
    nodes: int,
    cpus: int,
    cpulist: str | None,
) -> None:
    from nvplugin.node.model import Topology, format_cpu_list

    topo = discovered[name]
    assert isinstance(topo, Topology)
    assert len(topo) == count
    assert [g.numa_node for g in topo.gpus] == numa
    assert [g.index for g in topo.gpus] == list(range(count))
    assert [g.minor for g in topo.gpus] == list(range(count))
    assert len({g.uuid for g in topo.gpus}) == count
    assert len(topo.numa_distances) == nodes
    assert len(topo.cpus.cpus) == cpus
    if cpulist is not None:
        assert format_cpu_list(topo.cpus.on_node(topo.gpus[0].numa_node or 0)) == cpulist


def test_dgx1_worked_example_partitions_tie_at_920(discovered: dict[str, object]) -> None:
    from nvplugin.node.model import Topology

    topo = discovered["dgx-1"]
    assert isinstance(topo, Topology)

    def partition(groups: list[list[int]]) -> int:
        return sum(topo.group_score(g) for g in groups)

    assert partition([[0, 3], [1, 2], [4, 7], [5, 6]]) == 920
    assert partition([[0, 4], [1, 5], [2, 3], [6, 7]]) == 920


def test_nvswitch_links_are_reported_as_switch_links_and_recovered() -> None:
    spec = load_node("dgx-a100")
    with SimulatedNvml(spec) as sim:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        kinds = [pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, k) for k in range(12)]
        assert kinds == [pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH] * 12
        gpu_buses = {g.pci_bus_id for g in spec.gpus}
        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0).busId
        assert remote not in gpu_buses
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(handle, 12)
        pynvml.nvmlShutdown()
        topo = Nvml(sim.sysfs_root).discover("x")
    assert all(link.nvlinks == 12 for _, _, link in topo.pairs())


def test_direct_links_report_the_peer_gpu() -> None:
    spec = load_node("dgx-1")
    with SimulatedNvml(spec):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        peers = []
        for k in range(6):
            assert pynvml.nvmlDeviceGetNvLinkState(handle, k) == pynvml.NVML_FEATURE_ENABLED
            assert (
                pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, k)
                == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
            )
            peers.append(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, k).busId)
        pynvml.nvmlShutdown()
    bus = [g.pci_bus_id for g in spec.gpus]
    assert sorted(peers) == sorted([bus[1], bus[2], bus[3], bus[3], bus[4], bus[4]])


def test_fabric_links_count_min_of_each_gpu() -> None:
    spec = parse_node(UNEVEN_FABRIC, "test")
    with SimulatedNvml(spec) as sim:
        topo = Nvml(sim.sysfs_root).discover("uneven-fabric")
    assert topo.link(0, 1).nvlinks == 6 and topo.link(0, 1).pcie == Pcie.NODE
    assert topo.link(1, 2).nvlinks == 2
    assert topo.link(0, 2).nvlinks == 0
    assert topo == spec.topology()


@pytest.mark.parametrize("error", ["NOT_SUPPORTED", "INVALID_ARGUMENT"])
def test_per_link_errors_are_skipped_not_fatal(error: str) -> None:
    """A link whose state or remote PCI info NVML refuses is skipped; a link whose remote type
    NVML refuses counts as a GPU link when its far end is a known GPU (older drivers)."""
    spec = load_node("dgx-1")
    code = getattr(pynvml, f"NVML_ERROR_{error}")
    with SimulatedNvml(spec) as sim:
        state, remote_type = (
            pynvml.nvmlDeviceGetNvLinkState,
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType,
        )
        first = pynvml.nvmlDeviceGetHandleByIndex

        def refuse_link_0_of_gpu_0(handle: object, link: int) -> int:
            if link == 0 and nvml_module._address(handle) == nvml_module._address(gpu0):
                raise pynvml.NVMLError(code)
            result: int = state(handle, link)
            return result

        def refuse_every_type(handle: object, link: int) -> int:
            raise pynvml.NVMLError(code)

        pynvml.nvmlInit()
        gpu0 = first(0)
        pynvml.nvmlShutdown()
        pynvml.nvmlDeviceGetNvLinkState = refuse_link_0_of_gpu_0
        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType = refuse_every_type
        try:
            topo = Nvml(sim.sysfs_root).discover("dgx-1")
        finally:
            pynvml.nvmlDeviceGetNvLinkState = state
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type
    # GPU0's link 0 (to GPU1) is gone from GPU0's side, but GPU1 still sees it: max of the ends.
    assert topo == spec.topology()


def test_pcie_relation_not_supported_falls_back_to_sys() -> None:
    """A VM whose NVML cannot report the common ancestor still runs: every pair SYS, NVLinks
    kept. Any other failure of that call stays fatal, with the pair named."""
    spec = load_node("dgx-1")
    with SimulatedNvml(spec) as sim:
        original = pynvml.nvmlDeviceGetTopologyCommonAncestor

        def refuse(code: int) -> object:
            def call(a: object, b: object) -> int:
                raise pynvml.NVMLError(code)

            return call

        try:
            pynvml.nvmlDeviceGetTopologyCommonAncestor = refuse(pynvml.NVML_ERROR_NOT_SUPPORTED)
            topo = Nvml(sim.sysfs_root).discover("vm")
            pynvml.nvmlDeviceGetTopologyCommonAncestor = refuse(pynvml.NVML_ERROR_UNKNOWN)
            nvml = Nvml(sim.sysfs_root)
            with pytest.raises(NvpluginError, match="PCIe relation of GPU 0 and GPU 1"):
                nvml.discover("vm")
            nvml.close()
        finally:
            pynvml.nvmlDeviceGetTopologyCommonAncestor = original
    expected = spec.topology()
    assert [link.pcie for _, _, link in topo.pairs()] == [Pcie.SYS] * 28
    assert [link.nvlinks for _, _, link in topo.pairs()] == [
        link.nvlinks for _, _, link in expected.pairs()
    ]


def test_sim_counts_calls_and_raises_on_unmodelled_functions() -> None:
    with open_node("workstation-4gpu") as node:
        assert node.sim is not None
        calls = node.sim.calls
        assert calls["nvmlDeviceGetCount"] == 1
        assert calls["nvmlDeviceGetTopologyCommonAncestor"] == 6
        assert set(calls) <= set(nvml_module.CALLED)
        before = sum(calls.values())
        with pytest.raises(UnmodelledNvmlCall, match="nvmlDeviceGetTemperature"):
            pynvml.nvmlDeviceGetTemperature(node.nvml._handle(0), 0)
        with pytest.raises(UnmodelledNvmlCall, match="_nvmlGetFunctionPointer"):
            pynvml._nvmlGetFunctionPointer("nvmlDeviceGetPowerUsage")
        assert sum(calls.values()) == before + 2
        # the topology is a plain value: reading it makes no NVML calls
        node.topology.group_score([0, 1, 2, 3])
        assert sum(calls.values()) == before + 2


def test_uninstall_restores_pynvml() -> None:
    original = pynvml.nvmlInit, pynvml.nvmlDeviceGetTemperature, pynvml._nvmlGetFunctionPointer
    with open_node("no-numa") as node:
        root = node.sysfs_root
        assert pynvml.nvmlInit is not original[0]
        assert os.path.isdir(root)
    assert (
        pynvml.nvmlInit,
        pynvml.nvmlDeviceGetTemperature,
        pynvml._nvmlGetFunctionPointer,
    ) == original
    assert not os.path.exists(root)


def test_only_one_simulation_at_a_time() -> None:
    spec = load_node("no-numa")
    with SimulatedNvml(spec), pytest.raises(RuntimeError, match="already installed"):
        SimulatedNvml(spec).install()


def test_sim_answers_with_real_pynvml_structures() -> None:
    spec = load_node("dgx-h100")
    with SimulatedNvml(spec):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        assert isinstance(handle, pynvml.c_nvmlDevice_t)
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        assert isinstance(pci, pynvml.nvmlPciInfo_t)
        assert (pci.domain, pci.bus, pci.busId) == (0, 0x5D, "00000000:5D:00.0")
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        assert isinstance(memory, pynvml.c_nvmlMemory_t) and memory.total == 81559 << 20
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, handle_of(4))
        assert level == pynvml.NVML_TOPOLOGY_SYSTEM
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(8)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(handle, pynvml.NVML_NVLINK_MAX_LINKS)
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()


def handle_of(index: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("LIBRARY_NOT_FOUND", r"libnvidia-ml\.so\.1 not found: is the NVIDIA driver installed"),
        ("DRIVER_NOT_LOADED", "driver is not loaded"),
        ("LIB_RM_VERSION_MISMATCH", "different versions"),
        ("NO_PERMISSION", "no permission"),
        ("UNKNOWN", "NVML failed to initialise NVML"),
    ],
)
def test_nvml_init_failures_become_messages(error: str, message: str) -> None:
    with SimulatedNvml(load_node("no-numa"), init_error=error) as sim:
        with pytest.raises(NvpluginError, match=message) as caught:
            Nvml(sim.sysfs_root)
        assert not isinstance(caught.value, InputError)


def test_gpu_lost_at_discovery_is_a_clear_error() -> None:
    text = """
version: v1
name: lost
gpus: [{name: A}, {name: B}]
links: |2
        GPU0  GPU1
  GPU0  X     PIX
  GPU1  PIX   X
events:
  - {after_s: 0, gpu: 1, lost: true}
"""
    with SimulatedNvml(parse_node(text, "t")) as sim:
        nvml = Nvml(sim.sysfs_root)
        with pytest.raises(NvpluginError, match=r"GPU 1.*the GPU is lost.*reset the GPU"):
            nvml.discover("lost")
        nvml.close()


def test_open_node_rejects_unknown_builtin_with_names() -> None:
    with pytest.raises(InputError, match="built-in nodes: dgx-1, dgx-2"):
        open_node("dgx-3")


def test_open_node_without_driver_reports_missing_library() -> None:
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvpluginError, match=r"libnvidia-ml\.so\.1 not found"):
        open_node(sysfs_root="/sys")


# -- sysfs readers, on hand-made trees ----------------------------------------------------------
def _tree(files: dict[str, str]) -> str:
    root = tempfile.mkdtemp(prefix="nvplugin-test-sysfs-")
    for path, text in files.items():
        target = Path(root, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def test_numa_node_reads_sysfs_with_4_digit_lower_case_domain() -> None:
    root = _tree(
        {
            "bus/pci/devices/0000:bd:00.0/numa_node": "5\n",
            "bus/pci/devices/0001:07:00.0/numa_node": "-1\n",
            "bus/pci/devices/0000:08:00.0/numa_node": "garbage\n",
        }
    )
    assert read_numa_node(root, "00000000:BD:00.0") == 5
    assert read_numa_node(root, "00000001:07:00.0") is None
    assert read_numa_node(root, "00000000:08:00.0") is None
    assert read_numa_node(root, "00000000:09:00.0") is None  # no such device dir


def test_without_numa_directories_one_node_at_distance_10() -> None:
    root = _tree({"devices/system/cpu/cpu0/topology/core_id": "0\n"})
    assert read_numa_distances(root) == ((10,),)


def test_numa_distances_and_cpu_layout_from_sysfs() -> None:
    root = _tree(
        {
            "devices/system/node/node0/distance": "10 21\n",
            "devices/system/node/node1/distance": "21 10\n",
            "devices/system/node/node0/cpulist": "0-1\n",
            "devices/system/node/node1/cpulist": "2-3\n",
            **{
                f"devices/system/cpu/cpu{c}/topology/{f}": f"{v}\n"
                for c in range(4)
                for f, v in (("physical_package_id", c // 2), ("core_id", c % 2))
            },
            "devices/system/cpu/cpu4/online": "0\n",  # offline: no topology
        }
    )
    assert read_numa_distances(root) == ((10, 21), (21, 10))
    layout = read_cpu_layout(root)
    assert [(c.id, c.socket, c.core, c.numa_node) for c in layout.cpus] == [
        (0, 0, 0, 0),
        (1, 0, 1, 0),
        (2, 1, 0, 1),
        (3, 1, 1, 1),
    ]


def test_sparse_numa_ids_stay_contiguous() -> None:
    root = _tree(
        {
            "devices/system/node/node0/distance": "10 20\n",
            "devices/system/node/node2/distance": "20 10\n",
        }
    )
    assert read_numa_distances(root) == ((10, 255, 20), (255, 10, 255), (20, 255, 10))


def test_simulated_node_without_numa_dirs_discovers_one_node() -> None:
    spec = load_node("workstation-4gpu")
    with SimulatedNvml(spec, sysfs_numa=False) as sim:
        topo = Nvml(sim.sysfs_root).discover("x")
    assert topo.numa_distances == ((10,),)
    # GPUs name nodes sysfs does not list: treated as unknown rather than failing
    assert [g.numa_node for g in topo.gpus] == [0, 0, None, None]
    assert {c.numa_node for c in topo.cpus.cpus} == {0}
