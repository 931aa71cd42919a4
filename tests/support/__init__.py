"""What tests share: the run's scratch directory (:mod:`.rundir`), ``nvplugin serve`` as a
subprocess beside the fake kubelet (:mod:`.serve`), one DevicePlugin service on a socket
(:mod:`.service`), the reliability harness (:mod:`.harness`), named topologies and the brute-force
allocation reference (:mod:`.topologies`, :mod:`.reference`), and the large generated nodes of
the benchmarks (:mod:`.bignodes`). Waiting (:data:`tests.WAIT_S`) stays in ``tests/__init__.py``."""
