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
PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
"""The CDI kind of the spec NVIDIA's device plugin writes for itself, and nvplugin's default:
vendor ``k8s.device-plugin.nvidia.com`` fixed in ``cmd/nvidia-device-plugin/plugin-manager.go``
(NVIDIA/k8s-device-plugin, read at commit 062f090), class ``gpu`` (``internal/cdi/cdi.go``)."""
CDI_KINDS = (PLUGIN_CDI_KIND, CDI_KIND)

# MPS (``sharing.mps``): what a client container of an MPS resource is given, as NVIDIA's plugin
# gives it, and the CUDA variables that bound a client's share (NVIDIA's MPS documentation).
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
"""Where the MPS control daemon's pipes are: the daemon's and every client's."""
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
"""Where the control daemon writes ``control.log`` (and the servers ``server.log``)."""
MPS_CONTAINER_ROOT = "/mps"
"""NVIDIA's container root for MPS: a client's pipe directory is ``/mps/<resource>/pipe``, and
NVIDIA's charts mount the host's MPS root there in the plugin's container."""
MPS_SHM_PATH = "/dev/shm"
"""A client's shared memory: the host's ``<mpsRoot>/shm``, which the MPS server shares too."""
MPS_MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
"""A client's device memory limit per device ordinal: ``0=40960M,1=40960M``."""
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
"""The percentage of each GPU's threads (SMs) a client may use."""
