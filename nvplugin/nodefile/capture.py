"""``nvplugin node capture``: the node file of this machine, read through NVML and sysfs.

Everything a node file can say is read, none of it guessed: the driver's version and CUDA version,
the machine's DMI product name, each GPU's model, UUID, memory, bus id, NUMA node, compute
capability and PCI class (written where they differ from the model's), the PCIe relation of every
pair -- also where NVLink joins them, which ``nvidia-smi topo -m`` hides -- the NVLinks of every
pair and how many of each GPU's go into an NVSwitch fabric, the NUMA distances and the CPUs, and
each MIG-enabled GPU's MIG devices as ``mig: [profiles]`` in MIG index order. Discovery does the
reading (the same code the plugin runs, :meth:`nvplugin.node.nvml.Nvml.scan`); this module only
writes it down, so a capture of a simulated node gives back its node file's content.

Not captured: scripted health events (a node file's ``events``). A node file's MIG layout is one
compute instance spanning each GPU instance, placed as :func:`nvplugin.node.mig.lay_out` places
them: a smaller compute instance is written as its GPU instance, and a layout the profile tables
cannot hold (a model not tabled, a profile variant such as ``+gfx``) is left out with a comment on
that GPU, never a failed capture.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from nvplugin.errors import InputError, NvpluginError, shortened
from nvplugin.node.gpumodels import default_compute_capability, default_pci_class
from nvplugin.node.mig import MigLayoutError, lay_out, mig_model
from nvplugin.node.model import Driver, Gpu, Topology
from nvplugin.node.sysfs import DMI_PRODUCT_NAME, read_machine_type
from nvplugin.nodefile.cpus import describe_layout
from nvplugin.nodefile.reader import parse_node
from nvplugin.nodefile.writer import GpuDraft, NodeDraft, render

if TYPE_CHECKING:
    from nvplugin.node.nvml import Scan


def capture(scan: Scan, sysfs_root: str, origin: str, memory_mib: int | None) -> str:
    """The node file of the node ``scan`` discovered (:func:`nvplugin.nodesession.capture_node`
    opens it), as text; ``memory_mib``: the host memory (:func:`host_memory_mib` on a real
    node), None when not known."""
    machine = read_machine_type(os.path.join(sysfs_root, DMI_PRODUCT_NAME))
    return write_capture(
        scan.topology, scan.nvswitch_links, origin, scan.driver, machine, memory_mib
    )


def host_memory_mib(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's memory in MiB, as the kubelet reports its capacity (``MemTotal``); None when
    it cannot be read."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as file:
            text = file.read(1 << 16)
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s+(\d{1,15}) kB$", text, re.M)
    return int(match.group(1)) // 1024 if match and int(match.group(1)) >= 1024 else None


def write_capture(
    topology: Topology,
    nvswitch_links: tuple[int, ...],
    origin: str,
    driver: Driver | None = None,
    machine: str | None = None,
    memory_mib: int | None = None,
) -> str:
    """Node-file text for a discovered ``topology`` (and the node's driver, DMI product name and
    memory, when known); checked by reading it back."""
    form, cpu_note = describe_layout(topology.cpus, len(topology.numa_distances))
    gpus = []
    for gpu in topology.gpus:
        fields: list[tuple[str, object]] = [
            ("name", gpu.name),
            ("uuid", gpu.uuid),
            ("memory_mib", gpu.memory_mib),
            ("pci_bus_id", gpu.pci_bus_id),
            ("numa_node", gpu.numa_node),
        ]
        if nvswitch_links[gpu.index]:
            fields.append(("nvswitch_links", nvswitch_links[gpu.index]))
        profiles, note = mig_profiles(gpu)
        if profiles is not None:
            fields.append(("mig", profiles))
        if gpu.compute_capability != default_compute_capability(gpu.name):
            compute = gpu.compute_capability
            fields.append(
                ("compute_capability", None if compute is None else f"{compute[0]}.{compute[1]}")
            )
        if gpu.pci_class is not None and gpu.pci_class != default_pci_class(gpu.name):
            fields.append(("pci_class", f"0x{gpu.pci_class:06x}"))
        gpus.append(GpuDraft(tuple(fields), note))
    cells = tuple(
        tuple("X" if link is None else link.cell for link in row) for row in topology.links
    )
    notes: dict[str, list[str]] = {
        "": [
            f"Captured by `nvplugin node capture` from {origin} through NVML and sysfs. Cells "
            "give each pair's NVLinks and its PCIe relation, which nvidia-smi topo -m hides "
            "under NV<k>; CPU sockets and cores are numbered by their lowest CPU id."
        ]
    }
    if cpu_note:
        notes["cpus"] = [cpu_note]
    if memory_mib is not None:
        notes["memory_mib"] = ["The host's memory (MiB, MemTotal), as the kubelet reports it."]
    draft = NodeDraft(
        topology.name,
        tuple(gpus),
        cells,
        topology.numa_distances,
        form,
        notes,
        memory_mib=memory_mib,
        machine=machine,
        driver=driver,
    )
    text = render(draft)
    try:
        parse_node(text, f"the node file captured from {origin}")
    except InputError as exc:
        raise NvpluginError(f"this node cannot be written as a node file: {exc}") from None
    return text


_COMPUTE_PREFIX = re.compile(r"^\d+c\.")


def mig_profiles(gpu: Gpu) -> tuple[tuple[str, ...] | None, str | None]:
    """A GPU's ``mig`` entry (None: MIG off, or not expressible) and a note for its line."""
    if not gpu.mig_enabled:
        return None, None
    profiles = tuple(_COMPUTE_PREFIX.sub("", device.profile) for device in gpu.mig_devices)
    model = mig_model(gpu.name)
    problem = None
    if model is None:
        problem = "no MIG profile table for this model"
    elif model.memory_mib != gpu.memory_mib:
        problem = f"the profile table's {model.label} has {model.memory_mib} MiB"
    else:
        try:
            lay_out(model, profiles)
        except MigLayoutError as exc:
            problem = str(exc)
    if problem is not None:
        shown = ", ".join(device.profile for device in gpu.mig_devices) or "none"
        return None, f"MIG on ({shortened(shown, 120)}), not written: {shortened(problem, 160)}"
    if any(_COMPUTE_PREFIX.match(device.profile) for device in gpu.mig_devices):
        return profiles, "compute instances smaller than their GPU instance written as the latter"
    return profiles, None
