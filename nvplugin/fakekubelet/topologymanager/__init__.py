"""The fake kubelet's topology manager (the kubelet's ``pkg/kubelet/cm/topologymanager``).

Modules, where a kubelet engineer expects them:

- :mod:`.bitmask`: :class:`BitMask`, NUMA node sets with the kubelet's orderings.
- :mod:`.policy`: :class:`TopologyHint`, :class:`NumaInfo`, filtering and merging
  (:class:`HintMerger`, exact and fast), policies none / best-effort / restricted /
  single-numa-node.
- :mod:`.scope`: the :class:`HintProvider` seam, scopes container / pod / none, admission
  results and errors.
- :mod:`.options`: policy options and start-up checks with the kubelet's texts.
- :mod:`.manager`: :func:`new_manager` (the kubelet's ``NewManager``) and :class:`Manager`.
- :mod:`.hints`: :func:`generate_hints`, the hint generator the device and CPU managers share.

Typical use::

    manager = new_manager(NumaInfo.from_distances(topology.numa_distances), "single-numa-node")
    manager.add_hint_provider(device_manager)   # then the CPU manager
    result = manager.admit(pod)                 # PodAdmitResult(admit, reason, message)
    manager.stored_affinity(pod.uid, "main")    # TopologyHint or None
"""

from nvplugin.fakekubelet.topologymanager.bitmask import BitMask, iterate_bitmasks
from nvplugin.fakekubelet.topologymanager.hints import generate_hints
from nvplugin.fakekubelet.topologymanager.manager import Manager, new_manager
from nvplugin.fakekubelet.topologymanager.options import (
    PolicyOptions,
    StartupError,
    new_policy_options,
    parse_policy_options_flag,
    validate_config,
)
from nvplugin.fakekubelet.topologymanager.policy import (
    HintMerger,
    NumaInfo,
    Policy,
    ProviderHints,
    TopologyHint,
    new_policy,
)
from nvplugin.fakekubelet.topologymanager.scope import (
    MESSAGE_TOPOLOGY_AFFINITY,
    REASON_TOPOLOGY_AFFINITY,
    REASON_UNEXPECTED,
    AdmissionError,
    AllocationError,
    HintProvider,
    PodAdmitResult,
    Store,
    TopologyAffinityError,
    UnexpectedAdmissionError,
)

__all__ = [
    "MESSAGE_TOPOLOGY_AFFINITY",
    "REASON_TOPOLOGY_AFFINITY",
    "REASON_UNEXPECTED",
    "AdmissionError",
    "AllocationError",
    "BitMask",
    "HintMerger",
    "HintProvider",
    "Manager",
    "NumaInfo",
    "PodAdmitResult",
    "Policy",
    "PolicyOptions",
    "ProviderHints",
    "StartupError",
    "Store",
    "TopologyAffinityError",
    "TopologyHint",
    "UnexpectedAdmissionError",
    "generate_hints",
    "iterate_bitmasks",
    "new_manager",
    "new_policy",
    "new_policy_options",
    "parse_policy_options_flag",
    "validate_config",
]
