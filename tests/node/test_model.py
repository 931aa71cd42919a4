import pytest

from nvplugin.node.model import CpuLayout, Gpu, Link, Pcie, Topology


def _gpu(i: int, numa: int | None = 0) -> Gpu:
    return Gpu(i, f"GPU-{i}", "Test GPU", 1024, f"00000000:{i + 1:02x}:00.0", i, numa)


def test_pair_score_weights() -> None:
    assert [p.weight for p in Pcie] == [10, 20, 30, 40, 50, 60]
    assert Link(Pcie.SYS, 2).score == 210
    assert Link(Pcie.NODE, 18).score == 1820
    assert Link(Pcie.PIX, 2).cell == "NV2+PIX"
    assert Link(Pcie.PIX, 2).smi_cell == "NV2"
    assert Link(Pcie.PHB).cell == "PHB"


def test_link_rejects_too_many_nvlinks() -> None:
    with pytest.raises(ValueError, match="NVLink count 19"):
        Link(Pcie.SYS, 19)


def test_topology_scores_and_groups() -> None:
    a, b = Link(Pcie.PIX), Link(Pcie.SYS, 2)
    c = Link(Pcie.SYS)
    links = ((None, a, b), (a, None, c), (b, c, None))
    topo = Topology(
        "t", tuple(_gpu(i) for i in range(3)), links, ((10,),), CpuLayout.build(1, 4, 1, 1)
    )
    assert topo.score(0, 2) == 210
    assert topo.group_score([0, 1, 2]) == 50 + 210 + 10
    assert [(i, j) for i, j, _ in topo.pairs()] == [(0, 1), (0, 2), (1, 2)]
    assert topo.gpu_by_uuid("GPU-1") == topo.gpus[1]


def test_topology_rejects_asymmetric_links() -> None:
    a, b = Link(Pcie.PIX), Link(Pcie.SYS)
    with pytest.raises(ValueError, match="not symmetric at GPU0/GPU1"):
        Topology("t", (_gpu(0), _gpu(1)), ((None, a), (b, None)), ((10,),), CpuLayout(()))


def test_cpu_layout_linux_numbering() -> None:
    layout = CpuLayout.build(sockets=2, cores_per_socket=4, threads_per_core=2, numa_nodes=4)
    assert len(layout.cpus) == 16
    assert layout.on_node(0) == (0, 1, 8, 9)
    assert layout.on_node(3) == (6, 7, 14, 15)
    assert layout.sockets == 2 and layout.threads_per_core == 2
    shared = CpuLayout.build(sockets=2, cores_per_socket=2, threads_per_core=1, numa_nodes=1)
    assert shared.on_node(0) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        CpuLayout.build(sockets=2, cores_per_socket=3, threads_per_core=1, numa_nodes=4)
