"""Generated code for the kubelet's pod resources API (``make proto``; do not edit)."""
