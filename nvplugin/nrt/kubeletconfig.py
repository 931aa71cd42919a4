"""The kubelet's policies the NRT object says, from the kubelet's config file
(``KubeletConfiguration``, e.g. ``/var/lib/kubelet/config.yaml``) and nvplugin's settings (a
setting wins over the file). The file's keys are the kubelet's: ``topologyManagerPolicy``,
``topologyManagerScope``, ``cpuManagerPolicy``, ``memoryManagerPolicy``; a key the file leaves
out takes the kubelet's default (``none``, ``container``, ``none``, ``None``), since the file is
the kubelet's whole configuration. The file is read bounded, as every input is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvplugin import yamlinput
from nvplugin.errors import InputError, shortened
from nvplugin.nrt.objects import KubeletPolicies

if TYPE_CHECKING:
    from nvplugin.config.model import TopologyConfig

KUBELET_DEFAULTS = {
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "cpuManagerPolicy": "none",
    "memoryManagerPolicy": "None",
}
MAX_BYTES = 256 * 1024
"""A kubelet config file is a few KiB."""


def read_policies(path: str) -> KubeletPolicies:
    """The policies the kubelet config file at ``path`` says; InputError naming the file and the
    key when it is not a KubeletConfiguration or a value is not a string."""
    source = f"kubelet config file {path}"
    doc = yamlinput.load(yamlinput.read_text(path, source, MAX_BYTES), source)
    if not isinstance(doc, dict) or doc.get("kind") not in (None, "KubeletConfiguration"):
        raise InputError(f"{source}: not a KubeletConfiguration")
    values = {}
    for key, default in KUBELET_DEFAULTS.items():
        value = doc.get(key, default)
        if not isinstance(value, str) or not value:
            raise InputError(f"{source}: {key}: {shortened(repr(value), 80)} is not a policy name")
        values[key] = value
    return KubeletPolicies(
        values["topologyManagerPolicy"],
        values["topologyManagerScope"],
        values["cpuManagerPolicy"],
        values["memoryManagerPolicy"],
    )


def merged(from_file: KubeletPolicies | None, settings: TopologyConfig) -> KubeletPolicies:
    """The file's policies with the ``nvplugin.topology`` settings given (not None) over them."""
    base = from_file or KubeletPolicies()

    def pick(value: str | None, current: str | None) -> str | None:
        return value if value is not None else current

    return KubeletPolicies(
        pick(settings.topology_manager_policy, base.topology_manager_policy),
        pick(settings.topology_manager_scope, base.topology_manager_scope),
        pick(settings.cpu_manager_policy, base.cpu_manager_policy),
        pick(settings.memory_manager_policy, base.memory_manager_policy),
    )


def _millicpu(value: object, source: str, key: str) -> int:
    text = str(value).strip()
    millis = text.endswith("m")
    number = text[:-1] if millis else text
    try:
        amount = float(number)
    except ValueError:
        raise InputError(f"{source}: {key}: {shortened(text, 40)} is not a CPU quantity") from None
    if amount < 0 or number.lower() in ("nan", "inf", "infinity"):
        raise InputError(f"{source}: {key}: {shortened(text, 40)} is not a CPU quantity")
    return round(amount) if millis else round(amount * 1000)


def read_reserved_cpu(path: str) -> str:
    """The CPU the kubelet config file at ``path`` reserves: ``kubeReserved.cpu`` plus
    ``systemReserved.cpu``, as a quantity (``"1500m"``, ``"2"``; ``"0"`` when neither is set)."""
    source = f"kubelet config file {path}"
    doc = yamlinput.load(yamlinput.read_text(path, source, MAX_BYTES), source)
    if not isinstance(doc, dict):
        raise InputError(f"{source}: not a KubeletConfiguration")
    total = 0
    for key in ("kubeReserved", "systemReserved"):
        reserved = doc.get(key) or {}
        if not isinstance(reserved, dict):
            raise InputError(f"{source}: {key}: expected a mapping")
        if "cpu" in reserved:
            total += _millicpu(reserved["cpu"], source, f"{key}.cpu")
    return str(total // 1000) if total % 1000 == 0 else f"{total}m"
