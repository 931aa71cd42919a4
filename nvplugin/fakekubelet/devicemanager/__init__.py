"""The fake kubelet's device manager, split as the kubelet's ``pkg/kubelet/cm/devicemanager``:
:mod:`.manager` (the state and the allocation), :mod:`.endpoint` (one plugin connection),
:mod:`.pod_devices` (what containers hold), :mod:`.topology_hints`, :mod:`.checkpoint`, and
:mod:`.hint_provider` (the topology manager's way in, across threads)."""

from nvplugin.fakekubelet.devicemanager.endpoint import (
    DIAL_TIMEOUT_S,
    DeviceInfo,
    DevicePluginError,
    Endpoint,
    PluginOptions,
    go_rpc_error,
)
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager, Listener, ResourceCapacity
from nvplugin.fakekubelet.devicemanager.pod_devices import ContainerAllocation

__all__ = [
    "DIAL_TIMEOUT_S",
    "ContainerAllocation",
    "DeviceInfo",
    "DeviceManager",
    "DevicePluginError",
    "Endpoint",
    "Listener",
    "PluginOptions",
    "ResourceCapacity",
    "go_rpc_error",
]
