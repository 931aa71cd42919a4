"""``make e2e-node``: nvplugin's image and chart on a real one-node cluster on this machine.

Not part of ``make test``: it needs root, containerd, runc, buildah, debootstrap (for the image's
base, once) and the Kubernetes binaries of one version (kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, kubectl, etcd) in the directory ``NVPLUGIN_E2E_BIN`` names -- the
Makefile unpacks them from ../shared/k8s when that is there. Every address is on loopback: the
service CIDR is 127.0.0.0/24 (the ``kubernetes`` Service is 127.0.0.1, no kube-proxy), the node
is named 127.0.0.1, and pods run on the host network (the only CNI plugin is ``loopback``).

- :mod:`.cluster`: the cluster (PKI by openssl; etcd, the control plane, containerd, the kubelet),
  started and stopped by pid, every component restartable with the same command line;
- :mod:`.images`: the images without a registry (a debootstrap Debian as ``python:3.11-slim``,
  the Dockerfile built with buildah, a busybox pause), cached between runs;
- :mod:`.scenarios`: the steps, each timed and named when it fails (``python -m
  tests.support.realnode``).
"""
