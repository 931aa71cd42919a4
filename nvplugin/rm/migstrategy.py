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
writes it (:func:`nvplugin.rm.responses.device_id`).

A strategy's result is one list of units in node order -- whole GPUs and MIG devices alike, each
with the resource it is served as by default -- which the plan (:mod:`nvplugin.rm.plan`) names,
excludes and replicates in one loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvplugin.config.layout import MIG_RESOURCE_PREFIX
from nvplugin.config.rules import MIG_STRATEGIES
from nvplugin.errors import InputError
from nvplugin.node.mig import mig_state
from nvplugin.node.model import Gpu
from nvplugin.rm.devices import Device, mig_device, whole_gpu


def mixed_resource_name(profile: str, domain: str = "nvidia.com") -> str:
    """The resource a profile is served as under ``mixed``: ``nvidia.com/mig-1g.5gb``."""
    return f"{domain}/{MIG_RESOURCE_PREFIX}{profile.replace('+', '.')}"


@dataclass(frozen=True)
class MigLayout:
    """What a strategy makes of a node. ``units``: every GPU served whole and every MIG device
    served, in node order (GPU index, then MIG index), each with the resource it is served as by
    default (``resources.*`` and time-slicing may rename it); ``warnings``: logged once at start."""

    strategy: str
    units: tuple[tuple[Device, str], ...]
    warnings: tuple[str, ...] = ()

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """The GPUs served whole."""
        return tuple(device.gpu for device, _ in self.units if device.mig is None)

    @property
    def mig(self) -> tuple[tuple[str, tuple[Device, ...]], ...]:
        """(default resource, its MIG devices), in order of each resource's first device."""
        by_resource: dict[str, list[Device]] = {}
        for device, name in self.units:
            if device.mig is not None:
                by_resource.setdefault(name, []).append(device)
        return tuple((name, tuple(devices)) for name, devices in by_resource.items())

    def resource(self, name: str) -> tuple[Device, ...]:
        """The MIG devices served as ``name`` by default."""
        return tuple(d for d, served in self.units if served == name and d.mig is not None)


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
        return MigLayout(strategy, _whole(ordered, resource_name), warnings)
    if strategy == "single":
        return _single(ordered, enabled, resource_name)
    domain = resource_name.split("/", 1)[0]
    units: list[tuple[Device, str]] = []
    warnings_list = []
    for gpu in ordered:
        if not gpu.mig_enabled:
            units.append((whole_gpu(gpu), resource_name))
            continue
        if not gpu.mig_devices:
            warnings_list.append(
                f"GPU {gpu.index} ({gpu.name}) has MIG enabled but no MIG devices: it serves "
                "nothing until MIG devices are created on it"
            )
        for mig in gpu.mig_devices:
            units.append((mig_device(gpu, mig), mixed_resource_name(mig.profile, domain)))
    return MigLayout(strategy, tuple(units), tuple(warnings_list))


def _single(ordered: tuple[Gpu, ...], enabled: list[Gpu], resource_name: str) -> MigLayout:
    if not enabled:
        warning = "migStrategy is single but no GPU has MIG enabled: whole GPUs are served"
        return MigLayout("single", _whole(ordered, resource_name), (warning,))
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
    units = tuple(
        (mig_device(gpu, mig), resource_name) for gpu in enabled for mig in gpu.mig_devices
    )
    return MigLayout("single", units)


def _whole(gpus: tuple[Gpu, ...], resource_name: str) -> tuple[tuple[Device, str], ...]:
    return tuple((whole_gpu(gpu), resource_name) for gpu in gpus)


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
