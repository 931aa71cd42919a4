"""The admission pipeline behind ``nvplugin admit``: "if I deploy these pods on this node, with
this kubelet configuration, which are admitted, and which GPUs and CPUs do they get?"

It runs the real plugin -- ``nvplugin serve --simulate NODE`` as a subprocess on a temporary
device-plugin directory -- and the fake kubelet in this process against it, over real unix
sockets: registration, ListAndWatch, GetPreferredAllocation and Allocate are the calls a real
kubelet would make. The kubelet side is the topology manager with the device manager and the CPU
manager as hint providers, in the kubelet's order. Pods are admitted one after the other in file
order; admitted pods keep their devices and CPUs, a rejected pod gives back whatever its earlier
containers took (the kubelet reclaims devices of pods that are not active).

The NUMA layout and CPUs come from the same node the plugin simulates: this process discovers it
too (:func:`nvplugin.node.load_topology`), which also maps the plugin's device IDs (UUIDs) back
to GPU indices for the report.

When the plugin dies mid-run the kubelet sees its ListAndWatch stream end and marks every GPU
unhealthy; later pods are then rejected with the kubelet's own message, and the report says what
happened to the plugin (:attr:`AdmitReport.plugin_failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from nvplugin.config import Config, load_config
from nvplugin.errors import InputError, NvpluginError
from nvplugin.kubelet.cpumanager import POLICIES as CPU_POLICIES
from nvplugin.kubelet.cpumanager import CpuManager, parse_cpu_list, reserved_cpus
from nvplugin.kubelet.devicemanager.manager import DeviceManager
from nvplugin.kubelet.kubelet import FakeKubelet
from nvplugin.kubelet.pods import Pod
from nvplugin.kubelet.topologymanager import (
    Manager,
    NumaInfo,
    PodAdmitResult,
    StartupError,
    new_manager,
    new_policy_options,
    validate_config,
)
from nvplugin.kubelet.topologymanager.options import POLICY_NONE
from nvplugin.node.model import Topology, format_cpu_list
from nvplugin.plugin.resources import plan_for
from nvplugin.plugin.sharing import REPLICA_SEPARATOR

RESOURCE = "nvidia.com/gpu"
REGISTER_TIMEOUT_S = 30.0
"""How long the plugin may take to start, register and list its GPUs."""
DISCONNECT_TIMEOUT_S = 5.0
"""How long the kubelet side may take to notice a dead plugin's stream ending."""

_log = structlog.get_logger("nvplugin.kubelet.admit")


@dataclass(frozen=True)
class AdmitSettings:
    """The kubelet flags ``nvplugin admit`` takes (kubelet defaults), and the node."""

    simulate: str | None = None
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    cpu_manager_policy: str = "none"
    reserved_cpus: str | None = None
    config: str | None = None
    """The plugin's config file (``nvplugin serve --config``): resources by model, time-slicing."""
    mig_strategy: str | None = None
    """``nvplugin serve --mig-strategy`` (None: the config file's, else none)."""
    kill_plugin_after: str | None = None
    """Testing aid: SIGKILL the plugin right after this pod is admitted (or rejected)."""


@dataclass(frozen=True)
class ContainerResult:
    """What one container got."""

    name: str
    devices: Mapping[str, tuple[str, ...]]  # resource -> device IDs (GPUs in index order)
    gpu_indices: tuple[int, ...]  # every GPU it uses: whole, or as a MIG device's parent
    cpus: tuple[int, ...]  # exclusive CPUs; empty = the shared pool
    numa_nodes: tuple[int, ...] | None  # stored topology hint; None = none stored / don't care
    mig_devices: tuple[str, ...] = ()  # its MIG devices, ``<gpu>:<mig index>``, in index order

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": {r: list(ids) for r, ids in self.devices.items()},
            "gpu_indices": list(self.gpu_indices),
            "mig_devices": list(self.mig_devices),
            "cpus": list(self.cpus),
            "numa_nodes": None if self.numa_nodes is None else list(self.numa_nodes),
        }


@dataclass(frozen=True)
class PodResult:
    """One pod's admission, as the kubelet would report it."""

    pod: str
    admitted: bool
    reason: str | None
    message: str | None
    containers: tuple[ContainerResult, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "admitted": self.admitted,
            "reason": self.reason,
            "message": self.message,
            "containers": [c.as_json() for c in self.containers],
        }


@dataclass(frozen=True)
class AdmitReport:
    topology: Topology
    settings: AdmitSettings
    results: tuple[PodResult, ...]
    plugin_failure: str | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def as_json(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self.results]


# --- configuration checks (all before anything starts) ----------------------------------------


def check_settings(settings: AdmitSettings) -> None:
    """The kubelet's flag validation: policy and scope names, options, CPU manager policy.

    Options are checked only under a policy other than ``none``, as the kubelet reads them only
    then (its ``NewManager`` returns before parsing them); under ``none`` the report notes that
    they were not read (:func:`settings_notes`).
    """
    validate_config(settings.topology_manager_policy, settings.topology_manager_scope)
    if settings.topology_manager_policy != POLICY_NONE:
        try:
            new_policy_options(settings.topology_manager_policy_options)
        except StartupError as exc:
            raise StartupError(f"--topology-manager-policy-options: {exc}") from None
    if settings.cpu_manager_policy not in CPU_POLICIES:
        allowed = ", ".join(CPU_POLICIES)
        raise InputError(
            f'--cpu-manager-policy: unknown policy: "{settings.cpu_manager_policy}" '
            f"(one of {allowed})"
        )
    if settings.reserved_cpus is not None:
        parse_cpu_list(settings.reserved_cpus, "--reserved-cpus")


def settings_notes(settings: AdmitSettings) -> list[str]:
    """What the report should say about settings the kubelet accepts but does not use."""
    if settings.topology_manager_policy == POLICY_NONE and settings.topology_manager_policy_options:
        names = ", ".join(sorted(settings.topology_manager_policy_options))
        return [
            f"--topology-manager-policy-options ({names}) not read: the kubelet reads them "
            "only under a topology manager policy other than none"
        ]
    return []


def build_managers(
    settings: AdmitSettings, topology: Topology, checkpoint_dir: str | None
) -> tuple[Manager, DeviceManager, CpuManager]:
    """Topology manager, device manager, CPU manager for ``topology``, wired as the kubelet's.

    Raises :class:`StartupError` with the kubelet's texts (e.g. more NUMA nodes than allowed),
    in the kubelet's order: reserved CPUs (read when it starts), then the managers.
    """
    reserved = (
        reserved_cpus(settings.reserved_cpus, topology.cpus)
        if settings.reserved_cpus is not None
        else ()
    )
    numa = NumaInfo.from_distances(topology.numa_distances)
    try:
        manager = new_manager(
            numa,
            settings.topology_manager_policy,
            settings.topology_manager_scope,
            settings.topology_manager_policy_options,
        )
    except StartupError as exc:
        raise StartupError(f"topology manager: {exc}") from None
    devices = DeviceManager(
        numa_nodes=topology.numa_nodes, store=manager, checkpoint_dir=checkpoint_dir
    )
    try:
        cpus = CpuManager.from_topology(settings.cpu_manager_policy, topology, manager, reserved)
    except StartupError as exc:
        raise StartupError(f"cpu manager: {exc}") from None
    manager.add_hint_provider(devices.hint_provider)
    manager.add_hint_provider(cpus)
    return manager, devices, cpus


# --- the plugin process ------------------------------------------------------------------------


class PluginProcess:
    """``nvplugin serve --simulate NODE`` on ``directory``; its log goes to a file there."""

    def __init__(
        self,
        directory: str,
        simulate: str | None,
        config: str | None = None,
        mig_strategy: str | None = None,
    ) -> None:
        self.directory = directory
        self.log_path = os.path.join(directory, "serve.log")
        command = [sys.executable, "-m", "nvplugin", "serve", "--device-plugin-dir", directory]
        command += ["--log-format", "json"]
        if simulate is not None:
            command += ["--simulate", simulate]
        if config is not None:
            command += ["--config", config]
        if mig_strategy is not None:
            command += ["--mig-strategy", mig_strategy]
        # The user's NVPLUGIN_* settings must not redirect this private plugin elsewhere.
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVPLUGIN_")}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (the plugin exits 0 within 2 s), SIGKILL if it does not."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()

    def describe_exit(self) -> str:
        code = self.process.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
        return f"the device plugin (nvplugin serve, pid {self.pid}) {how}"


# --- the admission run -------------------------------------------------------------------------


class Admission:
    """The fake kubelet with the real plugin; admit pods one by one (``async with``)."""

    def __init__(self, settings: AdmitSettings, topology: Topology) -> None:
        check_settings(settings)
        self.settings = settings
        self.topology = topology
        self.directory = tempfile.mkdtemp(dir="/tmp", prefix="nvplugin-admit-")
        try:
            self.manager, self.devices, self.cpus = build_managers(
                settings, topology, self.directory
            )
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        config = plugin_config(settings)
        self.mig_strategy = config.mig_strategy
        self.expected = expected_resources(config, topology)
        self._active: set[str] = set()
        self._current: str | None = None
        self.devices.active_pods = self._active_pods
        self.kubelet = FakeKubelet(self.directory, devices=self.devices)
        self.observer = self.kubelet.observer
        self.plugin: PluginProcess | None = None
        self.plugin_failure: str | None = None
        self.notes: list[str] = settings_notes(settings)

    def _active_pods(self) -> Iterable[str]:
        if self._current is not None:
            return self._active | {self._current}
        return self._active

    async def start(self) -> None:
        await self.kubelet.start()
        self.plugin = PluginProcess(
            self.directory, self.settings.simulate, self.settings.config, self.mig_strategy
        )
        expected = self.expected
        wanted = ", ".join(f"{name} with {count} devices" for name, count in expected.items())
        wait = asyncio.ensure_future(
            self.observer.wait_for(
                lambda m: all(
                    m.is_registered(name) and len(m.devices(name)) == count
                    for name, count in expected.items()
                ),
                REGISTER_TIMEOUT_S,
                f"the plugin to register {wanted}",
            )
        )
        try:
            while not wait.done():
                if not self.plugin.alive:
                    wait.cancel()
                    raise NvpluginError(
                        f"{self.plugin.describe_exit()} before registering:\n"
                        f"{self.plugin.log_tail()}"
                    )
                await asyncio.wait({wait}, timeout=0.05)
            wait.result()
        except TimeoutError as exc:
            raise NvpluginError(str(exc)) from None
        finally:
            if not wait.done():
                wait.cancel()
                with contextlib.suppress(BaseException):
                    await wait

    async def stop(self) -> None:
        try:
            if self.plugin is not None:
                await asyncio.to_thread(self.plugin.stop)
            await self.kubelet.stop()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    async def __aenter__(self) -> Admission:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _check_plugin(self, before: str) -> None:
        """Notice a plugin that died, once: wait until the kubelet side has seen it go."""
        if self.plugin is None or self.plugin.alive or self.plugin_failure is not None:
            return
        with contextlib.suppress(TimeoutError):
            await self.observer.wait_for(
                lambda m: not any(m.is_registered(name) for name in self.expected),
                DISCONNECT_TIMEOUT_S,
                "the kubelet to notice the plugin exit",
            )
        self.plugin_failure = (
            f"{self.plugin.describe_exit()} before pod {before!r} was admitted; the kubelet "
            "marked its GPUs unhealthy, so from then on pods that need GPUs are rejected"
        )
        # Info, not warning: ``nvplugin admit`` itself reports this to the user (once).
        _log.info("device plugin gone", detail=self.plugin_failure)

    async def admit(self, pod: Pod) -> PodResult:
        await self._check_plugin(pod.name)
        self._current = pod.uid
        try:
            result: PodAdmitResult = await asyncio.to_thread(self.manager.admit, pod)
        finally:
            self._current = None
        if result.admit:
            self._active.add(pod.uid)
            for container in pod.all_containers:
                try:
                    await self.devices.prepare_container(pod, container)
                except NvpluginError as exc:
                    self.notes.append(f"pod {pod.name!r} container {container.name!r}: {exc}")
            containers = tuple(self._container_result(pod, c.name) for c in pod.all_containers)
        else:
            self.manager.remove_pod(pod.uid)
            self.cpus.remove_pod(pod.uid)
            self.devices.remove_pods([pod.uid])
            containers = tuple(
                ContainerResult(c.name, {}, (), (), None) for c in pod.all_containers
            )
        if self.settings.kill_plugin_after == pod.name and self.plugin is not None:
            self.plugin.kill()
        return PodResult(pod.name, result.admit, result.reason, result.message, containers)

    def _container_result(self, pod: Pod, name: str) -> ContainerResult:
        devices: dict[str, tuple[str, ...]] = {}
        indices: list[int] = []
        migs: dict[tuple[int, int], str] = {}
        for entry in self.devices.allocations():
            if entry.pod_uid != pod.uid or entry.container != name:
                continue
            # Device IDs are GPU or MIG UUIDs, or ``<uuid>::<n>`` replicas under time-slicing:
            # list them in GPU (then MIG) index order; IDs of nothing known (none expected) go
            # last. A MIG device counts its parent among the GPUs the container uses.
            ids = sorted(entry.device_ids)
            order: dict[str, tuple[int, int]] = {}
            for device_id in ids:
                found = self.topology.owner(device_id.split(REPLICA_SEPARATOR)[0])
                if found is not None:
                    gpu, mig = found
                    order[device_id] = (gpu.index, -1 if mig is None else mig.index)
                    if mig is not None:
                        migs[order[device_id]] = mig.label
            ids.sort(key=lambda i: (i not in order, order.get(i, (0, 0)), i))
            indices.extend(gpu for gpu, _ in order.values())
            devices[entry.resource] = tuple(ids)
        hint = self.manager.stored_affinity(pod.uid, name)
        numa = None
        if hint is not None and hint.numa_affinity is not None:
            numa = tuple(sorted(hint.numa_affinity.get_bits()))
        return ContainerResult(
            name,
            devices,
            tuple(sorted(set(indices))),
            self.cpus.cpus(pod.uid, name),
            numa,
            tuple(label for _, label in sorted(migs.items())),
        )


def plugin_config(settings: AdmitSettings) -> Config:
    """The config of the private plugin ``admit`` starts: the file alone (the plugin ignores the
    user's ``NVPLUGIN_*`` environment) and the MIG strategy, which ``admit`` passes as a flag
    so that an inherited ``MIG_STRATEGY`` cannot change it behind the report's back."""
    flags = {} if settings.mig_strategy is None else {"flags.migStrategy": settings.mig_strategy}
    return load_config(settings.config, env={}, flags=flags)


def expected_resources(config: Config, topology: Topology) -> dict[str, int]:
    """The resources the plugin will register on this node under ``config``, with their device
    counts: the plugin's own resource plan (MIG strategy, resources by model, exclusions,
    time-slicing replicas)."""
    plan = plan_for(config, topology.gpus)
    return {served.name: served.device_count for served in plan.resources}


async def admit_pods(
    settings: AdmitSettings, pods: Sequence[Pod], topology: Topology
) -> AdmitReport:
    """Admit ``pods`` in order on a fresh fake kubelet with the real plugin (see module doc)."""
    results = []
    async with Admission(settings, topology) as admission:
        for pod in pods:
            results.append(await admission.admit(pod))
        failure = admission.plugin_failure
        if failure is None and admission.plugin is not None and not admission.plugin.alive:
            failure = f"{admission.plugin.describe_exit()} during the run"
        return AdmitReport(topology, settings, tuple(results), failure, tuple(admission.notes))


def run_admit(settings: AdmitSettings, pods_path: str) -> AdmitReport:
    """Everything ``nvplugin admit`` does but printing: checks, node, pods, admission."""
    from nvplugin.kubelet.pods import load_pod_file
    from nvplugin.node import load_topology

    check_settings(settings)
    pods = load_pod_file(pods_path)
    topology = load_topology(settings.simulate)
    report = asyncio.run(admit_pods(settings, pods, topology))
    return replace(report, warnings=numa_warnings(settings, topology))


def numa_warnings(settings: AdmitSettings, topology: Topology) -> tuple[str, ...]:
    """What GPUs without a NUMA node do to admission under a topology-manager policy.

    The kubelet counts only devices with a NUMA node when it makes topology hints
    (kubelet-behaviour.md §3). When some GPUs have one and some do not, the others can never
    satisfy a hint: under single-numa-node and restricted they are never allocated, and a pod
    needing them is rejected. When no GPU has one, the resource has no topology at all.
    """
    policy = settings.topology_manager_policy
    if policy == "none":
        return ()
    missing = [g.index for g in topology.gpus if g.numa_node is None]
    if not missing:
        return ()
    if len(missing) == len(topology.gpus):
        return (
            f"no GPU of this node has a NUMA node (nvidia-smi: NUMA Affinity N/A), so the "
            f"kubelet gives its GPUs no topology hints ('don't care'): the {policy} policy "
            "admits GPU pods without aligning them with CPUs or with each other",
        )
    which = ", ".join(map(str, missing))
    it, has = ("it", "has") if len(missing) == 1 else ("them", "have")
    if policy in ("single-numa-node", "restricted"):
        effect = (
            f"under {policy} GPU {which} {'is' if it == 'it' else 'are'} never allocated: a pod "
            "that needs more GPUs than the others have free is rejected with "
            "TopologyAffinityError, as the real kubelet does"
        )
    else:
        effect = f"under {policy} a pod that needs {it} is admitted without a preferred alignment"
    return (
        f"GPU {which} {has} no NUMA node (nvidia-smi: NUMA Affinity N/A) while the other GPUs "
        f"have one. The kubelet counts only GPUs with a NUMA node in its topology hints, so "
        f"{effect}. Give {it} a numa_node in the node file (on a real node: fix the firmware's "
        "ACPI SRAT so that sysfs reports one)",
    )


# --- output ------------------------------------------------------------------------------------


def to_json(report: AdmitReport) -> str:
    return json.dumps(report.as_json(), indent=2)


def format_gpus(topology: Topology, indices: Sequence[int], mig: Sequence[str] = ()) -> str:
    """GPU indices grouped by NUMA node: ``0,1 (NUMA 3)``, ``2 (NUMA 1), 4 (NUMA 7)``; then MIG
    devices (``<gpu>:<mig index>``) likewise: ``MIG 2:2,2:3 (NUMA 1)``. Parents of ``mig`` are
    not listed as GPUs of their own."""
    parents = {int(label.split(":")[0]) for label in mig}
    whole = _by_numa(topology, [(str(i), i) for i in sorted(indices) if i not in parents])
    devices = _by_numa(topology, [(label, int(label.split(":")[0])) for label in mig])
    if devices:
        devices[0] = f"MIG {devices[0]}"
    return ", ".join(whole + devices) or "-"


def _by_numa(topology: Topology, items: Sequence[tuple[str, int]]) -> list[str]:
    """Labels (each with its GPU) grouped by consecutive NUMA node: ``0,1 (NUMA 3)``."""
    groups: list[tuple[int | None, list[str]]] = []
    for label, gpu in items:
        node = topology.gpus[gpu].numa_node
        if groups and groups[-1][0] == node:
            groups[-1][1].append(label)
        else:
            groups.append((node, [label]))
    return [
        ",".join(labels) + (f" (NUMA {node})" if node is not None else " (no NUMA)")
        for node, labels in groups
    ]


def summary_line(report: AdmitReport) -> str:
    s = report.settings
    topo = report.topology
    node = s.simulate or topo.name
    cpu = s.cpu_manager_policy
    if s.reserved_cpus:
        cpu += f" (reserved {format_cpu_list(parse_cpu_list(s.reserved_cpus))})"
    return (
        f"node {node}: {len(topo.gpus)} GPUs, {len(topo.numa_nodes)} NUMA nodes, "
        f"{len(topo.cpus.cpus)} CPUs; topology manager {s.topology_manager_policy} "
        f"(scope {s.topology_manager_scope}); CPU manager {cpu}"
    )


def to_table(report: AdmitReport) -> str:
    """For people: one row per container; a rejected pod's reason under its row."""
    header = ("POD", "CONTAINER", "RESULT", "GPUS", "CPUS", "NUMA")
    rows: list[tuple[str, ...]] = []
    reasons: dict[int, str] = {}
    for result in report.results:
        if not result.admitted:
            names = ",".join(c.name for c in result.containers) or "-"
            rows.append((result.pod, names, "rejected", "-", "-", "-"))
            reasons[len(rows) - 1] = f"{result.reason}: {result.message}"
            continue
        for i, c in enumerate(result.containers):
            numa = "-" if c.numa_nodes is None else ",".join(map(str, c.numa_nodes))
            rows.append(
                (
                    result.pod if i == 0 else "",
                    c.name,
                    "admitted" if i == 0 else "",
                    format_gpus(report.topology, c.gpu_indices, c.mig_devices),
                    format_cpu_list(c.cpus) or "shared",
                    numa,
                )
            )
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [summary_line(report), "", line(header)]
    for n, row in enumerate(rows):
        out.append(line(row))
        if n in reasons:
            out.append(f"  -> {reasons[n]}")
    admitted = sum(r.admitted for r in report.results)
    out.append("")
    out.append(f"{admitted} of {len(report.results)} pods admitted")
    for note in report.notes:
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"
