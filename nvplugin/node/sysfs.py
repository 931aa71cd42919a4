"""What discovery reads from sysfs rather than NVML: each GPU's NUMA node and PCI class, the NUMA
distances, the CPU layout, and the machine type (DMI). Everything is read under a root directory
(``/sys`` on a real node, the simulated node's generated tree under ``--simulate``), the same way
in both cases; a file that cannot be read gives "unknown", never an error.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from nvplugin.node.model import Cpu, CpuLayout, parse_cpu_list

_PCI_RE = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$")

PCI_CLASS_FILE = "class"
"""A PCI function's class in its sysfs directory (``0x030200``)."""
DMI_PRODUCT_NAME = "class/dmi/id/product_name"
"""The machine's product name (DMI/SMBIOS), relative to the sysfs root."""
MAX_MACHINE_TYPE = 256
"""At most this many bytes of a machine-type file are read (one line is expected)."""


def pci_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id in any width, or None if malformed."""
    match = _PCI_RE.match(bus_id.strip())
    if not match:
        return None
    domain, bus, dev, fn = (int(part, 16) for part in match.groups())
    return domain, bus, dev, fn


def sysfs_pci_name(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as sysfs names it: ``0000:07:00.0`` (4-digit, lower case)."""
    key = pci_key(bus_id)
    if key is None:
        return bus_id.lower()
    domain, bus, dev, fn = key
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def read_text(path: Path) -> str | None:
    """A small kernel-provided file's text (sysfs, procfs); None when it cannot be read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def read_numa_node(sysfs_root: str, bus_id: str) -> int | None:
    """NUMA node of a PCI device from sysfs: None when negative (-1) or unreadable."""
    path = pci_device_dir(sysfs_root, bus_id) / "numa_node"
    text = read_text(path)
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _node_ids(sysfs_root: str) -> list[int]:
    try:
        entries = os.listdir(Path(sysfs_root, "devices/system/node"))
    except OSError:
        return []
    return sorted(int(e[4:]) for e in entries if e.startswith("node") and e[4:].isdigit())


def read_numa_distances(sysfs_root: str) -> tuple[tuple[int, ...], ...]:
    """SLIT distances between NUMA nodes 0..k-1 from ``devices/system/node/node*/distance``.

    Without node directories (a kernel without NUMA), one node 0 at distance 10. Node ids
    missing from a sparse numbering get rows of 255 (unreachable) so ids stay 0..k-1.
    """
    ids = _node_ids(sysfs_root)
    if not ids:
        return ((10,),)
    count = ids[-1] + 1
    rows = [[10 if a == b else 255 for b in range(count)] for a in range(count)]
    for a in ids:
        text = read_text(Path(sysfs_root, f"devices/system/node/node{a}/distance")) or ""
        try:
            values = [int(v) for v in text.split()]
        except ValueError:
            values = []
        for b, value in zip(ids, values, strict=False):
            rows[a][b] = value
    return tuple(tuple(row) for row in rows)


def read_cpu_layout(sysfs_root: str) -> CpuLayout:
    """Logical CPUs with socket, core and NUMA node from sysfs (``devices/system/cpu``).

    A CPU in no node's cpulist is on node 0. Without readable CPU topology (not Linux): one
    socket of ``os.cpu_count()`` single-threaded cores on node 0.
    """
    node_of: dict[int, int] = {}
    for node in _node_ids(sysfs_root):
        text = read_text(Path(sysfs_root, f"devices/system/node/node{node}/cpulist")) or ""
        try:
            for cpu in parse_cpu_list(text):
                node_of[cpu] = node
        except ValueError:
            continue
    base = Path(sysfs_root, "devices/system/cpu")
    try:
        entries = os.listdir(base)
    except OSError:
        entries = []
    cpus = []
    for entry in entries:
        if not (entry.startswith("cpu") and entry[3:].isdigit()):
            continue
        cpu_id = int(entry[3:])
        socket = read_text(base / entry / "topology/physical_package_id")
        core = read_text(base / entry / "topology/core_id")
        if socket is None or core is None:
            continue  # offline CPU: no topology
        try:
            cpus.append(Cpu(cpu_id, int(socket), int(core), node_of.get(cpu_id, 0)))
        except ValueError:
            continue
    if not cpus:
        return CpuLayout.build(1, os.cpu_count() or 1, 1, 1)
    return CpuLayout(tuple(sorted(cpus, key=lambda c: c.id)))


def pci_device_dir(sysfs_root: str, bus_id: str) -> Path:
    """The sysfs directory of a PCI function."""
    return Path(sysfs_root, "bus/pci/devices", sysfs_pci_name(bus_id))


def read_pci_class(sysfs_root: str, bus_id: str) -> int | None:
    """The PCI class of a function (``0x030200`` -> 0x030200); None when unreadable."""
    text = read_text(pci_device_dir(sysfs_root, bus_id) / PCI_CLASS_FILE)
    try:
        return int(text.strip(), 16) if text is not None else None
    except ValueError:
        return None


def read_machine_type(path: str) -> str | None:
    """The first line of a machine-type file (GPU Feature Discovery's ``machineTypeFile``, by
    default the DMI product name), stripped; None when it cannot be read or is empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block discovery
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_MACHINE_TYPE)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").strip().splitlines()
    return text[0].strip() if text and text[0].strip() else None
