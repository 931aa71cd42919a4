"""The kubelet's device-plugin API, ``v1beta1``: the one contract between the plugin
(:mod:`nvplugin.plugin`) and the kubelet (the real one, or :mod:`nvplugin.fakekubelet`).

``v1beta1/`` holds the code generated from ``proto/deviceplugin/v1beta1/api.proto`` (``make
proto``; committed, never edited). The constants here are the parts of the API that are not in
the proto -- the version string both sides check, the kubelet's socket and directory, the health
values -- so that each lives once and both sides import it from here.
"""

VERSION = "v1beta1"
"""The API version a plugin registers with (``RegisterRequest.version``)."""
SUPPORTED_VERSIONS = (VERSION,)
"""The versions the kubelet (1.32) accepts."""
KUBELET_SOCKET = "kubelet.sock"
"""The kubelet's Registration socket, in the device-plugin directory."""
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
"""Where the kubelet serves ``kubelet.sock`` and plugins put their sockets, by default."""
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
"""``Device.health``: the kubelet counts a device allocatable only when it is exactly
``Healthy``."""
