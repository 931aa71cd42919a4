"""The kubelet's pod resources API, ``v1``: who holds which devices, exclusive CPUs and memory
blocks, and what the node can allocate (``v1/``: generated from
``proto/podresources/v1/api.proto`` by ``make proto``; committed, never edited). The fake kubelet
serves it (:mod:`nvplugin.fakekubelet.podresources`); the NodeResourceTopology publisher reads it
(:mod:`nvplugin.plugin.nrt`)."""

POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
"""Where the kubelet serves the API, by default (``<kubelet root>/pod-resources``)."""
POD_RESOURCES_SOCKET = "kubelet.sock"
"""The socket's name in that directory."""
