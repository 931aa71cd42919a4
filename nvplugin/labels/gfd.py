"""GPU Feature Discovery's labels, as a pure function of the node and of what is served.

NVIDIA's GPU Feature Discovery (GFD) labels a node with what its GPUs are -- model, memory,
architecture, driver and CUDA versions, MIG and sharing -- under ``nvidia.com/``, and users
schedule on those labels with plain node selectors. nvplugin computes the same keys and values
from what it already knows: the discovered node (:class:`NodeFacts`) and the plan of what it
serves (:class:`~nvplugin.rm.plan.ResourcePlan`). GFD's rules, restated:

- ``gfd.timestamp``: when the labels were made (seconds), unless ``noTimestamp``.
- ``gpu.machine``: the machine-type file's first line (the DMI product name), sanitised as
  ``gpu.product`` is (``VMware7,1`` -> ``VMware71``); ``unknown`` when it cannot be read. Both
  are labelled even without GPUs; the rest only when the node has GPUs.
- ``cuda.driver.{major,minor,rev}`` and ``cuda.driver-version.{major,minor,revision,full}``: the
  driver version ``X.Y[.Z]`` (the revision empty without ``.Z``); ``cuda.runtime.{major,minor}``
  and ``cuda.runtime-version.{major,minor,full}``: the newest CUDA version the driver supports.
- ``vgpu.present``: ``false``. GFD writes ``true`` (and ``vgpu.host-driver-{version,branch}``)
  in a guest whose GPUs are NVIDIA vGPU devices, ``false`` on every other node with GPUs (bare
  metal, PCI passthrough). nvplugin does not detect vGPU guests, so it always writes ``false``.
- ``mig.capable``: whether any GPU supports MIG; ``mps.capable``: ``true`` when GPUs are shared
  through MPS (``sharing.mps`` with replicas > 1), else ``false``; ``gpu.mode``: ``compute``
  when every GPU is a PCI 3D controller, ``graphics`` when every one is a VGA controller, else
  ``unknown``.
- ``gpu.{product,count,replicas,sharing-strategy,memory,family,compute.major,compute.minor}``:
  one GPU model. GPUs with MIG off win over GPUs with MIG on; ``count`` counts every GPU of the
  model (MIG on or off). ``product`` is the model name with characters other than letters,
  digits, ``-_.`` and blanks removed and blanks runs as one ``-``, plus ``-SHARED`` when it is
  replicated and not renamed. ``replicas`` is the replicas per GPU of the resource its GPUs are
  served as (1 unshared; 0 when every GPU of the model has MIG on: MIG-enabled GPUs are not
  shared), ``sharing-strategy`` ``time-slicing`` or ``mps`` (the block that replicates it) when
  replicas > 1, else ``none``; ``-SHARED`` is added for MPS as for time-slicing.
  ``memory`` is MiB; ``family`` comes from the compute capability (``ampere`` for 8.0, ...).
- ``mig.strategy``: ``single`` or ``mixed`` (nothing under ``none``). Under ``single`` the MIG
  devices override ``gpu.product`` (``<model>-MIG-<profile>``), ``count`` (MIG devices),
  ``replicas``, ``sharing-strategy`` and ``memory`` (the MIG device's), and add
  ``gpu.multiprocessors``, ``gpu.slices.{gi,ci}``, ``gpu.engines.{copy,decoder,encoder,jpeg,ofa}``.
  Under ``mixed`` each MIG profile gets the same set under ``mig-<profile>.`` (``+`` in a profile
  written ``.``, as in its resource name).

Where nvplugin serves differently from NVIDIA's plugin the labels follow what nvplugin serves:
GPUs and MIG devices hidden by ``resources.exclude`` are not labelled, replicas and renames are
those of the resource the GPUs are served as (``resources.gpus`` and ``resources.mig`` names do
not change the label keys, which are GFD's), and a node whose MIG layout ``single`` cannot serve
is refused by the plan (GFD would label it ``<model>-MIG-INVALID``). On a node with several GPU
models GFD labels one chosen by chance; here it is the model of the lowest-indexed GPU with MIG
off (else with MIG on), and :func:`other_models` names the rest for a warning. GFD takes one
sharing block for the whole node (MPS when ``sharing.mps`` replicates anything); nvplugin may
share two resources two ways, and each resource's labels say its own. GFD fails to label a node
that has MPS sharing and a GPU with MIG on; nvplugin serves MPS on whole GPUs with MIG off only
(under migStrategy none it leaves the GPUs with MIG on out of MPS), so such a node's labels say
``mps.capable=true`` when some GPU is MPS-shared, ``false`` when none is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.config.layout import TIME_SLICING
from nvplugin.errors import NvpluginError
from nvplugin.node.gpumodels import PCI_CLASS_3D, PCI_CLASS_VGA
from nvplugin.node.model import Driver, Gpu, MigDevice, Topology
from nvplugin.rm.devices import Kind
from nvplugin.rm.plan import ResourcePlan, ServedResource

PREFIX = "nvidia.com/"
GPU = f"{PREFIX}gpu"
"""GFD's label keys for whole GPUs (and MIG devices under ``single``), whatever the resource."""

NONE = "none"
UNKNOWN = "unknown"


class LabelError(NvpluginError):
    """What the node reports cannot be labelled (a driver version NVML should never give)."""


@dataclass(frozen=True)
class NodeFacts:
    """What the labels say of a node besides what is served: its topology (GPUs with their
    compute capability, MIG support and PCI class; links for :mod:`nvplugin.labels.extra`), the
    driver, and the machine type (None: the machine-type file could not be read)."""

    topology: Topology
    driver: Driver
    machine: str | None = None


def gfd_labels(node: NodeFacts, plan: ResourcePlan | None, timestamp: int | None) -> dict[str, str]:
    """GFD's labels of ``node`` serving ``plan`` (None: nothing served yet, as while NVML has no
    GPU), by key. ``timestamp``: seconds since the epoch, None to leave it out. LabelError when
    the driver version is not ``X.Y[.Z]``."""
    labels = labels_without_gpus(node.machine, timestamp)
    gpus = labelled_gpus(node.topology.gpus, plan)
    if plan is None or not gpus:
        return labels
    labels.update(version_labels(node.driver))
    labels[f"{PREFIX}mig.capable"] = _bool(any(gpu.mig_capable for gpu in gpus))
    labels[f"{PREFIX}mps.capable"] = _bool(any(served.replicas.mps for served in plan.resources))
    labels.update(gpu_model_labels(gpus, plan))
    if plan.mig_strategy != NONE:
        labels[f"{PREFIX}mig.strategy"] = plan.mig_strategy
        labels.update(mig_labels(plan))
    labels[f"{PREFIX}gpu.mode"] = gpu_mode(gpus)
    labels[f"{PREFIX}vgpu.present"] = _bool(False)
    return labels


def labels_without_gpus(machine: str | None, timestamp: int | None) -> dict[str, str]:
    """What GFD labels on a node without GPUs (and every node has): the timestamp, unless None,
    and the machine type (None: the file could not be read)."""
    labels: dict[str, str] = {}
    if timestamp is not None:
        labels[f"{PREFIX}gfd.timestamp"] = str(timestamp)
    labels[f"{PREFIX}gpu.machine"] = UNKNOWN if machine is None else sanitise(machine)
    return labels


def labelled_gpus(gpus: Sequence[Gpu], plan: ResourcePlan | None) -> list[Gpu]:
    """The node's GPUs but those ``resources.exclude`` hides, in index order (GPUs with MIG on
    that MPS leaves out under migStrategy none are labelled, as under none without MPS)."""
    if plan is None:
        return list(gpus)
    return [
        gpu
        for gpu in gpus
        if plan.served_as.get(str(gpu.index), "") is not None or gpu.index in plan.mps_mig_on
    ]


def version_labels(driver: Driver) -> dict[str, str]:
    """The driver and CUDA version labels, GFD's current keys and its deprecated ones."""
    parts = driver.version.split(".")
    if not 2 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise LabelError(
            f"the NVIDIA driver reports version {driver.version[:40]!r}, not X.Y[.Z]: "
            "cannot label the node's driver"
        )
    major, minor = parts[0], parts[1]
    revision = parts[2] if len(parts) == 3 else ""
    cuda_major, cuda_minor = (str(part) for part in driver.cuda)
    return {
        f"{PREFIX}cuda.driver.major": major,
        f"{PREFIX}cuda.driver.minor": minor,
        f"{PREFIX}cuda.driver.rev": revision,
        f"{PREFIX}cuda.runtime.major": cuda_major,
        f"{PREFIX}cuda.runtime.minor": cuda_minor,
        f"{PREFIX}cuda.driver-version.major": major,
        f"{PREFIX}cuda.driver-version.minor": minor,
        f"{PREFIX}cuda.driver-version.revision": revision,
        f"{PREFIX}cuda.driver-version.full": driver.version,
        f"{PREFIX}cuda.runtime-version.major": cuda_major,
        f"{PREFIX}cuda.runtime-version.minor": cuda_minor,
        f"{PREFIX}cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


def labelled_model(gpus: Sequence[Gpu]) -> str:
    """The GPU model the ``gpu.*`` labels describe: the lowest-indexed GPU's with MIG off, else
    the lowest-indexed GPU's."""
    whole = [gpu for gpu in gpus if not gpu.mig_enabled]
    return (whole or list(gpus))[0].name


def other_models(gpus: Sequence[Gpu]) -> list[str]:
    """The node's GPU models the ``gpu.*`` labels do not describe, in index order."""
    chosen = labelled_model(gpus)
    return list(dict.fromkeys(gpu.name for gpu in gpus if gpu.name != chosen))


def gpu_model_labels(gpus: Sequence[Gpu], plan: ResourcePlan) -> dict[str, str]:
    """``gpu.*`` for the labelled model: its count, product, memory and architecture, and the
    sharing of the resource its GPUs with MIG off are served as."""
    name = labelled_model(gpus)
    mine = [gpu for gpu in gpus if gpu.name == name]
    whole = [gpu for gpu in mine if not gpu.mig_enabled]
    served = _resource_of(plan, str(whole[0].index)) if whole else None
    keys = _Keys(GPU)
    labels = _base(keys, len(mine), [name], served, shareable=bool(whole))
    if mine[0].memory_mib:
        labels[keys("memory")] = str(mine[0].memory_mib)
    compute = mine[0].compute_capability
    if compute is not None and compute[0] != 0:
        labels[keys("family")] = architecture(*compute)
        labels[keys("compute.major")] = str(compute[0])
        labels[keys("compute.minor")] = str(compute[1])
    return labels


def mig_labels(plan: ResourcePlan) -> dict[str, str]:
    """The MIG devices' labels: under ``single`` over ``gpu.*``, under ``mixed`` one set per
    profile (node order of each profile's first MIG device)."""
    by_profile: dict[str, list[tuple[ServedResource, MigDevice, Gpu]]] = {}
    for served in plan.resources:
        if served.kind is not Kind.MIG:
            continue
        for device in served.bases:
            assert device.mig is not None
            by_profile.setdefault(_profile(device.mig), []).append((served, device.mig, device.gpu))
    ordered = sorted(
        by_profile.items(), key=lambda item: (item[1][0][2].index, item[1][0][1].index)
    )
    labels: dict[str, str] = {}
    for profile, devices in ordered:
        served, first, parent = devices[0]
        keys = _Keys(GPU if plan.mig_strategy == "single" else f"{PREFIX}mig-{profile}")
        labels.update(_base(keys, len(devices), [parent.name, "MIG", profile], served))
        labels[keys("memory")] = str(first.memory_mib)
        labels.update(_attribute_labels(keys, first))
    return labels


def gpu_mode(gpus: Sequence[Gpu]) -> str:
    """``compute`` (every GPU a 3D controller), ``graphics`` (every GPU a VGA controller), or
    ``unknown`` (classes differ, or one cannot be read)."""
    classes = {gpu.pci_class for gpu in gpus}
    if len(classes) != 1:
        return UNKNOWN
    return {PCI_CLASS_3D: "compute", PCI_CLASS_VGA: "graphics"}.get(classes.pop() or 0, UNKNOWN)


_FAMILIES = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}


def architecture(major: int, minor: int) -> str:
    """GFD's architecture family of a compute capability (``undefined`` when it has none)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major in (10, 12):
        return "blackwell"
    return _FAMILIES.get(major, "undefined")


_NOT_IN_PRODUCT = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitise(text: str) -> str:
    """GFD's sanitising of a name into a label value: characters other than letters, digits,
    ``-_.`` and blanks removed, runs of blanks as one ``-``."""
    return "-".join(_NOT_IN_PRODUCT.sub("", text).split())


def product(parts: Sequence[str], shared: bool) -> str:
    """``gpu.product``: each part sanitised, joined with ``-``, and ``-SHARED`` for a replicated
    resource that is not renamed."""
    cleaned = [sanitise(part) for part in parts]
    cleaned = [part for part in cleaned if part]
    if cleaned and shared:
        cleaned.append("SHARED")
    return "-".join(cleaned)


class _Keys:
    """Label keys under one resource: ``nvidia.com/gpu.`` + suffix."""

    def __init__(self, resource: str) -> None:
        self.resource = resource

    def __call__(self, suffix: str) -> str:
        return f"{self.resource}.{suffix}"


def _base(
    keys: _Keys,
    count: int,
    parts: Sequence[str],
    served: ServedResource | None,
    *,
    shareable: bool = True,
) -> dict[str, str]:
    """``product``, ``count``, ``replicas`` and ``sharing-strategy`` of a resource's units."""
    replicas = 0 if not shareable else served.replicas.count if served is not None else 1
    shared = replicas > 1
    renamed = served is not None and bool(served.base)
    strategy = served.replicas.strategy if served is not None else TIME_SLICING
    return {
        keys("product"): product(parts, shared and not renamed),
        keys("count"): str(count),
        keys("replicas"): str(replicas),
        keys("sharing-strategy"): strategy if shared else NONE,
    }


def _attribute_labels(keys: _Keys, device: MigDevice) -> dict[str, str]:
    """A MIG device's attributes as GFD labels them."""
    units = device.units
    return {
        keys("multiprocessors"): str(units.multiprocessors),
        keys("slices.gi"): str(device.slices),
        keys("slices.ci"): str(device.compute_slices),
        keys("engines.copy"): str(units.copy_engines),
        keys("engines.decoder"): str(units.decoders),
        keys("engines.encoder"): str(units.encoders),
        keys("engines.jpeg"): str(units.jpeg),
        keys("engines.ofa"): str(units.ofa),
    }


def _resource_of(plan: ResourcePlan, label: str) -> ServedResource | None:
    name = plan.served_as.get(label)
    return None if name is None else plan.resource(name)


def _profile(device: MigDevice) -> str:
    """A MIG profile as GFD names its labels (and NVIDIA its resources): ``+`` written ``.``."""
    return device.profile.replace("+", ".")


def _bool(value: bool) -> str:
    return "true" if value else "false"
