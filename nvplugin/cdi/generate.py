"""A node's CDI spec under a config: the one way ``serve``, ``nvplugin cdi generate`` and
``nvplugin cdi check`` make it. Reads the driver root (:mod:`.hostfiles`); call it off the event
loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nvplugin.cdi.hostfiles import HostFiles, read_host_files
from nvplugin.cdi.spec import ALL, Roots, SpecDevice, build_spec, missing
from nvplugin.cdi.writer import spec_file_name, write_spec
from nvplugin.config import Config
from nvplugin.config.rules import DEFAULT_CDI_SPEC_DIR, TOOLKIT_CDI_KIND
from nvplugin.errors import NvpluginError
from nvplugin.node import driverfiles as facts
from nvplugin.node.mig import caps_device
from nvplugin.node.model import Topology
from nvplugin.rm.devices import Device
from nvplugin.rm.plan import ResourcePlan
from nvplugin.rm.responses import device_id


class SpecIncomplete(NvpluginError):
    """The spec cannot be made whole: what is missing, named."""


def cdi_on(config: Config) -> bool:
    """Whether Allocate hands out CDI names (a ``cdi-*`` deviceListStrategy)."""
    return any(name.startswith("cdi-") for name in config.device_list_strategy)


def writes_spec(config: Config) -> bool:
    """Whether ``serve`` writes the spec: CDI names handed out, of a kind other than the
    container toolkit's."""
    return cdi_on(config) and config.cdi_kind != TOOLKIT_CDI_KIND


SIMULATED_SPEC_DIR = "var/run/cdi"
"""Under ``--simulate``, the default spec directory is the simulated node's own (in its tree):
a simulated node's spec names files a real runtime must never be handed."""


def spec_dir(config: Config, simulated_root: str | None = None) -> str:
    """Where the spec goes: ``nvplugin.cdi.specDir``; on a simulated node whose root is
    ``simulated_root``, its default is that node's ``var/run/cdi``."""
    if simulated_root is not None and config.cdi_spec_dir == DEFAULT_CDI_SPEC_DIR:
        return os.path.join(simulated_root, SIMULATED_SPEC_DIR)
    return config.cdi_spec_dir


def _nodes(device: Device) -> tuple[str, ...]:
    nodes = [f"nvidia{device.gpu.minor}"]
    if device.mig is not None and device.mig.caps is not None:
        caps = device.mig.caps
        nodes += [
            caps_device(m).removeprefix("/dev/") for m in (caps.gpu_instance, caps.compute_instance)
        ]
    return tuple(nodes)


def served_units(plan: ResourcePlan) -> list[Device]:
    """Each GPU or MIG device the plan serves, once however many resources or replicas serve
    it, in node order: what Allocate's IDs name."""
    units = {d.uuid: d for served in plan.resources for d in served.bases}
    return sorted(units.values(), key=lambda device: device.order)


def spec_devices(plan: ResourcePlan, id_strategy: str) -> list[SpecDevice]:
    """One device per ID Allocate can return under the plan, in node order."""
    return [SpecDevice(device_id(d, id_strategy), _nodes(d)) for d in served_units(plan)]


def qualified_names(config: Config, plan: ResourcePlan) -> list[str]:
    """Every fully qualified name Allocate can hand out under ``config``, ``all`` last."""
    names = [d.name for d in spec_devices(plan, config.device_id_strategy)]
    return [f"{config.cdi_kind}={name}" for name in (*names, ALL)] if names else []


def _wanted(topology: Topology) -> list[tuple[str, str, int]]:
    wanted = [(f"nvidia{gpu.minor}", facts.FRONTEND, gpu.minor) for gpu in topology.gpus]
    for gpu in topology.gpus:
        for mig in gpu.mig_devices:
            if mig.caps is not None:
                for minor in (mig.caps.gpu_instance, mig.caps.compute_instance):
                    wanted.append((caps_device(minor).removeprefix("/dev/"), facts.CAPS, minor))
    wanted += [(name, driver, minor) for name, (driver, minor) in facts.CONTROL_NODES.items()]
    return wanted


def view_root(driver_root: str | None) -> str:
    """Where this process sees the driver root: the mount (or simulated tree) when there."""
    return driver_root if driver_root and os.path.isdir(driver_root) else "/"


@dataclass(frozen=True)
class Generated:
    """A node's spec, and what it lacks to be whole (empty: whole)."""

    spec: dict[str, Any]
    missing: tuple[str, ...]
    files: HostFiles


def generate(
    config: Config,
    plan: ResourcePlan,
    topology: Topology,
    driver_version: str,
    driver_root: str | None,
) -> Generated:
    """The spec of what ``plan`` serves; ``driver_root`` where this process sees the driver
    root (None: ``/``)."""
    files = read_host_files(
        view_root(driver_root), driver_version, _wanted(topology), config.nvidia_ctk_path
    )
    devices = spec_devices(plan, config.device_id_strategy)
    lacking = missing(devices, files)
    for served in plan.resources:
        for device in served.bases:
            if device.mig is not None and device.mig.caps is None:
                lacking.append(f"MIG device {device.mig.label}'s nvidia-caps minors (mig-minors)")
    roots = Roots(config.driver_root, config.dev_root)
    spec = build_spec(config.cdi_kind, devices, files, roots)
    return Generated(spec, tuple(dict.fromkeys(lacking)), files)


def incomplete(path: str, lacking: Sequence[str]) -> SpecIncomplete:
    shown = "; ".join(lacking[:8]) + (f"; and {len(lacking) - 8} more" if len(lacking) > 8 else "")
    return SpecIncomplete(f"cannot make the CDI spec {path} whole: missing {shown}")


def refresh(
    config: Config,
    plan: ResourcePlan,
    topology: Topology,
    driver_version: str,
    driver_root: str | None,
    directory: str,
) -> tuple[str, bool]:
    """Write the spec ``serve`` keeps into ``directory`` (its path, whether it changed). Raises
    SpecIncomplete when it cannot be whole, NvpluginError when it cannot be written."""
    if not spec_devices(plan, config.device_id_strategy):
        # Nothing served, no name handed out: a spec without devices is refused by CDI loaders.
        return os.path.join(directory, spec_file_name(config.cdi_kind)), False
    made = generate(config, plan, topology, driver_version, driver_root)
    if made.missing:
        raise incomplete(os.path.join(directory, spec_file_name(config.cdi_kind)), made.missing)
    return write_spec(directory, config.cdi_kind, made.spec)
