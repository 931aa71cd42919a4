"""The fake kubelet, shaped like the real kubelet's ``pkg/kubelet/cm``: the topology manager
(``topologymanager/``), the device manager (``devicemanager/``), the CPU manager and pod
manifests. It drives the device plugin exactly as a real kubelet would
(docs/kubelet-behaviour.md), so the plugin can be proved without a cluster."""
