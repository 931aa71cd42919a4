"""Opening a node: real NVML, or the simulated node a node file describes.

:func:`open_node` is the one entry point: it starts NVML (installing the simulated NVML first
when asked to simulate), discovers the :class:`~nvplugin.node.model.Topology` and keeps the NVML
session open for health events. Imports stay lazy so short commands start fast.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from nvplugin.nodefile.builtin import builtin_names

__all__ = ["NodeSession", "builtin_names", "capture_node", "load_topology", "open_node"]

if TYPE_CHECKING:
    from nvplugin.node import nvml
    from nvplugin.node.model import Topology
    from nvplugin.sim import fakenvml


class NodeSession:
    """An open node: its topology, the live NVML session, and the simulation if any.
    ``driver_root``: where this process sees the driver's files (the host's driver root as
    mounted, or the simulation's tree; None: not known, the programs' own search applies).

    A context manager; :meth:`close` shuts NVML down and uninstalls the simulation.
    """

    def __init__(
        self,
        scan: nvml.Scan,
        nvml: nvml.Nvml,
        sim: fakenvml.SimulatedNvml | None,
        sysfs_root: str,
        driver_root: str | None = None,
    ) -> None:
        self.scan = scan
        self.topology = scan.topology
        self.nvml = nvml
        self.sim = sim
        self.sysfs_root = sysfs_root
        self.driver_root = driver_root

    def close(self) -> None:
        try:
            self.nvml.close()
        finally:
            if self.sim is not None:
                self.sim.uninstall()

    def __enter__(self) -> NodeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_node(
    simulate: str | None = None, *, sysfs_root: str | None = None, driver_root: str | None = None
) -> NodeSession:
    """Open the node: real NVML and ``sysfs_root`` (default ``/sys``), or a simulated node.

    ``simulate`` is a built-in node name or a node-file path; with it, ``sysfs_root`` (if given)
    is where the simulated sysfs tree is written, else a temporary directory removed on close.
    ``driver_root`` (real NVML only): where the host's driver root is mounted, to load
    ``libnvidia-ml.so.1`` from and read the MIG capability minors under (a simulated node has
    its own, in its generated tree). Raises InputError for a bad node file or unknown built-in,
    NvpluginError when NVML fails.
    """
    from nvplugin.node.nvml import Nvml, Scan

    def discover(root: str, name: str, driver_root: str | None) -> tuple[Nvml, Scan]:
        session = Nvml(root, driver_root)
        try:
            return session, session.scan(name)
        except BaseException:
            session.close()
            raise

    if simulate is None:
        root = sysfs_root or "/sys"
        session, scan = discover(root, platform.node() or "localhost", driver_root)
        return NodeSession(scan, session, None, root, driver_root)

    from nvplugin.nodefile.reader import load_node
    from nvplugin.sim.fakenvml import SimulatedNvml

    spec = load_node(simulate)
    simulation = SimulatedNvml(spec, sysfs_root=sysfs_root).install()
    try:
        session, scan = discover(simulation.sysfs_root, spec.name, simulation.driver_root)
    except BaseException:
        simulation.uninstall()
        raise
    return NodeSession(scan, session, simulation, simulation.sysfs_root, simulation.driver_root)


def load_topology(simulate: str | None = None, *, sysfs_root: str | None = None) -> Topology:
    """Discover the node's topology and close NVML again (for one-shot commands)."""
    with open_node(simulate, sysfs_root=sysfs_root) as node:
        return node.topology


def capture_node(simulate: str | None = None, *, sysfs_root: str | None = None) -> str:
    """The node file of this machine (or of the simulated node ``simulate``), as text."""
    from nvplugin.nodefile.capture import capture, host_memory_mib

    with open_node(simulate, sysfs_root=sysfs_root) as node:
        memory = node.sim.spec.memory_mib if node.sim is not None else host_memory_mib()
        name = node.topology.name
        origin = f"simulated node {simulate}" if simulate is not None else f"host {name}"
        return capture(node.scan, node.sysfs_root, origin, memory)
