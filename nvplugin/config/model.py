"""The config file's schema -- NVIDIA's ``v1`` schema, read the way NVIDIA's device plugin reads
it, plus nvplugin's own settings -- and the effective configuration the plugin runs with.

:data:`SCHEMA` is the one declaration of every key: its kind, default, help, and the ``serve``
flags and environment variables that also set it. NVIDIA's settings keep NVIDIA's key, flag and
environment names and meanings (``flags.plugin.deviceListStrategy``, ``--device-list-strategy``,
``DEVICE_LIST_STRATEGY``); nvplugin's own settings live under ``nvplugin:`` (``NVPLUGIN_*``
variables), where no future NVIDIA key can collide with them and NVIDIA's plugin, which ignores
keys it does not know, can still read the file. NVIDIA settings nvplugin does not implement are
accepted only at their default value: anything else is refused, naming the setting, never
ignored.

To add a setting: add it to :data:`SCHEMA` and to :func:`build` (and :class:`Config`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvplugin.allocator import DEFAULT_BUDGET_S, POLICY_NAMES
from nvplugin.api import DEFAULT_DEVICE_PLUGIN_DIR, KUBELET_SOCKET
from nvplugin.config.layout import (
    ALLOCATIONS,
    MAX_REPLICAS,
    MIN_REPLICAS,
    Exclude,
    GpuPattern,
    ReplicatedResource,
    ResourceRules,
    TimeSlicing,
    resolve_layout,
)
from nvplugin.config.rules import (
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    MIG_STRATEGIES,
    absolute_path_problem,
    address_problem,
    cdi_annotation_prefix_problem,
)
from nvplugin.config.schema import (
    AnyMapping,
    Bool,
    Duration,
    Int,
    Invalid,
    List,
    Member,
    Nullable,
    Obj,
    Section,
    Setting,
    Str,
    format_duration,
)
from nvplugin.errors import show
from nvplugin.node.health import DEFAULT_IGNORED_XIDS, HealthSettings
from nvplugin.resourcenames import DEFAULT_RESOURCE_NAME, resource_name_error

CONFIG_VERSION = "v1"
LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_DEVICE_LIST_STRATEGY = ("envvar",)
DEFAULT_DRIVER_ROOT = "/"
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"
DEFAULT_NVIDIA_CTK_PATH = "/usr/bin/nvidia-ctk"

DISCOVERY_STRATEGIES = ("auto", "nvml")
"""NVIDIA's ``deviceDiscoveryStrategy`` values nvplugin honours (it discovers through NVML)."""
MAX_XID = 2**31 - 1

_NOT_YET = "nvplugin does not support {what} yet"


def _unsupported(what: str, instead: str = "") -> str:
    return _NOT_YET.format(what=what) + (f"; {instead}" if instead else "")


def _absolute(value: str) -> str | None:
    return absolute_path_problem(value)


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


_REPLICATED_ENTRY = Obj(
    {
        "name": Member(Str(non_empty=True), required=True, help="A resource this plugin serves."),
        "replicas": Member(
            Int(MIN_REPLICAS, MAX_REPLICAS), required=True, help="Devices advertised per GPU."
        ),
        "rename": Member(
            Nullable(Str(non_empty=True)), help="Serve the replicas under this name instead."
        ),
        "devices": Member(_Devices(), default="all", help=_DEVICES_HELP),
    },
    make=_replicated,
    label="mapping",
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


SCHEMA = Section(
    {
        "version": Setting(
            Str(rule=_version), CONFIG_VERSION, help="The config version: v1 (the default)."
        ),
        "flags": Section(
            {
                "migStrategy": Setting(
                    Str(choices=MIG_STRATEGIES),
                    MIG_STRATEGIES[0],
                    help="How MIG devices are served: none (whole GPUs), single (MIG devices as "
                    "the GPU resource), mixed (nvidia.com/mig-<profile> per profile).",
                    flags=("mig-strategy",),
                    env=("MIG_STRATEGY",),
                ),
                "failOnInitError": Setting(
                    Bool(),
                    True,
                    help="Exit when NVML fails at start (true), or keep running with no devices "
                    "and retry (false).",
                    flags=("fail-on-init-error",),
                    env=("FAIL_ON_INIT_ERROR",),
                ),
                "nvidiaDriverRoot": Setting(
                    Str(rule=_absolute),
                    DEFAULT_DRIVER_ROOT,
                    help="The NVIDIA driver's root on the host (/ or /run/nvidia/driver); the "
                    "default device-node root.",
                    flags=("nvidia-driver-root", "driver-root"),
                    env=("NVIDIA_DRIVER_ROOT",),
                ),
                "nvidiaDevRoot": Setting(
                    Nullable(Str(rule=_absolute)),
                    None,
                    help="Where the host's /dev/nvidia* are (host path); default: "
                    "nvidiaDriverRoot.",
                    flags=("nvidia-dev-root", "dev-root"),
                    env=("NVIDIA_DEV_ROOT",),
                ),
                "deviceDiscoveryStrategy": Setting(
                    Str(non_empty=True),
                    "auto",
                    help="How devices are found: auto or nvml (tegra and vfio are not supported).",
                    flags=("device-discovery-strategy",),
                    env=("DEVICE_DISCOVERY_STRATEGY",),
                    supported=DISCOVERY_STRATEGIES,
                    unsupported=_unsupported(
                        "device discovery other than NVML", "use auto or nvml"
                    ),
                ),
                "mpsRoot": Setting(
                    Str(),
                    "",
                    help="MPS's host directory (MPS is not supported).",
                    flags=("mps-root",),
                    env=("MPS_ROOT",),
                    supported=("",),
                    unsupported=_unsupported("MPS sharing"),
                ),
                "gdrcopyEnabled": Setting(
                    Bool(),
                    False,
                    help="GDRCopy in containers (not supported).",
                    flags=("gdrcopy-enabled",),
                    env=("GDRCOPY_ENABLED",),
                    supported=(False,),
                    unsupported=_unsupported("GDRCopy"),
                ),
                "gdsEnabled": Setting(
                    Bool(),
                    False,
                    help="GPUDirect Storage in containers (not supported).",
                    flags=("gds-enabled",),
                    env=("GDS_ENABLED",),
                    supported=(False,),
                    unsupported=_unsupported("GPUDirect Storage"),
                ),
                "mofedEnabled": Setting(
                    Bool(),
                    False,
                    help="MOFED in containers (not supported).",
                    flags=("mofed-enabled",),
                    env=("MOFED_ENABLED",),
                    supported=(False,),
                    unsupported=_unsupported("MOFED"),
                ),
                "useNodeFeatureAPI": Setting(
                    Nullable(Bool()),
                    None,
                    help="GPU Feature Discovery's setting; not read by the plugin.",
                    note="flags.useNodeFeatureAPI is GPU Feature Discovery's setting; the plugin "
                    "does not read it",
                ),
                "plugin": Section(
                    {
                        "passDeviceSpecs": Setting(
                            Bool(),
                            False,
                            help="Also return the /dev/nvidia* device nodes (needed with the "
                            "kubelet's static CPU manager).",
                            flags=("pass-device-specs",),
                            env=("PASS_DEVICE_SPECS",),
                        ),
                        "deviceListStrategy": Setting(
                            List(
                                Str(choices=DEVICE_LIST_STRATEGIES),
                                comma=True,
                                unique=True,
                                min_items=1,
                            ),
                            DEFAULT_DEVICE_LIST_STRATEGY,
                            help="How containers get their GPUs: envvar, volume-mounts, "
                            "cdi-annotations, cdi-cri (one, a list, or comma-separated).",
                            flags=("device-list-strategy",),
                            env=("DEVICE_LIST_STRATEGY",),
                        ),
                        "deviceIDStrategy": Setting(
                            Str(choices=DEVICE_ID_STRATEGIES),
                            DEVICE_ID_STRATEGIES[0],
                            help="IDs handed to containers: uuid or index.",
                            flags=("device-id-strategy",),
                            env=("DEVICE_ID_STRATEGY",),
                        ),
                        "cdiAnnotationPrefix": Setting(
                            Str(rule=cdi_annotation_prefix_problem),
                            DEFAULT_CDI_ANNOTATION_PREFIX,
                            help="Prefix of the cdi-annotations key (<DNS subdomain>/).",
                            flags=("cdi-annotation-prefix",),
                            env=("CDI_ANNOTATION_PREFIX",),
                        ),
                        "nvidiaCTKPath": Setting(
                            Str(),
                            DEFAULT_NVIDIA_CTK_PATH,
                            help="nvidia-ctk for generated CDI specs (nvplugin generates none: "
                            "use nvidia-ctk cdi generate on the node).",
                            flags=("nvidia-cdi-hook-path", "nvidia-ctk-path"),
                            env=("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
                            supported=(DEFAULT_NVIDIA_CTK_PATH,),
                            unsupported=_unsupported(
                                "generating CDI specs",
                                "generate the spec on the node with nvidia-ctk cdi generate",
                            ),
                        ),
                        "containerDriverRoot": Setting(
                            Str(rule=_absolute),
                            DEFAULT_CONTAINER_DRIVER_ROOT,
                            help="Where the host's driver root is mounted in the plugin's "
                            "container: libnvidia-ml.so.1 is loaded from there when present.",
                            flags=("driver-root-ctr-path", "container-driver-root"),
                            env=("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
                        ),
                        "sharedDevicesAllocationPolicy": Setting(
                            Str(choices=ALLOCATIONS),
                            ALLOCATIONS[0],
                            help="Which replicas a pod gets: distributed (spread over the "
                            "least used GPUs) or packed (fill the busiest GPUs first).",
                            flags=("shared-devices-allocation-policy",),
                            env=("SHARED_DEVICES_ALLOCATION_POLICY",),
                        ),
                        "kubeletSocket": Setting(
                            Nullable(Str(non_empty=True)),
                            None,
                            help="The kubelet's Registration socket; default: "
                            "<devicePluginDir>/kubelet.sock.",
                            flags=("kubelet-socket",),
                            env=("KUBELET_SOCKET",),
                        ),
                        "cdiFeatureFlags": Setting(
                            List(Str(non_empty=True), comma=True),
                            (),
                            help="Feature flags for generated CDI specs (nvplugin generates none).",
                            flags=("cdi-feature-flags",),
                            env=("CDI_FEATURE_FLAGS",),
                            supported=((),),
                            unsupported=_unsupported("generating CDI specs"),
                        ),
                    },
                    help="Settings of the device plugin only.",
                ),
                "gfd": Setting(
                    AnyMapping(),
                    None,
                    help="GPU Feature Discovery's settings; not read by the plugin.",
                    note="flags.gfd holds GPU Feature Discovery's settings; the plugin does not "
                    "read them",
                ),
            },
            help="Command-line settings (NVIDIA's flags).",
        ),
        "resources": Section(
            {
                "gpus": Setting(
                    List(_PATTERN_ENTRY),
                    (),
                    help="GPUs whose model matches pattern (*, ?, [..], any case) are served as "
                    "resource name; the first match wins.",
                ),
                "mig": Setting(
                    List(_PATTERN_ENTRY),
                    (),
                    help="Under migStrategy mixed: MIG devices whose profile matches pattern "
                    "(*, ?, [..], any case) are served as resource name; the first match wins.",
                ),
                "exclude": Section(
                    {
                        "uuids": Setting(
                            List(Str(non_empty=True)), (), help="GPUs no resource advertises."
                        ),
                        "models": Setting(
                            List(Str(non_empty=True)),
                            (),
                            help="Model patterns no resource advertises.",
                        ),
                    },
                    help="nvplugin's: GPUs hidden from every resource.",
                ),
            },
            help="Resource names by GPU model.",
        ),
        "sharing": Section(
            {
                "timeSlicing": Section(
                    {
                        "renameByDefault": Setting(
                            Bool(), False, help="Serve replicated resources as <name>.shared."
                        ),
                        "failRequestsGreaterThanOne": Setting(
                            Bool(),
                            False,
                            help="Refuse containers asking for more than one replica.",
                        ),
                        "resources": Setting(
                            List(_REPLICATED_ENTRY),
                            (),
                            help="Resources advertised replicas times per GPU.",
                        ),
                    },
                    help="One GPU advertised as several devices.",
                ),
                "mps": Setting(
                    AnyMapping(),
                    None,
                    help="MPS sharing (not supported).",
                    supported=(None, {}),
                    unsupported=_unsupported("MPS sharing", "use sharing.timeSlicing"),
                ),
            },
        ),
        "imex": Section(
            {
                "channelIDs": Setting(
                    List(Int(0, 2047), comma=True),
                    (),
                    help="IMEX channels given to containers (not supported).",
                    flags=("imex-channel-ids",),
                    env=("IMEX_CHANNEL_IDS",),
                    supported=((),),
                    unsupported=_unsupported("IMEX channels"),
                ),
                "required": Setting(
                    Bool(),
                    False,
                    help="Whether the IMEX channels must exist (no effect without channels).",
                    flags=("imex-required",),
                    env=("IMEX_REQUIRED",),
                ),
            },
        ),
        "nvplugin": Section(
            {
                "resourceName": Setting(
                    Str(rule=resource_name_error),
                    DEFAULT_RESOURCE_NAME,
                    help="The resource GPUs no resources.gpus pattern takes are served as.",
                    flags=("resource-name",),
                    env=("NVPLUGIN_RESOURCE_NAME",),
                ),
                "allocationPolicy": Setting(
                    Str(choices=POLICY_NAMES),
                    POLICY_NAMES[0],
                    help="Preferred allocation: best-effort (best-connected GPUs) or simple.",
                    flags=("allocation-policy",),
                    env=("NVPLUGIN_ALLOCATION_POLICY",),
                ),
                "allocationBudget": Setting(
                    Duration(),
                    DEFAULT_BUDGET_S,
                    help="How long a best-effort answer may search on a node beyond 16 GPUs "
                    "without a few classes of interchangeable GPUs (others answer exactly).",
                    flags=("allocation-budget",),
                    env=("NVPLUGIN_ALLOCATION_BUDGET",),
                ),
                "devicePluginDir": Setting(
                    Str(rule=_absolute),
                    DEFAULT_DEVICE_PLUGIN_DIR,
                    help="The kubelet's device-plugin directory.",
                    flags=("device-plugin-dir",),
                    env=("NVPLUGIN_DEVICE_PLUGIN_DIR",),
                ),
                "preStartRequired": Setting(
                    Bool(),
                    False,
                    help="Ask the kubelet to call PreStartContainer.",
                    flags=("pre-start-required",),
                    env=("NVPLUGIN_PRE_START_REQUIRED",),
                ),
                "log": Section(
                    {
                        "format": Setting(
                            Nullable(Str(choices=LOG_FORMATS)),
                            None,
                            help="json or console; null: console on a TTY, else json.",
                            flags=("log-format",),
                            env=("NVPLUGIN_LOG_FORMAT",),
                        ),
                        "level": Setting(
                            Str(choices=LOG_LEVELS),
                            "info",
                            help="debug, info, warning or error.",
                            flags=("log-level",),
                            env=("NVPLUGIN_LOG_LEVEL",),
                        ),
                    }
                ),
                "health": Section(
                    {
                        "enabled": Setting(Bool(), True, help="Watch GPU health (NVML Xids)."),
                        "xids": Section(
                            {
                                "ignore": Setting(
                                    _XIDS,
                                    (),
                                    help="Xids added to the ignored ones "
                                    f"({', '.join(map(str, sorted(DEFAULT_IGNORED_XIDS)))}).",
                                ),
                                "critical": Setting(
                                    _XIDS, (), help="Xids removed from the ignored ones."
                                ),
                            }
                        ),
                        "recovery": Section(
                            {
                                "quietPeriod": Setting(
                                    Duration(),
                                    0.0,
                                    help="A GPU turns Healthy again after this long without a "
                                    "critical Xid, once a probe succeeds; 0s = never.",
                                ),
                            }
                        ),
                    }
                ),
                "healthService": Section(
                    {
                        "notServingWithoutHealthyGpus": Setting(
                            Bool(),
                            True,
                            help="The gRPC health service answers NOT_SERVING while no GPU is "
                            "Healthy.",
                        ),
                    }
                ),
                "metrics": Section(
                    {
                        "address": Setting(
                            Nullable(Str(rule=address_problem)),
                            None,
                            help="host:port to serve Prometheus /metrics on; null: off.",
                            flags=("metrics-address",),
                            env=("NVPLUGIN_METRICS_ADDRESS",),
                        ),
                    }
                ),
                "healthProbes": Section(
                    {
                        "address": Setting(
                            Nullable(Str(rule=address_problem)),
                            None,
                            help="host:port to serve the kubelet's HTTP probes on (/livez: the "
                            "plugin answers; /readyz: a resource is SERVING); null: off.",
                            flags=("health-probe-address",),
                            env=("NVPLUGIN_HEALTH_PROBE_ADDRESS",),
                        ),
                    }
                ),
            },
            help="nvplugin's own settings (NVIDIA's plugin has none of these).",
        ),
    },
    help="nvplugin config: NVIDIA's device plugin config (version v1) plus nvplugin's settings.",
)

SETTINGS: dict[str, Setting] = dict(SCHEMA.settings())
"""Every setting by dotted key path, in declaration order."""


# --- the effective configuration ------------------------------------------------------------------


@dataclass(frozen=True)
class LogConfig:
    format: str | None  # None: console on a TTY, else JSON
    level: str


@dataclass(frozen=True)
class HealthConfig:
    enabled: bool
    ignore_xids: tuple[int, ...]
    critical_xids: tuple[int, ...]
    recovery_quiet_s: float

    @property
    def ignored_xids(self) -> frozenset[int]:
        """The default ignored Xids, plus ``ignore``, minus ``critical``."""
        return (DEFAULT_IGNORED_XIDS | frozenset(self.ignore_xids)) - frozenset(self.critical_xids)

    def settings(self) -> HealthSettings:
        return HealthSettings(
            enabled=self.enabled,
            ignored_xids=self.ignored_xids,
            recovery_quiet_s=self.recovery_quiet_s,
        )


@dataclass(frozen=True)
class HealthServiceConfig:
    """The gRPC health service's settings (``nvplugin.healthService``): NOT_SERVING while
    unregistered, and, with ``not_serving_without_healthy_gpus``, while no GPU is Healthy."""

    not_serving_without_healthy_gpus: bool = True


@dataclass(frozen=True)
class Config:
    """The effective configuration. ``source`` names the file it was read from (None: none);
    ``notes`` are said once at start (keys present that are not for the plugin)."""

    resource_name: str = DEFAULT_RESOURCE_NAME
    allocation_policy: str = POLICY_NAMES[0]
    allocation_budget_s: float = DEFAULT_BUDGET_S
    device_plugin_dir: str = DEFAULT_DEVICE_PLUGIN_DIR
    kubelet_socket: str | None = None
    fail_on_init_error: bool = True
    pre_start_required: bool = False
    log: LogConfig = LogConfig(None, "info")
    health: HealthConfig = HealthConfig(True, (), (), 0.0)
    health_service: HealthServiceConfig = HealthServiceConfig()
    metrics_address: str | None = None  # host:port of /metrics; None = no metrics endpoint
    health_probe_address: str | None = None  # host:port of /livez and /readyz; None = none
    device_list_strategy: tuple[str, ...] = DEFAULT_DEVICE_LIST_STRATEGY
    device_id_strategy: str = DEVICE_ID_STRATEGIES[0]
    pass_device_specs: bool = False
    dev_root: str = DEFAULT_DRIVER_ROOT
    """Host root of the /dev/nvidia* nodes in DeviceSpecs: nvidiaDevRoot, else nvidiaDriverRoot."""
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    driver_root: str = DEFAULT_DRIVER_ROOT
    container_driver_root: str = DEFAULT_CONTAINER_DRIVER_ROOT
    mig_strategy: str = MIG_STRATEGIES[0]
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)  # names resolved
    resources: ResourceRules = field(default_factory=ResourceRules)  # names resolved
    source: str | None = None
    notes: tuple[str, ...] = ()
    values: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)
    """Every setting's effective value by key path (for :meth:`as_dict`)."""

    @property
    def kubelet_socket_path(self) -> str:
        """Where the kubelet serves Registration: the configured path or ``<dir>/kubelet.sock``."""
        if self.kubelet_socket is not None:
            return self.kubelet_socket
        return os.path.join(self.device_plugin_dir, KUBELET_SOCKET)

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration in the file's shape (for the start-up log line), with the
        values the plugin derives: resolved resource names, the kubelet socket, the ignored
        Xids."""
        out: dict[str, Any] = {"source": self.source}
        for path, setting in SETTINGS.items():
            value = self.values.get(path, setting.default)
            if isinstance(setting.kind, Duration):
                value = format_duration(float(value))  # type: ignore[arg-type]
            node = out
            *parents, leaf = path.split(".")
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = _plain(value)
        plugin = out["flags"]["plugin"]
        plugin["kubeletSocket"] = self.kubelet_socket_path
        out["flags"]["nvidiaDevRoot"] = self.dev_root
        out["sharing"]["timeSlicing"]["resources"] = [
            {
                "name": e.name,
                "replicas": e.replicas,
                "rename": e.rename,
                "servedAs": self.time_slicing.served_name(e),
            }
            for e in self.time_slicing.resources
        ]
        for key, patterns in (("gpus", self.resources.gpus), ("mig", self.resources.mig)):
            out["resources"][key] = [{"pattern": p.pattern, "name": p.name} for p in patterns]
        out["nvplugin"]["health"]["xids"]["ignoredEffective"] = sorted(self.health.ignored_xids)
        return out


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


def build(values: Mapping[str, object], source: str | None, notes: tuple[str, ...]) -> Config:
    """The effective config from every setting's value by key path (defaults filled in);
    :class:`Invalid` (``at`` = the key path) for rules across keys."""

    def get(path: str) -> Any:
        return values[path]

    _check_ports(get("nvplugin.metrics.address"), get("nvplugin.healthProbes.address"))
    resource_name = get("nvplugin.resourceName")
    mig_strategy = get("flags.migStrategy")
    resources, time_slicing = resolve_layout(
        resource_name,
        ResourceRules(
            get("resources.gpus"),
            Exclude(get("resources.exclude.uuids"), get("resources.exclude.models")),
            get("resources.mig"),
        ),
        TimeSlicing(
            rename_by_default=get("sharing.timeSlicing.renameByDefault"),
            fail_requests_greater_than_one=get("sharing.timeSlicing.failRequestsGreaterThanOne"),
            allocation=get("flags.plugin.sharedDevicesAllocationPolicy"),
            resources=get("sharing.timeSlicing.resources"),
        ),
        mig_strategy,
    )
    driver_root = get("flags.nvidiaDriverRoot")
    return Config(
        resource_name=resource_name,
        allocation_policy=get("nvplugin.allocationPolicy"),
        allocation_budget_s=get("nvplugin.allocationBudget"),
        device_plugin_dir=get("nvplugin.devicePluginDir"),
        kubelet_socket=get("flags.plugin.kubeletSocket"),
        fail_on_init_error=get("flags.failOnInitError"),
        pre_start_required=get("nvplugin.preStartRequired"),
        log=LogConfig(format=get("nvplugin.log.format"), level=get("nvplugin.log.level")),
        health=HealthConfig(
            enabled=get("nvplugin.health.enabled"),
            ignore_xids=get("nvplugin.health.xids.ignore"),
            critical_xids=get("nvplugin.health.xids.critical"),
            recovery_quiet_s=get("nvplugin.health.recovery.quietPeriod"),
        ),
        health_service=HealthServiceConfig(
            not_serving_without_healthy_gpus=get(
                "nvplugin.healthService.notServingWithoutHealthyGpus"
            )
        ),
        metrics_address=get("nvplugin.metrics.address"),
        health_probe_address=get("nvplugin.healthProbes.address"),
        device_list_strategy=get("flags.plugin.deviceListStrategy"),
        device_id_strategy=get("flags.plugin.deviceIDStrategy"),
        pass_device_specs=get("flags.plugin.passDeviceSpecs"),
        dev_root=get("flags.nvidiaDevRoot") or driver_root,
        cdi_annotation_prefix=get("flags.plugin.cdiAnnotationPrefix"),
        driver_root=driver_root,
        container_driver_root=get("flags.plugin.containerDriverRoot"),
        mig_strategy=mig_strategy,
        time_slicing=time_slicing,
        resources=resources,
        source=source,
        notes=notes,
        values=dict(values),
    )
