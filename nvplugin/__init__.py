"""nvplugin: a Kubernetes device plugin for NVIDIA GPUs."""

__version__ = "0.1.0"
