"""Generated code for the kubelet's device plugin API (``make proto``; do not edit)."""
