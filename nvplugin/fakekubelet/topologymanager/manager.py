"""The topology manager itself (the kubelet's ``topology_manager.go``): built once at start-up
from the policy, scope and options flags, then asked to admit pods.

``new_manager`` follows the kubelet's ``NewManager`` step by step, so the same flags fail with
the same text (see :mod:`~nvplugin.fakekubelet.topologymanager.options` for the order). Providers
are added afterwards with :meth:`Manager.add_hint_provider` (device manager first, then CPU
manager, as the kubelet does); they read merged hints back through the manager, which is their
:class:`~nvplugin.fakekubelet.topologymanager.scope.Store`.
"""

from __future__ import annotations

from collections.abc import Mapping

from nvplugin.fakekubelet.pods import Pod
from nvplugin.fakekubelet.topologymanager.options import (
    POLICY_NONE,
    SCOPE_CONTAINER,
    SCOPE_POD,
    PolicyOptions,
    StartupError,
    new_policy_options,
)
from nvplugin.fakekubelet.topologymanager.policy import NumaInfo, Policy, TopologyHint, new_policy
from nvplugin.fakekubelet.topologymanager.scope import (
    ContainerScope,
    HintProvider,
    NoneScope,
    PodAdmitResult,
    PodScope,
    Scope,
)


class Manager:
    """Admits pods through its scope and remembers each container's merged hint."""

    def __init__(self, scope: Scope, options: PolicyOptions | None = None) -> None:
        self.scope = scope
        self.options = options or PolicyOptions()

    @property
    def policy(self) -> Policy:
        return self.scope.policy

    @property
    def policy_name(self) -> str:
        return self.scope.policy.name

    @property
    def scope_name(self) -> str:
        return self.scope.name

    def add_hint_provider(self, provider: HintProvider) -> None:
        self.scope.add_hint_provider(provider)

    def admit(self, pod: Pod) -> PodAdmitResult:
        return self.scope.admit(pod)

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        """The stored hint, or ``TopologyHint(None, False)`` when none (the kubelet's zero)."""
        return self.scope.get_affinity(pod_uid, container_name)

    def stored_affinity(self, pod_uid: str, container_name: str) -> TopologyHint | None:
        """The stored hint for reporting; None when the manager stored none (policy none)."""
        return self.scope.stored_affinity(pod_uid, container_name)

    def remove_pod(self, pod_uid: str) -> None:
        self.scope.remove_pod(pod_uid)


def new_manager(
    numa: NumaInfo,
    policy_name: str,
    scope_name: str = SCOPE_CONTAINER,
    policy_options: Mapping[str, str] | None = None,
    *,
    naive: bool = False,
) -> Manager:
    """Build the manager like the kubelet's ``NewManager``; raises :class:`StartupError`.

    Order: policy ``none`` short-circuits (options and scope are not looked at); options;
    NUMA distances when ``prefer-closest-numa-nodes`` is on; the NUMA node limit; the policy
    name; the scope name. ``naive`` makes the policy merge the kubelet's exponential way.
    """
    if policy_name == POLICY_NONE:
        return Manager(NoneScope())
    options = new_policy_options(policy_options)
    if options.prefer_closest_numa and numa.distances is None:
        raise StartupError(
            "cannot discover NUMA topology: error getting NUMA distances from cadvisor"
        )
    if len(numa.nodes) > options.max_allowable_numa_nodes:
        raise StartupError(
            f"unsupported on machines with more than {options.max_allowable_numa_nodes} NUMA Nodes"
        )
    policy = new_policy(policy_name, numa, options, naive)
    scope: Scope
    if scope_name == SCOPE_CONTAINER:
        scope = ContainerScope(policy)
    elif scope_name == SCOPE_POD:
        scope = PodScope(policy)
    else:
        raise StartupError(f'unknown scope: "{scope_name}"')
    return Manager(scope, options)
