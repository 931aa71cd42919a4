"""The generated benchmark nodes are valid node files with the structure they claim."""

from __future__ import annotations

import pytest

from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.methods.classes import twin_classes
from nvplugin.nodefile.reader import parse_node
from tests.support.bignodes import NODES, SERVERS


@pytest.mark.parametrize("name", sorted(NODES))
def test_generated_node_parses_and_has_its_structure(name: str) -> None:
    topology = parse_node(NODES[name](), f"<{name}>").topology()
    classes = twin_classes(topology.scores)
    if name.startswith("pcie-switch-"):
        assert len(classes) == 4 and len(topology) == int(name.rsplit("-", 1)[1])
    elif name.startswith("nvswitch-"):
        assert len(classes) == 2
        assert topology.link(0, len(topology) - 1).cell == "NV18+SYS"
    elif name in SERVERS:
        switches = [size for sizes in SERVERS[name] for size in sizes]
        assert [len(members) for members in classes.members] == switches
        assert len(topology) == sum(switches)
    else:
        assert len(classes) == len(topology) == 20
    # branch up to 32 GPUs (the PCIe servers, and the 4- or 2-class nodes), the budgeted search
    # beyond (as on the node without structure)
    expected = "branch" if name != "mesh-20" and len(topology) <= 32 else "search"
    assert BestEffort(topology).method == expected
