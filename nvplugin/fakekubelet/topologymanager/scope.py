"""Scopes: which hints get merged, and when providers allocate (the kubelet's ``scope*.go``).

This is the seam between the topology manager and the resource managers (device manager, CPU
manager). A resource manager is a :class:`HintProvider`:

- ``get_topology_hints(pod, container)`` / ``get_pod_topology_hints(pod)``: resource name ->
  hints (``None`` = don't care, ``[]`` = impossible), or ``None`` / ``{}`` for no opinion;
- ``allocate(pod, container)``: take the container's resources, reading the merged hint from the
  :class:`Store` it was given (``get_affinity(pod.uid, container.name)``); it raises
  :class:`AllocationError` (shown as ``UnexpectedAdmissionError``) or an :class:`AdmissionError`
  subclass that carries its own reason.

Scopes (docs/kubelet-behaviour.md#merge-and-policies):

- ``container``: for each init container, then each app container: merge that container's hints;
  a refusal rejects the whole pod (resources already taken by earlier containers stay taken, as
  in the kubelet); otherwise store the hint and call every provider's ``allocate`` in order.
- ``pod``: one merge over the pod-scope hints; the same hint is stored for every container, then
  allocation container by container.
- ``none`` (policy ``none``): no hints at all; every provider's ``allocate`` for each container.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.fakekubelet.topologymanager.options import SCOPE_CONTAINER, SCOPE_POD
from nvplugin.fakekubelet.topologymanager.policy import (
    NonePolicy,
    Policy,
    ProviderHints,
    TopologyHint,
)

REASON_TOPOLOGY_AFFINITY = "TopologyAffinityError"
MESSAGE_TOPOLOGY_AFFINITY = "Resources cannot be allocated with Topology locality"
REASON_UNEXPECTED = "UnexpectedAdmissionError"

NO_AFFINITY = TopologyHint(None, False)
"""What :meth:`Store.get_affinity` answers when nothing was stored (the kubelet's zero hint)."""


class AllocationError(Exception):
    """A provider could not allocate; the pod is rejected with ``UnexpectedAdmissionError`` and
    ``Allocate failed due to <str(error)>, which is unexpected``."""


class AdmissionError(Exception):
    """An admission failure with its own reason (the kubelet's ``admission.Error``)."""

    reason = REASON_UNEXPECTED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TopologyAffinityError(AdmissionError):
    reason = REASON_TOPOLOGY_AFFINITY

    def __init__(self) -> None:
        super().__init__(MESSAGE_TOPOLOGY_AFFINITY)


class UnexpectedAdmissionError(AdmissionError):
    reason = REASON_UNEXPECTED

    def __init__(self, error: object) -> None:
        super().__init__(f"Allocate failed due to {error}, which is unexpected")
        self.error = error


@dataclass(frozen=True, slots=True)
class PodAdmitResult:
    """The kubelet's ``PodAdmitResult``: reason and message are None when admitted."""

    admit: bool
    reason: str | None = None
    message: str | None = None

    @classmethod
    def admitted(cls) -> PodAdmitResult:
        return cls(True)

    @classmethod
    def from_error(cls, error: AdmissionError | AllocationError) -> PodAdmitResult:
        if not isinstance(error, AdmissionError):
            error = UnexpectedAdmissionError(error)
        return cls(False, error.reason, error.message)


class HintProvider(Protocol):
    """A resource manager the topology manager consults (device manager, CPU manager)."""

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints: ...

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints: ...

    def allocate(self, pod: Pod, container: Container) -> None: ...


class Store(Protocol):
    """Where providers read the merged hint for a container during ``allocate``."""

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint: ...


class Scope:
    """State shared by the scopes: the policy, the providers, the stored hint per container."""

    name = "none"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.providers: list[HintProvider] = []
        self._hints: dict[str, dict[str, TopologyHint]] = {}

    def add_hint_provider(self, provider: HintProvider) -> None:
        self.providers.append(provider)

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        return self._hints.get(pod_uid, {}).get(container_name, NO_AFFINITY)

    def stored_affinity(self, pod_uid: str, container_name: str) -> TopologyHint | None:
        """The hint stored for the container, or None when none was stored."""
        return self._hints.get(pod_uid, {}).get(container_name)

    def set_affinity(self, pod_uid: str, container_name: str, hint: TopologyHint) -> None:
        self._hints.setdefault(pod_uid, {})[container_name] = hint

    def remove_pod(self, pod_uid: str) -> None:
        self._hints.pop(pod_uid, None)

    def _allocate(self, pod: Pod, container: Container) -> None:
        for provider in self.providers:
            provider.allocate(pod, container)

    def admit(self, pod: Pod) -> PodAdmitResult:
        """Policy ``none``: allocate every container, no hints."""
        try:
            for container in pod.all_containers:
                self._allocate(pod, container)
        except (AdmissionError, AllocationError) as exc:
            return PodAdmitResult.from_error(exc)
        return PodAdmitResult.admitted()


class NoneScope(Scope):
    name = "none"

    def __init__(self) -> None:
        super().__init__(NonePolicy())


class ContainerScope(Scope):
    name = SCOPE_CONTAINER

    def accumulate_providers_hints(self, pod: Pod, container: Container) -> list[ProviderHints]:
        return [p.get_topology_hints(pod, container) for p in self.providers]

    def calculate_affinity(self, pod: Pod, container: Container) -> tuple[TopologyHint, bool]:
        return self.policy.merge(self.accumulate_providers_hints(pod, container))

    def admit(self, pod: Pod) -> PodAdmitResult:
        try:
            for container in pod.all_containers:
                best, admit = self.calculate_affinity(pod, container)
                if not admit:
                    raise TopologyAffinityError()
                self.set_affinity(pod.uid, container.name, best)
                self._allocate(pod, container)
        except (AdmissionError, AllocationError) as exc:
            return PodAdmitResult.from_error(exc)
        return PodAdmitResult.admitted()


class PodScope(Scope):
    name = SCOPE_POD

    def accumulate_providers_hints(self, pod: Pod) -> list[ProviderHints]:
        return [p.get_pod_topology_hints(pod) for p in self.providers]

    def calculate_affinity(self, pod: Pod) -> tuple[TopologyHint, bool]:
        return self.policy.merge(self.accumulate_providers_hints(pod))

    def admit(self, pod: Pod) -> PodAdmitResult:
        best, admit = self.calculate_affinity(pod)
        if not admit:
            return PodAdmitResult.from_error(TopologyAffinityError())
        try:
            for container in pod.all_containers:
                self.set_affinity(pod.uid, container.name, best)
                self._allocate(pod, container)
        except (AdmissionError, AllocationError) as exc:
            return PodAdmitResult.from_error(exc)
        return PodAdmitResult.admitted()
