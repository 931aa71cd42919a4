"""The config file's schema -- NVIDIA's ``v1`` schema, read the way NVIDIA's device plugin reads
it, plus nvplugin's own settings -- and the effective configuration the plugin runs with.

Each setting is declared once, as the :class:`Config` field (or the field of a group such as
:class:`LogConfig`) that holds its effective value: its key path, kind, default, help, the
``serve`` flags and environment variables that also set it, what a reload does with a new value
(:class:`~nvplugin.config.schema.Reload`), and the Helm chart value that sets it
(:class:`~nvplugin.config.schema.Chart`). Everything else is derived from these declarations
(:mod:`nvplugin.config.declare`): the file's key tree (:data:`SCHEMA`, in the fields' order), the
loader's flags and environment variables, ``serve``'s options, :func:`build`, the reload plan
(:mod:`nvplugin.config.reload`), and, written by ``charts/generate_schema.py``, the chart's
schemas, values.yaml's setting values, the data the chart's templates turn into environment
variables and flags, and the READMEs' tables of settings and values (a test fails when any of
those files is stale).

NVIDIA's settings keep NVIDIA's key, flag and environment names and meanings
(``flags.plugin.deviceListStrategy``, ``--device-list-strategy``, ``DEVICE_LIST_STRATEGY``);
nvplugin's own settings live under ``nvplugin:`` (``NVPLUGIN_*`` variables), where no future
NVIDIA key can collide with them and NVIDIA's plugin, which ignores keys it does not know, can
still read the file. NVIDIA settings nvplugin does not implement are accepted only at their
default value: anything else is refused, naming the setting, never ignored.

Adding a setting: declare its field at its place in the file's key order, use it
(``config.<field>``), and run ``python charts/generate_schema.py``. Nothing else names it. Rules
across keys (:func:`resolve_layout`, the two endpoints' ports) stay in :func:`build`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvplugin.allocator import DEFAULT_BUDGET_S, POLICY_NAMES
from nvplugin.api import DEFAULT_DEVICE_PLUGIN_DIR, KUBELET_SOCKET
from nvplugin.config.declare import GROUP, declared, field_values, setting, tree, value_at
from nvplugin.config.layout import (
    ALLOCATIONS,
    MAX_REPLICAS,
    MIN_REPLICAS,
    MPS,
    MPS_MAX_REPLICAS,
    Exclude,
    GpuPattern,
    ReplicatedResource,
    ReplicatedResources,
    ResourceRules,
    Sharing,
    resolve_layout,
)
from nvplugin.config.rules import (
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEFAULT_CDI_KIND,
    DEFAULT_CDI_SPEC_DIR,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    MIG_STRATEGIES,
    TOOLKIT_CDI_KIND,
    absolute_path_problem,
    address_problem,
    cdi_annotation_prefix_problem,
    cdi_kind_problem,
)
from nvplugin.config.schema import (
    Bool,
    Chart,
    ChartValue,
    Duration,
    Int,
    Invalid,
    List,
    Member,
    Nullable,
    Obj,
    Reload,
    Setting,
    Str,
    format_duration,
)
from nvplugin.errors import show
from nvplugin.node.health import DEFAULT_IGNORED_XIDS, HealthSettings
from nvplugin.node.signals import (
    DEFAULT_ECC_THRESHOLD,
    DEFAULT_NVLINK_THRESHOLD,
    DEFAULT_PCIE_THRESHOLD,
    DEFAULT_POLL_S,
    DEFAULT_WINDOW_S,
    MAX_THRESHOLD,
    MIN_POLL_S,
    SignalSettings,
)
from nvplugin.resourcenames import DEFAULT_RESOURCE_NAME, resource_name_error

CONFIG_VERSION = "v1"
LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_DEVICE_LIST_STRATEGY = ("envvar",)
DEFAULT_DRIVER_ROOT = "/"
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"
DEFAULT_NVIDIA_CTK_PATH = "/usr/bin/nvidia-ctk"
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
NFD_FEATURE_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
"""GPU Feature Discovery's output file: in the directory NFD's local source reads."""
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
"""NVIDIA's chart's ``mps.root``: where MPS's pipes, logs and shared memory live on the host."""

DISCOVERY_STRATEGIES = ("auto", "nvml")
"""NVIDIA's ``deviceDiscoveryStrategy`` values nvplugin honours (it discovers through NVML)."""
MAX_XID = 2**31 - 1

_NOT_YET = "nvplugin does not support {what} yet"


def _unsupported(what: str, instead: str = "") -> str:
    return _NOT_YET.format(what=what) + (f"; {instead}" if instead else "")


def _absolute(value: str) -> str | None:
    return absolute_path_problem(value)


def _absolute_or_unset(value: str) -> str | None:
    return None if value == "" else absolute_path_problem(value)


def _version(value: str) -> str | None:
    if value == CONFIG_VERSION:
        return None
    return f"version {show(value)} is not supported; the supported version is {CONFIG_VERSION}"


def _replicated(values: dict[str, Any]) -> ReplicatedResource:
    return ReplicatedResource(values["name"], values["replicas"], values["rename"])


def _pattern(values: dict[str, Any]) -> GpuPattern:
    return GpuPattern(values["pattern"], values["name"])


_DEVICES_HELP = (
    "Which GPUs of the resource are replicated: all (NVIDIA's default). A count or a list of "
    "GPUs is not supported yet (use resources.gpus to split GPUs into resources)."
)


def _all_devices(value: object) -> object:
    if value != "all":
        raise Invalid(_unsupported("replicating a subset of a resource's GPUs", _DEVICES_HELP))
    return value


class _Devices(Str):
    """``devices`` of a time-slicing entry: NVIDIA allows ``all``, a count or a list; nvplugin
    serves ``all`` and says so for the others."""

    def check(self, value: object) -> object:
        if isinstance(value, int | list) and not isinstance(value, bool):
            return _all_devices(value)
        return _all_devices(super().check(value))


def _replicated_entry(max_replicas: int, replicas_help: str) -> Obj:
    """A ``resources`` entry of a sharing block (both blocks have NVIDIA's one shape)."""
    return Obj(
        {
            "name": Member(
                Str(non_empty=True), required=True, help="A resource this plugin serves."
            ),
            "replicas": Member(Int(MIN_REPLICAS, max_replicas), required=True, help=replicas_help),
            "rename": Member(
                Nullable(Str(non_empty=True)), help="Serve the replicas under this name instead."
            ),
            "devices": Member(_Devices(), default="all", help=_DEVICES_HELP),
        },
        make=_replicated,
        label="mapping",
    )


_REPLICATED_ENTRY = _replicated_entry(MAX_REPLICAS, "Devices advertised per GPU.")
_MPS_ENTRY = _replicated_entry(
    MPS_MAX_REPLICAS,
    f"MPS shares per GPU, each 1/replicas of its memory and threads (at most {MPS_MAX_REPLICAS}, "
    "the MPS server's clients per GPU).",
)
_PATTERN_ENTRY = Obj(
    {
        "pattern": Member(Str(non_empty=True), required=True),
        "name": Member(Str(non_empty=True), required=True),
    },
    make=_pattern,
    label="mapping",
)
_XIDS = List(Int(0, MAX_XID), comma=True)


# --- the settings: one declaration each, as the field that holds its effective value --------------
#
# The fields' order is the file's key order. Each group (LogConfig, HealthConfig,
# HealthServiceConfig) holds neighbouring keys of the file, and is declared before Config.


@dataclass(frozen=True)
class LogConfig:
    format: str | None = setting(  # None: console on a TTY, else JSON
        "nvplugin.log.format",
        Nullable(Str(choices=LOG_FORMATS)),
        None,
        help="json or console; null: console on a TTY, else json.",
        flags=("log-format",),
        env=("NVPLUGIN_LOG_FORMAT",),
        reload=Reload.IN_PLACE,
        chart=Chart.env(
            "log.format",
            "",
            "Log format: `json` or `console`. Empty: the config file's, else JSON (a pod has no "
            "TTY).",
        ),
    )
    level: str = setting(
        "nvplugin.log.level",
        Str(choices=LOG_LEVELS),
        "info",
        help="debug, info, warning or error.",
        flags=("log-level",),
        env=("NVPLUGIN_LOG_LEVEL",),
        reload=Reload.IN_PLACE,
        chart=Chart.env(
            "log.level",
            "",
            "Log level: `debug`, `info`, `warning` or `error`. Empty: the config file's, else "
            "`info`.",
        ),
    )


@dataclass(frozen=True)
class HealthConfig:
    enabled: bool = setting(
        "nvplugin.health.enabled",
        Bool(),
        True,
        help="Watch GPU health (NVML Xids).",
        reload=Reload.IN_PLACE,
    )
    ignore_xids: tuple[int, ...] = setting(
        "nvplugin.health.xids.ignore",
        _XIDS,
        (),
        help="Xids added to the ignored ones "
        f"({', '.join(map(str, sorted(DEFAULT_IGNORED_XIDS)))}).",
        reload=Reload.IN_PLACE,
    )
    critical_xids: tuple[int, ...] = setting(
        "nvplugin.health.xids.critical",
        _XIDS,
        (),
        help="Xids removed from the ignored ones.",
        reload=Reload.IN_PLACE,
    )
    only_xids: tuple[int, ...] = setting(
        "nvplugin.health.xids.only",
        _XIDS,
        (),
        help="Only these Xids make a GPU Unhealthy (a lost GPU still is); [] = every Xid not "
        "ignored. NVIDIA's DP_DISABLE_HEALTHCHECKS=all with DP_ENABLE_HEALTHCHECKS=<Xids>.",
        reload=Reload.IN_PLACE,
    )
    recovery_quiet_s: float = setting(
        "nvplugin.health.recovery.quietPeriod",
        Duration(),
        0.0,
        help="A GPU turns Healthy again after this long without a critical Xid, once a probe "
        "succeeds; 0s = never. Fabric and NVLink-down faults must stay clear this long too.",
        reload=Reload.IN_PLACE,
    )
    poll_s: float = setting(
        "nvplugin.health.poll.interval",
        Duration(minimum=MIN_POLL_S),
        DEFAULT_POLL_S,
        help="How often the polled signals (fabric, ecc, rowRemap, nvlink, pcie) are read, at "
        f"least {MIN_POLL_S:g}s.",
        reload=Reload.IN_PLACE,
    )
    window_s: float = setting(
        "nvplugin.health.poll.window",
        Duration(minimum=MIN_POLL_S),
        DEFAULT_WINDOW_S,
        help="The window a counter's rise is measured over (ecc, nvlink, pcie thresholds).",
        reload=Reload.IN_PLACE,
    )
    fabric: bool = setting(
        "nvplugin.health.fabric.enabled",
        Bool(),
        True,
        help="NVSwitch systems: a GPU whose fabric registration is not completed, or failed, "
        "is Unhealthy (nvmlDeviceGetGpuFabricInfoV).",
        reload=Reload.IN_PLACE,
    )
    ecc: bool = setting(
        "nvplugin.health.ecc.enabled",
        Bool(),
        True,
        help="A rising volatile uncorrectable ECC count makes a GPU Unhealthy until it is reset "
        "(nvmlDeviceGetTotalEccErrors).",
        reload=Reload.IN_PLACE,
    )
    ecc_threshold: int = setting(
        "nvplugin.health.ecc.threshold",
        Int(1, MAX_THRESHOLD),
        DEFAULT_ECC_THRESHOLD,
        help="New volatile uncorrectable ECC errors within the window that count.",
        reload=Reload.IN_PLACE,
    )
    row_remap: bool = setting(
        "nvplugin.health.rowRemap.enabled",
        Bool(),
        True,
        help="A pending or failed row remap makes a GPU Unhealthy until NVML clears it (a GPU "
        "reset) (nvmlDeviceGetRemappedRows).",
        reload=Reload.IN_PLACE,
    )
    nvlink: bool = setting(
        "nvplugin.health.nvlink.enabled",
        Bool(),
        True,
        help="An NVLink up at discovery that goes down, or whose CRC/replay/recovery errors "
        "climb past the threshold, makes its GPU Unhealthy (nvmlDeviceGetNvLinkState, "
        "nvmlDeviceGetNvLinkErrorCounter).",
        reload=Reload.IN_PLACE,
    )
    nvlink_threshold: int = setting(
        "nvplugin.health.nvlink.threshold",
        Int(1, MAX_THRESHOLD),
        DEFAULT_NVLINK_THRESHOLD,
        help="New errors on one link within the window that count.",
        reload=Reload.IN_PLACE,
    )
    pcie: bool = setting(
        "nvplugin.health.pcie.enabled",
        Bool(),
        True,
        help="A climbing PCIe replay counter makes a GPU Unhealthy "
        "(nvmlDeviceGetPcieReplayCounter).",
        reload=Reload.IN_PLACE,
    )
    pcie_threshold: int = setting(
        "nvplugin.health.pcie.threshold",
        Int(1, MAX_THRESHOLD),
        DEFAULT_PCIE_THRESHOLD,
        help="New PCIe replays within the window that count.",
        reload=Reload.IN_PLACE,
    )

    @property
    def ignored_xids(self) -> frozenset[int]:
        """The default ignored Xids, plus ``ignore``, minus ``critical`` (with ``only``: those
        rules do not apply, and this is empty)."""
        if self.only_xids:
            return frozenset()
        return (DEFAULT_IGNORED_XIDS | frozenset(self.ignore_xids)) - frozenset(self.critical_xids)

    def settings(self) -> HealthSettings:
        return HealthSettings(
            enabled=self.enabled,
            ignored_xids=self.ignored_xids,
            recovery_quiet_s=self.recovery_quiet_s,
            only_xids=frozenset(self.only_xids) or None,
            signals=SignalSettings(
                poll_s=self.poll_s,
                window_s=self.window_s,
                fabric=self.fabric,
                ecc=self.ecc,
                ecc_threshold=self.ecc_threshold,
                row_remap=self.row_remap,
                nvlink=self.nvlink,
                nvlink_threshold=self.nvlink_threshold,
                pcie=self.pcie,
                pcie_threshold=self.pcie_threshold,
            ),
        )


@dataclass(frozen=True)
class GfdConfig:
    """GPU Feature Discovery's settings (``flags.gfd``, GFD's flags and variables): where and how
    ``serve`` writes the node's labels (:mod:`nvplugin.labels`). Labelling is on when
    ``output_file`` is set. Applied in place on SIGHUP: the labels move or change, the
    resources stay."""

    oneshot: bool = setting(
        "flags.gfd.oneshot",
        Bool(),
        False,
        help="Label once and exit (GFD's); nvplugin serve keeps its labels current: use "
        "nvplugin labels to print them once.",
        flags=("oneshot",),
        env=("GFD_ONESHOT",),
        supported=(False,),
        unsupported=_unsupported(
            "labelling once and exiting", "nvplugin labels prints the labels once"
        ),
        reload=Reload.IN_PLACE,
    )
    no_timestamp: bool = setting(
        "flags.gfd.noTimestamp",
        Bool(),
        False,
        help="Leave out the nvidia.com/gfd.timestamp label.",
        flags=("no-timestamp",),
        env=("GFD_NO_TIMESTAMP",),
        reload=Reload.IN_PLACE,
        chart=Chart.env(
            "gfd.noTimestamp",
            None,
            "NVIDIA's (GFD's): leave out the `nvidia.com/gfd.timestamp` label. null: the config "
            "file's, else false.",
        ),
    )
    sleep_interval_s: float = setting(
        "flags.gfd.sleepInterval",
        Duration(minimum=1.0),
        60.0,
        help="How often the labels are written again although nothing changed (a feature file "
        "removed meanwhile comes back); they are rewritten at once when what is served "
        "changes.",
        flags=("sleep-interval",),
        env=("GFD_SLEEP_INTERVAL",),
        reload=Reload.IN_PLACE,
        chart=Chart.env(
            "gfd.sleepInterval",
            None,
            "NVIDIA's (GFD's): how often the labels are written again when they were removed "
            "(`60s`); they change at once with what is served. null: the config file's, else 60s.",
        ),
    )
    output_file: str | None = setting(
        "flags.gfd.outputFile",
        Nullable(Str(rule=_absolute)),
        None,
        help="Write the node's labels (GPU Feature Discovery's) to this file, written "
        "atomically and removed at exit: NFD's features.d/<name>. null: no labels.",
        flags=("output-file",),
        env=("GFD_OUTPUT_FILE",),
        reload=Reload.IN_PLACE,
        chart=Chart.when(
            "gfd.enabled",
            NFD_FEATURE_FILE,
            "NVIDIA's: label the node with GPU Feature Discovery's labels -- from the plugin pod "
            "itself, no second DaemonSet -- through Node Feature Discovery's feature files: the "
            "host's `/etc/kubernetes/node-feature-discovery/features.d` is mounted read-write. "
            "NFD is yours to deploy (this chart does not).",
        ),
    )
    machine_type_file: str = setting(
        "flags.gfd.machineTypeFile",
        Str(rule=_absolute),
        DEFAULT_MACHINE_TYPE_FILE,
        help="The file whose first line is the nvidia.com/gpu.machine label (the DMI product "
        "name); a path under /sys is read under a simulated node's sysfs.",
        flags=("machine-type-file",),
        env=("GFD_MACHINE_TYPE_FILE",),
        reload=Reload.IN_PLACE,
    )


@dataclass(frozen=True)
class HealthServiceConfig:
    """The gRPC health service's settings (``nvplugin.healthService``): NOT_SERVING while
    unregistered, and, with ``not_serving_without_healthy_gpus``, while no GPU is Healthy."""

    not_serving_without_healthy_gpus: bool = setting(
        "nvplugin.healthService.notServingWithoutHealthyGpus",
        Bool(),
        True,
        help="The gRPC health service answers NOT_SERVING while no GPU is Healthy.",
        reload=Reload.IN_PLACE,
    )


DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves its pod resources API, by default."""
TOPOLOGY_MANAGER_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_MANAGER_SCOPES = ("container", "pod")
CPU_MANAGER_POLICIES = ("none", "static")
MEMORY_MANAGER_POLICIES = ("None", "Static")


@dataclass(frozen=True)
class TopologyConfig:
    """The NodeResourceTopology publisher's settings (``nvplugin.topology``; docs/topology.md):
    whether ``serve`` publishes the node's NRT object, where it reads the kubelet's pod resources
    API, and the kubelet's policies the object says (from the kubelet's config file, or set
    here; a setting here wins)."""

    publish: bool = setting(
        "nvplugin.topology.publish",
        Bool(),
        False,
        help="Publish the node's NodeResourceTopology object (topology.node.k8s.io/v1alpha2), "
        "named NODE_NAME and owned by the Node, from the kubelet's pod resources API and the "
        "plan (docs/topology.md).",
        flags=("publish-topology",),
        env=("NVPLUGIN_TOPOLOGY_PUBLISH",),
        reload=Reload.RESTART,
        chart=Chart.true(
            "topology.publish",
            "Publish each node's NodeResourceTopology object (`topology.node.k8s.io/v1alpha2`, "
            "named after the node, owned by it) for topology-aware schedulers. The CRD is the "
            "user's (NFD or scheduler-plugins installs it). The chart then mounts the kubelet's "
            "pod resources directory read-only and grants create/get/update/patch of "
            "noderesourcetopologies and get of nodes (the owner's uid), nothing more.",
        ),
    )
    pod_resources_socket: str = setting(
        "nvplugin.topology.podResourcesSocket",
        Str(rule=_absolute),
        DEFAULT_POD_RESOURCES_SOCKET,
        help="The kubelet's pod resources API socket.",
        flags=("pod-resources-socket",),
        env=("NVPLUGIN_POD_RESOURCES_SOCKET",),
        reload=Reload.RESTART,
        chart=Chart.env(
            "topology.podResourcesSocket",
            None,
            "The kubelet's pod resources socket on the host; with `topology.publish` the chart "
            "mounts its directory read-only at the same path (a kubelet restart re-creates the "
            "socket in it). null: the kubelet's default, "
            "`/var/lib/kubelet/pod-resources/kubelet.sock`.",
            schema={"type": ["string", "null"], "pattern": "^/"},
        ),
    )
    kubelet_config: str | None = setting(
        "nvplugin.topology.kubeletConfig",
        Nullable(Str(rule=_absolute)),
        None,
        help="The kubelet's config file (KubeletConfiguration), read for its topology, CPU and "
        "memory manager policies; null: only the policies set here.",
        flags=("kubelet-config",),
        env=("NVPLUGIN_KUBELET_CONFIG",),
        reload=Reload.RESTART,
        chart=Chart.env(
            "topology.kubeletConfig",
            None,
            "The kubelet's config file on the host (e.g. `/var/lib/kubelet/config.yaml`), "
            "mounted read-only: the object says the kubelet's topology, CPU and memory manager "
            "policies from it. null: only the `topology.*Policy` values.",
            schema={"type": ["string", "null"], "pattern": "^/"},
        ),
    )
    topology_manager_policy: str | None = setting(
        "nvplugin.topology.topologyManagerPolicy",
        Nullable(Str(choices=TOPOLOGY_MANAGER_POLICIES)),
        None,
        help="The kubelet's --topology-manager-policy (null: from kubeletConfig, else unsaid).",
        flags=("topology-manager-policy",),
        env=("NVPLUGIN_TOPOLOGY_MANAGER_POLICY",),
        reload=Reload.RESTART,
        chart=Chart.env(
            "topology.topologyManagerPolicy",
            None,
            "The kubelet's topology manager policy, said in the object (null: from "
            "`topology.kubeletConfig`, else left out).",
        ),
    )
    topology_manager_scope: str | None = setting(
        "nvplugin.topology.topologyManagerScope",
        Nullable(Str(choices=TOPOLOGY_MANAGER_SCOPES)),
        None,
        help="The kubelet's --topology-manager-scope (null: from kubeletConfig, else unsaid).",
        flags=("topology-manager-scope",),
        env=("NVPLUGIN_TOPOLOGY_MANAGER_SCOPE",),
        reload=Reload.RESTART,
        chart=Chart.env(
            "topology.topologyManagerScope",
            None,
            "The kubelet's topology manager scope (null: from `topology.kubeletConfig`, else "
            "left out).",
        ),
    )
    cpu_manager_policy: str | None = setting(
        "nvplugin.topology.cpuManagerPolicy",
        Nullable(Str(choices=CPU_MANAGER_POLICIES)),
        None,
        help="The kubelet's --cpu-manager-policy (null: from kubeletConfig, else unsaid).",
        flags=("cpu-manager-policy",),
        env=("NVPLUGIN_CPU_MANAGER_POLICY",),
        reload=Reload.RESTART,
        chart=Chart.env(
            "topology.cpuManagerPolicy",
            None,
            "The kubelet's CPU manager policy (null: from `topology.kubeletConfig`, else left "
            "out).",
        ),
    )
    memory_manager_policy: str | None = setting(
        "nvplugin.topology.memoryManagerPolicy",
        Nullable(Str(choices=MEMORY_MANAGER_POLICIES)),
        None,
        help="The kubelet's --memory-manager-policy (null: from kubeletConfig, else unsaid).",
        flags=("memory-manager-policy",),
        env=("NVPLUGIN_MEMORY_MANAGER_POLICY",),
        reload=Reload.RESTART,
        chart=Chart.env(
            "topology.memoryManagerPolicy",
            None,
            "The kubelet's memory manager policy (null: from `topology.kubeletConfig`, else "
            "left out).",
        ),
    )
    volcano: bool = setting(
        "nvplugin.topology.volcano",
        Bool(),
        False,
        help="With publish: also publish Volcano's Numatopology object "
        "(nodeinfo.volcano.sh/v1alpha1) named NODE_NAME, owned by the Node.",
        flags=("publish-numatopology",),
        env=("NVPLUGIN_TOPOLOGY_VOLCANO",),
        reload=Reload.RESTART,
        chart=Chart.true(
            "topology.volcano",
            "With `topology.publish`: also publish Volcano's Numatopology object "
            "(`nodeinfo.volcano.sh/v1alpha1`, named after the node, owned by it; Volcano "
            "installs the CRD). The chart then grants create/get/update/patch of numatopologies "
            "too.",
            only_with="topology.publish",
        ),
    )
    resync_s: float = setting(
        "nvplugin.topology.resyncPeriod",
        Duration(minimum=1.0),
        30.0,
        help="How often the publisher reads the pod resources API again without a change of "
        "the kubelet's device checkpoint (a safety net).",
        flags=("topology-resync-period",),
        env=("NVPLUGIN_TOPOLOGY_RESYNC_PERIOD",),
        reload=Reload.RESTART,
    )


@dataclass(frozen=True)
class Config:
    """The effective configuration: a field per setting (declared here), then what the rules
    across keys derive (``sharing``, ``resources``: names resolved). ``source`` names the
    file it was read from (None: none); ``notes`` are said once at start (keys present that are
    not for the plugin).

    The settings under ``resources``, ``sharing.timeSlicing`` and ``sharing.mps`` are here as
    written (short names); the plugin reads them resolved, from ``resources`` and ``sharing``.
    """

    version: str = setting(
        "version",
        Str(rule=_version),
        CONFIG_VERSION,
        help="The config version: v1 (the default).",
        inert=True,
    )
    mig_strategy: str = setting(
        "flags.migStrategy",
        Str(choices=MIG_STRATEGIES),
        MIG_STRATEGIES[0],
        help="How MIG devices are served: none (whole GPUs), single (MIG devices as the GPU "
        "resource), mixed (nvidia.com/mig-<profile> per profile).",
        flags=("mig-strategy",),
        env=("MIG_STRATEGY",),
        chart=Chart.env(
            "migStrategy",
            None,
            "NVIDIA's: `none` serves MIG-enabled GPUs whole, `single` every MIG device as "
            "`nvidia.com/gpu` (every GPU cut into one profile, else the plugin exits 2 naming the "
            "GPUs), `mixed` one resource `nvidia.com/mig-<profile>` per profile beside "
            "`nvidia.com/gpu`. null: the config file's, else none.",
        ),
    )
    fail_on_init_error: bool = setting(
        "flags.failOnInitError",
        Bool(),
        True,
        help="Exit when NVML fails at start (true), or keep running with no devices and retry "
        "(false).",
        flags=("fail-on-init-error",),
        env=("FAIL_ON_INIT_ERROR",),
        reload=Reload.RESTART,  # read while the node is discovered, once
        chart=Chart.env(
            "failOnInitError",
            None,
            "NVIDIA's: exit when NVML cannot start (true) or advertise no GPUs and stay up "
            "(false). null: the config file's, else true.",
        ),
    )
    driver_root: str = setting(
        "flags.nvidiaDriverRoot",
        Str(rule=_absolute),
        DEFAULT_DRIVER_ROOT,
        help="The NVIDIA driver's root on the host (/ or /run/nvidia/driver); the default "
        "device-node root.",
        flags=("nvidia-driver-root", "driver-root"),
        env=("NVIDIA_DRIVER_ROOT",),
        chart=Chart.env(
            "nvidiaDriverRoot",
            None,
            "NVIDIA's: the host's driver root (`/` or `/run/nvidia/driver`), the host root of "
            "DeviceSpecs, mounted read-only at `/driver-root`, where the plugin loads NVML from; "
            "without `runtimeClassName` the container is then privileged (NVML needs the "
            "`/dev/nvidia*` nodes). null: no mount; the NVIDIA container runtime provides the "
            "library (`runtimeClassName: nvidia`).",
            schema={"type": "string", "pattern": "^/"},
        ),
    )
    nvidia_dev_root: str | None = setting(
        "flags.nvidiaDevRoot",
        Nullable(Str(rule=_absolute)),
        None,
        help="Where the host's /dev/nvidia* are (host path); default: nvidiaDriverRoot.",
        flags=("nvidia-dev-root", "dev-root"),
        env=("NVIDIA_DEV_ROOT",),
        chart=Chart.env(
            "nvidiaDevRoot",
            None,
            "NVIDIA's: where the host's `/dev/nvidia*` are, the host root of DeviceSpecs' device "
            "nodes (`/run/nvidia/driver` with the GPU operator's driver container). null: "
            "`nvidiaDriverRoot`.",
            schema={"type": "string", "pattern": "^/"},
        ),
    )
    device_discovery_strategy: str = setting(
        "flags.deviceDiscoveryStrategy",
        Str(non_empty=True),
        "auto",
        help="How devices are found: auto or nvml (tegra and vfio are not supported).",
        flags=("device-discovery-strategy",),
        env=("DEVICE_DISCOVERY_STRATEGY",),
        supported=DISCOVERY_STRATEGIES,
        unsupported=_unsupported("device discovery other than NVML", "use auto or nvml"),
        inert=True,
        chart=Chart.env(
            "deviceDiscoveryStrategy",
            None,
            "NVIDIA's: `auto` or `nvml` (nvplugin discovers GPUs through NVML); others fail "
            "rendering.",
            schema={"type": "string"},
            refused="nvplugin does not support {value} yet (it discovers GPUs through NVML: "
            "auto or nvml)",
        ),
    )
    mps_root: str = setting(
        "flags.mpsRoot",
        Str(rule=_absolute_or_unset),
        DEFAULT_MPS_ROOT,
        help="MPS's host directory: <root>/<resource>/pipe and log for each MPS resource's "
        "control daemon, <root>/shm the shared memory its clients get as /dev/shm.",
        flags=("mps-root",),
        env=("MPS_ROOT",),
        chart=Chart.env(
            "mps.root",
            DEFAULT_MPS_ROOT,
            "NVIDIA's: the host directory for MPS: each MPS resource's pipe and log directories "
            "(`<root>/<resource>/pipe`, `.../log`) and `<root>/shm`, a tmpfs the chart mounts "
            "there, shared by the MPS servers and their clients as `/dev/shm`. Used only when a "
            "config file shares a resource through `sharing.mps`.",
            schema={"type": "string", "pattern": "^/"},
        ),
    )
    gdrcopy_enabled: bool = setting(
        "flags.gdrcopyEnabled",
        Bool(),
        False,
        help="GDRCopy in containers (not supported).",
        flags=("gdrcopy-enabled",),
        env=("GDRCOPY_ENABLED",),
        supported=(False,),
        unsupported=_unsupported("GDRCopy"),
        inert=True,
        chart=Chart.check("gdrcopyEnabled", "NVIDIA's GDRCopy value; not supported."),
    )
    gds_enabled: bool = setting(
        "flags.gdsEnabled",
        Bool(),
        False,
        help="GPUDirect Storage in containers (not supported).",
        flags=("gds-enabled",),
        env=("GDS_ENABLED",),
        supported=(False,),
        unsupported=_unsupported("GPUDirect Storage"),
        inert=True,
        chart=Chart.check("gdsEnabled", "NVIDIA's GPUDirect Storage value; not supported."),
    )
    mofed_enabled: bool = setting(
        "flags.mofedEnabled",
        Bool(),
        False,
        help="MOFED in containers (not supported).",
        flags=("mofed-enabled",),
        env=("MOFED_ENABLED",),
        supported=(False,),
        unsupported=_unsupported("MOFED"),
        inert=True,
        chart=Chart.check("mofedEnabled", "NVIDIA's MOFED value; not supported."),
    )
    use_node_feature_api: bool = setting(
        "flags.useNodeFeatureAPI",
        Bool(),
        False,
        help="Publish the node's labels (flags.gfd) as Node Feature Discovery's NodeFeature "
        "object nvidia-features-for-<NODE_NAME> in NAMESPACE, owned by the pod POD_NAME, instead "
        "of the feature file (GPU Feature Discovery's NodeFeature API mode).",
        flags=("use-node-feature-api",),
        env=("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
        reload=Reload.IN_PLACE,
        chart=Chart.true(
            "nfd.enableNodeFeatureApi",
            "NVIDIA's (v0.17, v0.18): with `gfd.enabled`, the plugin pods publish their nodes' "
            "labels as NFD's NodeFeature objects instead of feature files (NFD must run with "
            "its NodeFeature API); the chart then grants create/get/update of NodeFeatures and "
            "get of pods in the release's namespace, nothing more. null: feature files.",
            only_with="gfd.enabled",
        ),
    )
    pass_device_specs: bool = setting(
        "flags.plugin.passDeviceSpecs",
        Bool(),
        False,
        help="Also return the /dev/nvidia* device nodes (needed with the kubelet's static CPU "
        "manager).",
        flags=("pass-device-specs",),
        env=("PASS_DEVICE_SPECS",),
        chart=Chart.true(
            "compatWithCPUManager",
            "NVIDIA's: DeviceSpecs in Allocate responses (needed with the kubelet's static CPU "
            "manager) and a privileged container.",
        ),
    )
    device_list_strategy: tuple[str, ...] = setting(
        "flags.plugin.deviceListStrategy",
        List(Str(choices=DEVICE_LIST_STRATEGIES), comma=True, unique=True, min_items=1),
        DEFAULT_DEVICE_LIST_STRATEGY,
        help="How containers get their GPUs: envvar, volume-mounts, cdi-annotations, cdi-cri "
        "(one, a list, or comma-separated).",
        flags=("device-list-strategy",),
        env=("DEVICE_LIST_STRATEGY",),
        chart=Chart.env(
            "deviceListStrategy",
            None,
            "NVIDIA's: `envvar`, `volume-mounts`, `cdi-annotations`, `cdi-cri`, as a list or "
            "comma-separated; other names fail at install time. null: the config file's, else "
            "envvar.",
        ),
    )
    device_id_strategy: str = setting(
        "flags.plugin.deviceIDStrategy",
        Str(choices=DEVICE_ID_STRATEGIES),
        DEVICE_ID_STRATEGIES[0],
        help="IDs handed to containers: uuid or index.",
        flags=("device-id-strategy",),
        env=("DEVICE_ID_STRATEGY",),
        chart=Chart.env(
            "deviceIDStrategy",
            None,
            "NVIDIA's: the IDs containers get, `uuid` or `index`. null: the config file's, else "
            "uuid.",
        ),
    )
    cdi_annotation_prefix: str = setting(
        "flags.plugin.cdiAnnotationPrefix",
        Str(rule=cdi_annotation_prefix_problem),
        DEFAULT_CDI_ANNOTATION_PREFIX,
        help="Prefix of the cdi-annotations key (<DNS subdomain>/).",
        flags=("cdi-annotation-prefix",),
        env=("CDI_ANNOTATION_PREFIX",),
    )
    nvidia_ctk_path: str = setting(
        "flags.plugin.nvidiaCTKPath",
        Str(rule=_absolute),
        DEFAULT_NVIDIA_CTK_PATH,
        help="The nvidia-cdi-hook (or nvidia-ctk) on the host: the CDI spec nvplugin writes "
        "runs its create-symlinks and update-ldcache hooks when it is there (looked for under "
        "the driver root as mounted, containerDriverRoot).",
        flags=("nvidia-cdi-hook-path", "nvidia-ctk-path"),
        env=("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        chart=Chart.env(
            "cdi.nvidiaHookPath",
            None,
            "NVIDIA's: the host's nvidia-cdi-hook (or nvidia-ctk) that the CDI spec's hooks "
            "run (create-symlinks, update-ldcache), used when it is there under the driver root. "
            "null: the config file's, else /usr/bin/nvidia-ctk.",
            schema={"type": "string", "pattern": "^/"},
        ),
    )
    container_driver_root: str = setting(
        "flags.plugin.containerDriverRoot",
        Str(rule=_absolute),
        DEFAULT_CONTAINER_DRIVER_ROOT,
        help="Where the host's driver root is mounted in the plugin's container: "
        "libnvidia-ml.so.1 is loaded from there when present.",
        flags=("driver-root-ctr-path", "container-driver-root"),
        env=("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        reload=Reload.RESTART,  # NVML is loaded once, when the node is discovered
    )
    shared_devices_allocation_policy: str = setting(
        "flags.plugin.sharedDevicesAllocationPolicy",
        Str(choices=ALLOCATIONS),
        ALLOCATIONS[0],
        help="Which replicas a pod gets: distributed (spread over the least used GPUs) or packed "
        "(fill the busiest GPUs first).",
        flags=("shared-devices-allocation-policy",),
        env=("SHARED_DEVICES_ALLOCATION_POLICY",),
    )
    kubelet_socket: str | None = setting(
        "flags.plugin.kubeletSocket",
        Nullable(Str(non_empty=True)),
        None,
        help="The kubelet's Registration socket; default: <devicePluginDir>/kubelet.sock.",
        flags=("kubelet-socket",),
        env=("KUBELET_SOCKET",),
    )
    cdi_feature_flags: tuple[str, ...] = setting(
        "flags.plugin.cdiFeatureFlags",
        List(Str(non_empty=True), comma=True),
        (),
        help="Feature flags for the generated CDI spec (none is supported).",
        flags=("cdi-feature-flags",),
        env=("CDI_FEATURE_FLAGS",),
        supported=((),),
        unsupported=_unsupported("generating CDI specs"),
        inert=True,
        chart=Chart.check(
            "cdi.featureFlags",
            "NVIDIA's: feature flags for generated CDI specs; nvplugin supports none.",
            refused="nvplugin supports no CDI feature flags ({value}); leave it null",
        ),
    )
    gfd: GfdConfig = field(default_factory=GfdConfig, metadata=GROUP)
    gpu_patterns: tuple[GpuPattern, ...] = setting(
        "resources.gpus",
        List(_PATTERN_ENTRY),
        (),
        help="GPUs whose model matches pattern (*, ?, [..], any case) are served as resource "
        "name; the first match wins.",
    )
    mig_patterns: tuple[GpuPattern, ...] = setting(
        "resources.mig",
        List(_PATTERN_ENTRY),
        (),
        help="Under migStrategy mixed: MIG devices whose profile matches pattern (*, ?, [..], "
        "any case) are served as resource name; the first match wins.",
    )
    exclude_uuids: tuple[str, ...] = setting(
        "resources.exclude.uuids",
        List(Str(non_empty=True)),
        (),
        help="GPUs no resource advertises.",
    )
    exclude_models: tuple[str, ...] = setting(
        "resources.exclude.models",
        List(Str(non_empty=True)),
        (),
        help="Model patterns no resource advertises.",
    )
    rename_by_default: bool = setting(
        "sharing.timeSlicing.renameByDefault",
        Bool(),
        False,
        help="Serve replicated resources as <name>.shared.",
    )
    fail_requests_greater_than_one: bool = setting(
        "sharing.timeSlicing.failRequestsGreaterThanOne",
        Bool(),
        False,
        help="Refuse containers asking for more than one replica.",
    )
    replicated_resources: tuple[ReplicatedResource, ...] = setting(
        "sharing.timeSlicing.resources",
        List(_REPLICATED_ENTRY),
        (),
        help="Resources advertised replicas times per GPU.",
    )
    mps_rename_by_default: bool = setting(
        "sharing.mps.renameByDefault",
        Bool(),
        False,
        help="Serve resources shared through MPS as <name>.shared.",
    )
    mps_fail_requests_greater_than_one: bool = setting(
        "sharing.mps.failRequestsGreaterThanOne",
        Bool(),
        True,
        help="Refuse containers asking for more than one MPS replica (NVIDIA's default for MPS: "
        "true; false: k replicas of a GPU are k shares of it).",
    )
    mps_resources: tuple[ReplicatedResource, ...] = setting(
        "sharing.mps.resources",
        List(_MPS_ENTRY),
        (),
        help="Resources shared through MPS: each GPU served as replicas MPS shares, with the "
        "control daemon nvplugin runs for the resource.",
    )
    imex_channel_ids: tuple[int, ...] = setting(
        "imex.channelIDs",
        List(Int(0, 2047), comma=True),
        (),
        help="IMEX channels given to containers (not supported).",
        flags=("imex-channel-ids",),
        env=("IMEX_CHANNEL_IDS",),
        supported=((),),
        unsupported=_unsupported("IMEX channels"),
        inert=True,
    )
    imex_required: bool = setting(
        "imex.required",
        Bool(),
        False,
        help="Whether the IMEX channels must exist (no effect without channels).",
        flags=("imex-required",),
        env=("IMEX_REQUIRED",),
        inert=True,
    )
    resource_name: str = setting(
        "nvplugin.resourceName",
        Str(rule=resource_name_error),
        DEFAULT_RESOURCE_NAME,
        help="The resource GPUs no resources.gpus pattern takes are served as.",
        flags=("resource-name",),
        env=("NVPLUGIN_RESOURCE_NAME",),
        chart=Chart.env(
            "resourceName",
            DEFAULT_RESOURCE_NAME,
            "Extended resource name advertised to the kubelet (vendor-domain/name); its part "
            "after `/` names the plugin socket (`nvidia.com/gpu` -> `nvplugin-gpu.sock`). The "
            "plugin checks the kubelet's full naming rule at start-up. Resources by model and "
            "time-slicing (in `config`) add or rename resources.",
            schema={"type": "string", "pattern": r"^[^/\s]+/[^/\s]+$"},
        ),
    )
    allocation_policy: str = setting(
        "nvplugin.allocationPolicy",
        Str(choices=POLICY_NAMES),
        POLICY_NAMES[0],
        help="Preferred allocation: best-effort (best-connected GPUs) or simple.",
        flags=("allocation-policy",),
        env=("NVPLUGIN_ALLOCATION_POLICY",),
        chart=Chart.env(
            "allocationPolicy",
            "",
            "Preferred-allocation policy: `best-effort` or `simple`. Empty: the config file's, "
            "else `best-effort`.",
        ),
    )
    allocation_budget_s: float = setting(
        "nvplugin.allocationBudget",
        Duration(),
        DEFAULT_BUDGET_S,
        help="How long a best-effort answer may search on a node beyond 16 GPUs without a few "
        "classes of interchangeable GPUs (others answer exactly).",
        flags=("allocation-budget",),
        env=("NVPLUGIN_ALLOCATION_BUDGET",),
    )
    device_plugin_dir: str = setting(
        "nvplugin.devicePluginDir",
        Str(rule=_absolute),
        DEFAULT_DEVICE_PLUGIN_DIR,
        help="The kubelet's device-plugin directory.",
        flags=("device-plugin-dir",),
        env=("NVPLUGIN_DEVICE_PLUGIN_DIR",),
        chart=Chart.flag(
            "devicePluginPath",
            DEFAULT_DEVICE_PLUGIN_DIR,
            "The kubelet's device-plugin directory on the host (hostPath, type Directory, "
            "mounted at the same path). Change it only for kubelets with another root dir.",
            schema={"type": "string", "pattern": "^/"},
        ),
    )
    pre_start_required: bool = setting(
        "nvplugin.preStartRequired",
        Bool(),
        False,
        help="Ask the kubelet to call PreStartContainer.",
        flags=("pre-start-required",),
        env=("NVPLUGIN_PRE_START_REQUIRED",),
    )
    cdi_kind: str = setting(
        "nvplugin.cdi.kind",
        Str(rule=cdi_kind_problem),
        DEFAULT_CDI_KIND,
        help="The CDI kind of the names cdi-annotations and cdi-cri hand the runtime. nvplugin "
        f"writes their spec (default, NVIDIA's plugin's kind), except for {TOOLKIT_CDI_KIND!r}: "
        "the container toolkit's spec (nvidia-ctk cdi generate), which nvplugin leaves alone.",
        flags=("cdi-kind",),
        env=("NVPLUGIN_CDI_KIND",),
    )
    cdi_spec_dir: str = setting(
        "nvplugin.cdi.specDir",
        Str(rule=_absolute),
        DEFAULT_CDI_SPEC_DIR,
        help="Where serve writes its CDI spec (<vendor>-<class>.json; with a cdi-* "
        "deviceListStrategy): before registering, again whenever what is served changes.",
        flags=("cdi-spec-dir",),
        env=("NVPLUGIN_CDI_SPEC_DIR",),
        chart=Chart.env(
            "cdiSpecDir",
            None,
            "The host's CDI spec directory the plugin writes its spec into (mounted at the same "
            "path when deviceListStrategy, or a config, has cdi-annotations or cdi-cri). The "
            "runtime must read it: containerd >= 1.7 with enable_cdi, CRI-O >= 1.24. null: the "
            f"config file's, else {DEFAULT_CDI_SPEC_DIR}.",
            schema={"type": "string", "pattern": "^/"},
        ),
    )
    log: LogConfig = field(default_factory=LogConfig, metadata=GROUP)
    health: HealthConfig = field(default_factory=HealthConfig, metadata=GROUP)
    health_service: HealthServiceConfig = field(default_factory=HealthServiceConfig, metadata=GROUP)
    topology: TopologyConfig = field(default_factory=TopologyConfig, metadata=GROUP)
    metrics_address: str | None = setting(  # host:port of /metrics; None = no metrics endpoint
        "nvplugin.metrics.address",
        Nullable(Str(rule=address_problem)),
        None,
        help="host:port to serve Prometheus /metrics on; null: off.",
        flags=("metrics-address",),
        env=("NVPLUGIN_METRICS_ADDRESS",),
        reload=Reload.IN_PLACE,
        chart=Chart.address(
            ChartValue(
                "metrics.enabled",
                False,
                "Serve Prometheus metrics on `<pod IP>:<metrics.port>/metrics` (every interface "
                "of the pod's network namespace), declare the container port `metrics` and add "
                "the `prometheus.io/scrape`, `port` and `path` pod annotations. Off: nothing is "
                "bound.",
            ),
            ChartValue("metrics.port", 9400, "The metrics port."),
        ),
    )
    health_probe_address: str | None = setting(  # host:port of /livez and /readyz; None = none
        "nvplugin.healthProbes.address",
        Nullable(Str(rule=address_problem)),
        None,
        help="host:port to serve the kubelet's HTTP probes on (/livez: the plugin answers; "
        "/readyz: a resource is SERVING); null: off.",
        flags=("health-probe-address",),
        env=("NVPLUGIN_HEALTH_PROBE_ADDRESS",),
        reload=Reload.IN_PLACE,
        chart=Chart.address(
            ChartValue(
                "probes.enabled",
                True,
                "Startup, liveness and readiness probes: the kubelet's `httpGet` on the plugin's "
                "health endpoint on `<pod IP>:<probes.port>` (container port `health`). Startup "
                "and liveness ask `/livez`: the plugin answers (a plugin whose GPUs fell off the "
                "bus shows NotReady, it is not restarted in a loop); readiness asks `/readyz`: a "
                "resource is SERVING (registered with the kubelet and a healthy GPU). Nothing is "
                "started per probe. Off: no probes, nothing bound.",
            ),
            ChartValue(
                "probes.port", 9401, "The health endpoint's port; must differ from `metrics.port`."
            ),
        ),
    )

    # Derived by the rules across keys (build), names resolved:
    sharing: Sharing = field(default_factory=Sharing)
    resources: ResourceRules = field(default_factory=ResourceRules)
    source: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def dev_root(self) -> str:
        """Host root of the /dev/nvidia* nodes in DeviceSpecs: nvidiaDevRoot, else
        nvidiaDriverRoot."""
        return self.nvidia_dev_root or self.driver_root

    @property
    def kubelet_socket_path(self) -> str:
        """Where the kubelet serves Registration: the configured path or ``<dir>/kubelet.sock``."""
        if self.kubelet_socket is not None:
            return self.kubelet_socket
        return os.path.join(self.device_plugin_dir, KUBELET_SOCKET)

    @property
    def values(self) -> dict[str, object]:
        """Every setting's effective value by key path, in the file's order."""
        return {path: value_at(self, attrs) for path, attrs in ATTRIBUTES.items()}

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration in the file's shape (for the start-up log line), with the
        values the plugin derives: resolved resource names, the kubelet socket, the ignored
        Xids."""
        out: dict[str, Any] = {"source": self.source}
        for path, value in self.values.items():
            if isinstance(SETTINGS[path].kind, Duration):
                value = format_duration(float(value))  # type: ignore[arg-type]
            node = out
            *parents, leaf = path.split(".")
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = _plain(value)
        plugin = out["flags"]["plugin"]
        plugin["kubeletSocket"] = self.kubelet_socket_path
        out["flags"]["nvidiaDevRoot"] = self.dev_root
        for block in self.sharing.blocks:
            out["sharing"][block.key.split(".")[1]]["resources"] = [
                {
                    "name": e.name,
                    "replicas": e.replicas,
                    "rename": e.rename,
                    "servedAs": block.served_name(e),
                }
                for e in block.resources
            ]
        for key, patterns in (("gpus", self.resources.gpus), ("mig", self.resources.mig)):
            out["resources"][key] = [{"pattern": p.pattern, "name": p.name} for p in patterns]
        out["nvplugin"]["health"]["xids"]["ignoredEffective"] = sorted(self.health.ignored_xids)
        return out


SECTION_HELP = {
    "": "nvplugin config: NVIDIA's device plugin config (version v1) plus nvplugin's settings.",
    "flags": "Command-line settings (NVIDIA's flags).",
    "flags.plugin": "Settings of the device plugin only.",
    "flags.gfd": "GPU Feature Discovery's settings: the node's labels, which serve writes.",
    "resources": "Resource names by GPU model.",
    "resources.exclude": "nvplugin's: GPUs hidden from every resource.",
    "sharing.timeSlicing": "One GPU advertised as several devices.",
    "sharing.mps": "One GPU advertised as several MPS shares, each with its part of the GPU's "
    "memory and threads; nvplugin runs the MPS control daemon.",
    "nvplugin": "nvplugin's own settings (NVIDIA's plugin has none of these).",
    "nvplugin.cdi": "The CDI spec serve writes for the cdi-annotations and cdi-cri strategies.",
    "nvplugin.health": "Also set by NVIDIA's DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS.",
    "nvplugin.healthService": "grpc.health.v1 on the plugin socket (nvplugin probe).",
}
"""The sections' help, by key path ("" = the whole file)."""

SCHEMA = tree(Config, SECTION_HELP)
"""The config file's tree, from the declarations above."""

SETTINGS: dict[str, Setting] = dict(SCHEMA.settings())
"""Every setting by dotted key path, in declaration order."""

ATTRIBUTES: dict[str, tuple[str, ...]] = {path: attrs for path, attrs, _ in declared(Config)}
"""Every setting's attribute path in :class:`Config` (``("log", "level")``), by key path."""


def _plain(value: object) -> object:
    """A stored value as JSON-like data (tuples as lists, entries as mappings)."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, ReplicatedResource):
        return {"name": value.name, "replicas": value.replicas, "rename": value.rename}
    if isinstance(value, GpuPattern):
        return {"pattern": value.pattern, "name": value.name}
    return value


def _check_ports(metrics: str | None, probes: str | None) -> None:
    """The two HTTP endpoints cannot share a port (port 0: each gets its own from the OS)."""
    if metrics is None or probes is None:
        return
    port = metrics.rpartition(":")[2]
    if port == probes.rpartition(":")[2] != "0":
        raise Invalid(
            f"{show(probes)} and nvplugin.metrics.address {show(metrics)} use the same port "
            f"{port}: each endpoint needs its own",
            "nvplugin.healthProbes.address",
        )


def _check_xids(only: tuple[int, ...], ignore: tuple[int, ...], critical: tuple[int, ...]) -> None:
    """``only`` names the Xids that count; the ignore rules (``ignore``, ``critical``) are for
    when it does not, so one config cannot say both."""
    if only and (ignore or critical):
        other = "ignore" if ignore else "critical"
        raise Invalid(
            f"lists the only Xids that count, so nvplugin.health.xids.{other} has nothing to do: "
            "give one or the other",
            "nvplugin.health.xids.only",
        )


def build(values: Mapping[str, object], source: str | None, notes: tuple[str, ...]) -> Config:
    """The effective config from every setting's value by key path (defaults filled in): each
    setting's field, then what the rules across keys derive; :class:`Invalid` (``at`` = the key
    path) for those rules."""

    def get(path: str) -> Any:
        return values[path]

    _check_ports(get("nvplugin.metrics.address"), get("nvplugin.healthProbes.address"))
    _check_xids(
        get("nvplugin.health.xids.only"),
        get("nvplugin.health.xids.ignore"),
        get("nvplugin.health.xids.critical"),
    )
    allocation = get("flags.plugin.sharedDevicesAllocationPolicy")
    resources, sharing = resolve_layout(
        get("nvplugin.resourceName"),
        ResourceRules(
            get("resources.gpus"),
            Exclude(get("resources.exclude.uuids"), get("resources.exclude.models")),
            get("resources.mig"),
        ),
        Sharing(
            ReplicatedResources(
                rename_by_default=get("sharing.timeSlicing.renameByDefault"),
                fail_requests_greater_than_one=get(
                    "sharing.timeSlicing.failRequestsGreaterThanOne"
                ),
                allocation=allocation,
                resources=get("sharing.timeSlicing.resources"),
            ),
            ReplicatedResources(
                rename_by_default=get("sharing.mps.renameByDefault"),
                fail_requests_greater_than_one=get("sharing.mps.failRequestsGreaterThanOne"),
                allocation=allocation,
                resources=get("sharing.mps.resources"),
                strategy=MPS,
            ),
        ),
        get("flags.migStrategy"),
    )
    if sharing.mps.resources and not get("flags.mpsRoot"):
        raise Invalid(
            'is "" but sharing.mps shares resources: MPS needs a host directory for its pipes '
            f"and shared memory (NVIDIA's chart sets {DEFAULT_MPS_ROOT})",
            "flags.mpsRoot",
        )
    return Config(
        **field_values(Config, values),
        sharing=sharing,
        resources=resources,
        source=source,
        notes=notes,
    )
