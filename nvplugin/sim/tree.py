"""The tree of files a simulated node presents besides NVML: the sysfs a GPU node has (each GPU's
PCI function with its NUMA node and class, NUMA nodes and their distances, the CPUs' topology, the
DMI product name) and the driver's MIG capability minors, written from a node file under one root
directory, which discovery then reads exactly as it reads ``/sys`` (:mod:`nvplugin.node.sysfs`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from nvplugin.node import mig
from nvplugin.node.model import format_cpu_list
from nvplugin.node.sysfs import DMI_PRODUCT_NAME, PCI_CLASS_FILE, pci_device_dir
from nvplugin.nodefile.spec import NodeSpec

SYSFS_PREFIX = "nvplugin-sysfs-"
"""Generated sysfs trees are named ``nvplugin-sysfs-<owner pid>-<random>``."""


def remove_stale_sysfs_trees(parent: str) -> list[str]:
    """Remove the generated sysfs trees in ``parent`` whose owner process is gone; their names.

    A simulation removes its tree on uninstall, but a SIGKILLed ``nvplugin serve`` cannot: each
    kill would leave one tree behind in /dev/shm (memory, until reboot). So every new simulation
    first sweeps the trees of dead owners. A tree whose owner pid is alive (or whose name carries
    no pid, from an older release) is left alone: it may be in use.
    """
    removed = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    for name in names:
        owner = name.removeprefix(SYSFS_PREFIX).split("-", 1)[0]
        if not name.startswith(SYSFS_PREFIX) or not owner.isdigit() or _alive(int(owner)):
            continue
        path = os.path.join(parent, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we wrote: keep the tree
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _usable(directory: str) -> bool:
    """Whether a generated tree may live in ``directory``: writable, and programs can run there."""
    try:
        return os.access(directory, os.W_OK) and not os.statvfs(directory).f_flag & os.ST_NOEXEC
    except OSError:
        return False


def make_root() -> Path:
    """A new, empty directory for a simulated node's tree, named for this process. In memory
    where the OS offers it (a many-CPU tree is a thousand small files), but not where
    programs cannot run (a container's /dev/shm is noexec): the tree is the driver root too, with
    the MPS control daemon's stand-in in it. The trees of dead owners there are swept first."""
    parent = "/dev/shm" if _usable("/dev/shm") else tempfile.gettempdir()
    remove_stale_sysfs_trees(parent)
    return Path(tempfile.mkdtemp(prefix=f"{SYSFS_PREFIX}{os.getpid()}-", dir=parent))


def write_tree(spec: NodeSpec, root: Path, *, numa: bool = True) -> None:
    """Write ``spec``'s files under ``root``. ``numa=False`` leaves the NUMA node directories
    out (a kernel without NUMA)."""
    for gpu in spec.gpus:
        device = pci_device_dir(str(root), gpu.pci_bus_id)
        device.mkdir(parents=True, exist_ok=True)
        node = -1 if gpu.numa_node is None else gpu.numa_node
        (device / "numa_node").write_text(f"{node}\n")
        (device / PCI_CLASS_FILE).write_text(f"0x{gpu.pci_class:06x}\n")
    layout = spec.cpu_layout
    if numa:
        for node, row in enumerate(spec.numa_distances):
            folder = root / f"devices/system/node/node{node}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "distance").write_text(" ".join(str(d) for d in row) + "\n")
            (folder / "cpulist").write_text(format_cpu_list(layout.on_node(node)) + "\n")
    for cpu in layout.cpus:
        topo = f"{root}/devices/system/cpu/cpu{cpu.id}/topology"
        os.makedirs(topo, exist_ok=True)
        with open(f"{topo}/physical_package_id", "w") as out:
            out.write(f"{cpu.socket}\n")
        with open(f"{topo}/core_id", "w") as out:
            out.write(f"{cpu.core}\n")
    if spec.machine is not None:
        product = root / DMI_PRODUCT_NAME
        product.parent.mkdir(parents=True, exist_ok=True)
        product.write_text(spec.machine + "\n")
    if any(gpu.mig is not None for gpu in spec.gpus):
        minors = root / mig.MIG_MINORS_PATH
        minors.parent.mkdir(parents=True, exist_ok=True)
        minors.write_text(mig.mig_minors_text(max(mig.CAPS_GPUS, len(spec.gpus))))
