"""The Kubernetes API: the one small module that talks to it, on lightkube (an asyncio client on
httpx; chosen over the official ``kubernetes`` and ``kubernetes_asyncio`` clients for its import
time and memory, see the README). Nothing else in the package imports lightkube.

- :mod:`.access`: how to reach the API (a kubeconfig file, else the in-cluster service account);
  pure, imports no client, so that reading the settings costs nothing.
- :mod:`.client`: the client from those credentials, every request bounded in time.
- :mod:`.node`: the own Node: get it, and follow its labels (list, then watch from the list's
  resourceVersion; resume a dropped watch, list again on 410 Gone; capped backoff while the API
  is away).

Room is left for what GPU Feature Discovery will need (creating and updating a namespaced custom
object, a NodeFeature) beside :mod:`.node`, on the same client. :mod:`.client` and :mod:`.node`
import lightkube; import them only where the API is used.
"""

from nvplugin.kube.access import ApiAccess

__all__ = ["ApiAccess"]
