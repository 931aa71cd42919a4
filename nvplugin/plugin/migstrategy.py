"""MIG strategies: which devices a node serves under which resource name, as NVIDIA's plugin
defines ``migStrategy`` (``flags.migStrategy`` in its config, ``--mig-strategy`` on its command
line). Pure functions over the discovered node: the config and the servers use them.

- ``none``: MIG is ignored; every GPU is served whole, as if MIG were off. A MIG-enabled GPU is
  advertised too (NVIDIA does the same), though no container can use it as a whole GPU: a warning
  says so.
- ``single``: every MIG device is served as the GPU resource (``nvidia.com/gpu``). NVIDIA's rules,
  matched: every MIG-enabled GPU must have MIG devices, all MIG devices one profile, and no GPU
  may have MIG off beside them; anything else fails at start with a message naming ``single``,
  each GPU and its profiles. A node with no MIG-enabled GPU serves whole GPUs (as NVIDIA's).
- ``mixed``: GPUs with MIG off are served whole (``resources.gpus`` applies to them as usual);
  each MIG profile becomes its own resource ``nvidia.com/mig-<profile>``, with ``+`` (not valid in
  a resource name) written ``.`` as NVIDIA's plugin does: ``1g.5gb+me`` -> ``mig-1g.5gb.me``. A
  MIG-enabled GPU without MIG devices serves nothing and gets a warning; NVIDIA's plugin refuses
  to start instead, which takes every other GPU of the node down with it while the instances are
  being created.

A MIG device is advertised under its MIG UUID, with its parent's NUMA node and health; a container
is told its MIG UUID or, with ``deviceIDStrategy: index``, ``<gpu index>:<mig index>`` as NVIDIA
writes it (:func:`nvplugin.plugin.responses.device_id`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nvplugin.config.layout import MIG_RESOURCE_PREFIX
from nvplugin.config.rules import MIG_STRATEGIES
from nvplugin.errors import InputError
from nvplugin.node.mig import mig_state
from nvplugin.node.model import Gpu, MigDevice


def mixed_resource_name(profile: str, domain: str = "nvidia.com") -> str:
    """The resource a profile is served as under ``mixed``: ``nvidia.com/mig-1g.5gb``."""
    return f"{domain}/{MIG_RESOURCE_PREFIX}{profile.replace('+', '.')}"


@dataclass(frozen=True, slots=True)
class ServedMig:
    """One MIG device with its parent GPU, as a resource serves it."""

    gpu: Gpu
    mig: MigDevice

    @property
    def numa_node(self) -> int | None:
        return self.gpu.numa_node


@dataclass(frozen=True)
class MigLayout:
    """What a strategy makes of a node. ``gpus``: served whole (the GPU resources and their
    rules take them from here); ``mig``: (resource name, its MIG devices) in order of each
    resource's first device (parent index, then MIG index); ``warnings``: logged once at start."""

    strategy: str
    gpus: tuple[Gpu, ...]
    mig: tuple[tuple[str, tuple[ServedMig, ...]], ...]
    warnings: tuple[str, ...] = ()

    def resource(self, name: str) -> tuple[ServedMig, ...]:
        for resource, devices in self.mig:
            if resource == name:
                return devices
        return ()


def check_strategy(strategy: str) -> None:
    """InputError naming the value and the choices unless ``strategy`` is one of them."""
    if strategy not in MIG_STRATEGIES:
        raise InputError(
            f"migStrategy {strategy!r} is not one of {', '.join(MIG_STRATEGIES)} (NVIDIA's values)"
        )


def apply_strategy(
    gpus: tuple[Gpu, ...] | list[Gpu],
    strategy: str,
    *,
    resource_name: str = "nvidia.com/gpu",
) -> MigLayout:
    """Split the node's GPUs by ``strategy`` (see the module docstring). ``resource_name`` is
    the GPU resource (``single`` serves MIG devices under it; ``mixed`` takes its domain)."""
    check_strategy(strategy)
    ordered = tuple(sorted(gpus, key=lambda gpu: gpu.index))
    enabled = [gpu for gpu in ordered if gpu.mig_enabled]
    if strategy == "none":
        warnings = tuple(
            f"GPU {gpu.index} ({gpu.name}) has MIG enabled but migStrategy is none: it is "
            "advertised as a whole GPU, which no container can use as one (use migStrategy "
            "single or mixed, or disable MIG on it)"
            for gpu in enabled
        )
        return MigLayout(strategy, ordered, (), warnings)
    if strategy == "single":
        return _single(ordered, enabled, resource_name)
    domain = resource_name.split("/", 1)[0]
    by_resource: dict[str, list[ServedMig]] = {}
    warnings_list = []
    for gpu in enabled:
        if not gpu.mig_devices:
            warnings_list.append(
                f"GPU {gpu.index} ({gpu.name}) has MIG enabled but no MIG devices: it serves "
                "nothing until MIG devices are created on it"
            )
        for device in gpu.mig_devices:
            name = mixed_resource_name(device.profile, domain)
            by_resource.setdefault(name, []).append(ServedMig(gpu, device))
    whole = tuple(gpu for gpu in ordered if not gpu.mig_enabled)
    mig = tuple((name, tuple(devices)) for name, devices in by_resource.items())
    return MigLayout(strategy, whole, mig, tuple(warnings_list))


def _single(ordered: tuple[Gpu, ...], enabled: list[Gpu], resource_name: str) -> MigLayout:
    if not enabled:
        warning = "migStrategy is single but no GPU has MIG enabled: whole GPUs are served"
        return MigLayout("single", ordered, (), (warning,))
    profiles = {device.profile for gpu in enabled for device in gpu.mig_devices}
    off = [gpu for gpu in ordered if not gpu.mig_enabled]
    empty = [gpu for gpu in enabled if not gpu.mig_devices]
    if len(profiles) > 1 or off or empty:
        problems = []
        if len(profiles) > 1:
            problems.append(f"{len(profiles)} MIG profiles ({', '.join(sorted(profiles))})")
        if empty:
            problems.append(f"{_count(empty)} with MIG on but no MIG devices")
        if off:
            problems.append(f"{_count(off)} with MIG off")
        raise InputError(
            "migStrategy single needs every GPU in MIG mode with MIG devices of one and the same "
            f"profile, but this node has {' and '.join(problems)}: {_describe(ordered)}. Use "
            "migStrategy mixed, or partition every GPU alike (e.g. with nvidia-mig-parted)"
        )
    devices = tuple(ServedMig(gpu, device) for gpu in enabled for device in gpu.mig_devices)
    return MigLayout("single", (), ((resource_name, devices),))


def _count(gpus: list[Gpu]) -> str:
    return "1 GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs"


def _describe(gpus: tuple[Gpu, ...]) -> str:
    """Each GPU's MIG state; consecutive GPUs in the same state share one entry (``GPU 0-1``),
    so a 128-GPU node still gives a short message."""
    groups: list[tuple[int, int, str]] = []
    for gpu in gpus:
        state = mig_state(gpu)
        if groups and groups[-1][2] == state and groups[-1][1] == gpu.index - 1:
            groups[-1] = (groups[-1][0], gpu.index, state)
        else:
            groups.append((gpu.index, gpu.index, state))
    return "; ".join(
        f"GPU {a}: {state}" if a == b else f"GPU {a}-{b}: {state}" for a, b, state in groups
    )


def mig_resource(
    gpus: tuple[Gpu, ...] | list[Gpu],
    strategy: str,
    resource: str | None,
    *,
    resource_name: str = "nvidia.com/gpu",
) -> tuple[str, tuple[MigDevice, ...]]:
    """The MIG devices ``strategy`` serves as ``resource`` (None: the only MIG resource, or
    tell which there are), for ``nvplugin preferred``; InputError naming the resources this node
    has when ``resource`` is none of them."""
    layout = apply_strategy(gpus, strategy, resource_name=resource_name)
    names = [name for name, _ in layout.mig]
    if resource is None and len(names) == 1:
        resource = names[0]
    devices = layout.resource(resource) if resource is not None else ()
    if not devices:
        have = ", ".join(names) or f"none under migStrategy {strategy}"
        asked = "--resource is required" if resource is None else f"{resource} is no MIG resource"
        raise InputError(f"{asked} on this node (MIG resources: {have})")
    assert resource is not None
    return resource, tuple(served.mig for served in devices)
