"""What an NVIDIA device plugin's Allocate responses say to the NVIDIA container toolkit, in the
toolkit's documented forms: the names the plugin writes (:mod:`nvplugin.rm.responses`) and
``nvplugin admit`` reads back to learn which GPUs a container sees (:mod:`nvplugin.admit.visible`),
each written once, here.

A device is named by its UUID or its NVML index (a MIG device: ``<gpu index>:<mig index>``).
"""

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
"""The variable the NVIDIA container runtime reads: device names, comma-separated."""
NO_DEVICES = "void"
"""The NVIDIA runtime's value for "no GPU" (an empty value would mean "not set" to some
runtimes, which then expose every GPU)."""
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
"""``volume-mounts``: one mount per device under this directory, named by the device; the
variable then names the directory."""
CDI_KIND = "nvidia.com/gpu"
"""The CDI kind of the spec ``nvidia-ctk cdi generate`` writes: a device is
``nvidia.com/gpu=<name>``."""
