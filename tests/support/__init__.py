"""What tests share: the run's scratch directory (:mod:`.rundir`), ``nvplugin serve`` as a
subprocess beside the fake kubelet (:mod:`.serve`), one DevicePlugin service on a socket
(:mod:`.service`), the reliability harness (:mod:`.harness`), named topologies and the brute-force
allocation reference (:mod:`.topologies`, :mod:`.reference`), the count search oracle for nodes
of a few classes (:mod:`.counts`, on :mod:`.forests`), the large generated nodes of the
benchmarks (:mod:`.bignodes`), and for per-node configs a Kubernetes API server for Nodes
(:mod:`.kubeapi`) and a ConfigMap volume written the kubelet's way (:mod:`.configmap`). Waiting
(:data:`tests.WAIT_S`) stays in ``tests/__init__.py``."""
