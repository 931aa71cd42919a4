"""The Kubernetes API: the one small module that talks to it, on lightkube (an asyncio client on
httpx; chosen over the official ``kubernetes`` and ``kubernetes_asyncio`` clients for its import
time and memory, see the README). Nothing else in the package imports lightkube.

- :mod:`.access`: how to reach the API (a kubeconfig file, else the in-cluster service account);
  pure, imports no client, so that reading the settings costs nothing.
- :mod:`.client`: the client from those credentials, every request bounded in time.
- :mod:`.node`: the own Node: get it, and follow its labels (list, then watch from the list's
  resourceVersion; resume a dropped watch, list again on 410 Gone; capped backoff while the API
  is away).

- :mod:`.nodefeature`: GPU Feature Discovery's NodeFeature object (NFD's
  ``nfd.k8s-sigs.io/v1alpha1``): created or updated to say the node's labels, owned by the pod.

:mod:`.client`, :mod:`.node` and :mod:`.nodefeature` import lightkube; import them only where the
API is used (``plugin/selection.py``, ``plugin/nodefeature.py``, lazily).
"""

from nvplugin.kube.kubeconfig import ApiAccess

__all__ = ["ApiAccess"]
