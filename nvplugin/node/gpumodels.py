"""What nvplugin knows of NVIDIA GPU models beyond a node file's name and memory: each model's CUDA
compute capability and the PCI class its function reports, by NVML name.

On a real node NVML answers the compute capability (``nvmlDeviceGetCudaComputeCapability``) and
sysfs the PCI class (``/sys/bus/pci/devices/<bus id>/class``); a simulated GPU takes both from
this table unless its node file gives them (``compute_capability``, ``pci_class``). The PCI
class is what GPU Feature Discovery calls the GPU's mode: a VGA controller (a board with display
outputs enabled) is in graphics mode, a 3D controller (a data-center board) in compute mode.

Compute capabilities are NVIDIA's (CUDA's table of GPUs); classes are what these boards report
out of the box. A model not listed has no known compute capability (a node file may give one).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

PCI_CLASS_VGA = 0x030000
"""PCI class of a VGA-compatible controller: a GPU driving displays (graphics mode)."""
PCI_CLASS_3D = 0x030200
"""PCI class of a 3D controller: a GPU without display (compute mode)."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model: NVML names (fnmatch patterns, any case), compute capability, PCI class."""

    names: tuple[str, ...]
    compute_capability: tuple[int, int]
    pci_class: int = PCI_CLASS_3D

    def matches(self, gpu_name: str) -> bool:
        return any(fnmatch.fnmatchcase(gpu_name.lower(), n.lower()) for n in self.names)


GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel(("Tesla K80",), (3, 7)),
    GpuModel(("Tesla P100*",), (6, 0)),
    GpuModel(("Tesla P40", "Tesla P4"), (6, 1)),
    GpuModel(("Tesla V100*", "NVIDIA V100*"), (7, 0)),
    GpuModel(("Tesla T4", "NVIDIA T4"), (7, 5)),
    GpuModel(("Quadro RTX 8000", "Quadro RTX 6000", "Quadro RTX 5000"), (7, 5), PCI_CLASS_VGA),
    GpuModel(("NVIDIA A100*", "NVIDIA A800*", "NVIDIA A30"), (8, 0)),
    GpuModel(("NVIDIA A10", "NVIDIA A10G", "NVIDIA A16", "NVIDIA A2", "NVIDIA A40"), (8, 6)),
    GpuModel(("NVIDIA RTX A6000", "NVIDIA RTX A5000", "NVIDIA RTX A4000"), (8, 6), PCI_CLASS_VGA),
    GpuModel(("NVIDIA L4", "NVIDIA L40", "NVIDIA L40S"), (8, 9)),
    GpuModel(("NVIDIA RTX * Ada Generation",), (8, 9), PCI_CLASS_VGA),
    GpuModel(("NVIDIA H100*", "NVIDIA H200*", "NVIDIA H800*", "NVIDIA GH200*"), (9, 0)),
    GpuModel(("NVIDIA B200", "NVIDIA B100", "NVIDIA GB200*"), (10, 0)),
)
"""Models nvplugin knows, in the order they are tried (the first match wins)."""


def gpu_model(gpu_name: str) -> GpuModel | None:
    """The model of a GPU by its NVML name, or None for a model not in :data:`GPU_MODELS`."""
    for model in GPU_MODELS:
        if model.matches(gpu_name):
            return model
    return None


def default_pci_class(gpu_name: str) -> int:
    """The PCI class a GPU of this name reports (a 3D controller when the model is unknown)."""
    model = gpu_model(gpu_name)
    return PCI_CLASS_3D if model is None else model.pci_class


def default_compute_capability(gpu_name: str) -> tuple[int, int] | None:
    """The compute capability of a GPU of this name; None when the model is unknown."""
    model = gpu_model(gpu_name)
    return None if model is None else model.compute_capability
