"""What NVIDIA's chart runs beside its plugin, translated into nvplugin's plugin pod.

NVIDIA's chart with a ConfigMap of configs runs its config manager as an init container and a
sidecar of each of its pods (they follow the node's label, symlink the chosen file to
``/config/config.yaml`` and signal the plugin by name, hence ``shareProcessNamespace``); with
``gfd.enabled`` a GPU Feature Discovery DaemonSet; and always an MPS control daemon DaemonSet.
nvplugin's plugin does all three itself (README: "Per-node configs: from NVIDIA's config
manager", "Node labels", "MPS"), so :func:`translate` drops them and gives the plugin pod what
they brought: the ConfigMap mounted as ``CONFIG_FILE_SRCDIR`` with ``NODE_NAME``,
``DEFAULT_CONFIG``, ``FALLBACK_STRATEGIES``; GFD's labels output and its variables; and, when a
config shares GPUs through MPS, what the plugin's MPS daemons need (as nvplugin's chart gives
them). Every change is a finding, by key path.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nvplugin.chart.values import NVIDIA_IMAGE
from nvplugin.config import load_config
from nvplugin.config.model import NFD_FEATURE_FILE
from nvplugin.config.select import DEFAULT_NODE_LABEL
from nvplugin.errors import InputError
from nvplugin.migrate.findings import Migration, Status

CONFIG_MANAGER = "config-manager"
GFD = "gpu-feature-discovery"
MPS_DAEMON = "mps-control-daemon"
PLUGIN = "nvidia-device-plugin"

SELECTION_ENV = ("CONFIG_FILE_SRCDIR", "NODE_LABEL", "DEFAULT_CONFIG", "FALLBACK_STRATEGIES")
"""The config manager's variables the plugin reads with the same meaning (select.py)."""
GFD_ENV = (
    "GFD_NO_TIMESTAMP",
    "GFD_SLEEP_INTERVAL",
    "GFD_MACHINE_TYPE_FILE",
    "GFD_USE_NODE_FEATURE_API",
    "USE_NODE_FEATURE_API",
    "GFD_OUTPUT_FILE",
)
"""GFD's variables the plugin reads (its labels' settings), copied from GFD's container."""
NODE_FEATURE_API_ENV = ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API")
MPS_SHM_SCRIPT = (
    "mkdir -p /mps/shm && { mountpoint -q /mps/shm || "
    "mount -t tmpfs -o rw,nosuid,nodev,noexec,size=64M shm /mps/shm; }"
)
"""nvplugin's chart's mps-shm init container (templates/daemonset.yaml): MPS's shared memory, a
tmpfs at <mps root>/shm on the host (NVIDIA's MPS DaemonSet's mount-shm did it)."""


def command_of(container: dict[str, Any]) -> str:
    """The program a container runs (basename of its command's first word; "" for none)."""
    command = container.get("command") or []
    return str(command[0]).rpartition("/")[2] if command else ""


def nvidias(container: dict[str, Any]) -> bool:
    """Whether the container runs NVIDIA's plugin image (any of its programs)."""
    return bool(NVIDIA_IMAGE.search(str(container.get("image", "")).rsplit(":", 1)[0]))


def containers(pod: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(field, where, container) of a pod spec's init containers and containers."""
    for kind in ("initContainers", "containers"):
        for container in pod.get(kind) or []:
            if isinstance(container, dict):
                yield kind, f"{kind}[{container.get('name', '?')}]", container


def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    pod = ((doc.get("spec") or {}).get("template") or {}).get("spec")
    return pod if isinstance(pod, dict) else {}


def name_of(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"DaemonSet {meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def role_of(doc: dict[str, Any]) -> str | None:
    """What an NVIDIA DaemonSet is for, by the programs of NVIDIA's image it runs (besides the
    config manager): the plugin, GPU Feature Discovery, or the MPS control daemon."""
    programs = {command_of(c) for _, _, c in containers(pod_of(doc)) if nvidias(c)}
    if programs & {"", PLUGIN}:
        return None  # the plugin's own (what else runs there is named by daemonset.py)
    if GFD in programs:
        return GFD
    if MPS_DAEMON in programs:
        return MPS_DAEMON
    return None


def _env(container: dict[str, Any]) -> list[dict[str, Any]]:
    env = container.get("env")
    if not isinstance(env, list):
        env = container["env"] = []
    return env


def _env_value(container: dict[str, Any], name: str) -> str | None:
    for item in container.get("env") or []:
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get("value")
            return None if value is None else str(value)
    return None


def _has_env(container: dict[str, Any], name: str) -> bool:
    return any(isinstance(e, dict) and e.get("name") == name for e in container.get("env") or [])


def _mounts(container: dict[str, Any]) -> list[dict[str, Any]]:
    mounts = container.get("volumeMounts")
    if not isinstance(mounts, list):
        mounts = container["volumeMounts"] = []
    return mounts


@dataclass
class Companions:
    """What the input's other NVIDIA DaemonSets bring to the plugin's pod."""

    gfd: dict[str, Any] | None = None  # GFD's container
    gfd_pod: dict[str, Any] | None = None
    gfd_name: str = ""
    mps: bool = False  # an MPS control daemon DaemonSet was there
    dropped: list[str] = field(default_factory=list)


def collect(documents: list[Any], migration: Migration) -> tuple[list[Any], Companions]:
    """The documents without NVIDIA's GFD and MPS control daemon DaemonSets, and what those
    brought (their drop is a finding)."""
    found = Companions()
    kept = []
    for doc in documents:
        role = role_of(doc) if isinstance(doc, dict) and doc.get("kind") == "DaemonSet" else None
        if role == GFD:
            pod = pod_of(doc)
            found.gfd_pod = pod
            found.gfd_name = name_of(doc)
            found.gfd = next(c for _, _, c in containers(pod) if command_of(c) == GFD)
            migration.add(
                name_of(doc),
                Status.DROPPED,
                "NVIDIA's GPU Feature Discovery DaemonSet: nvplugin's plugin pods write GFD's "
                "labels themselves (its output and variables are set on the plugin below)",
            )
        elif role == MPS_DAEMON:
            found.mps = True
            migration.add(
                name_of(doc),
                Status.DROPPED,
                "NVIDIA's MPS control daemon DaemonSet: nvplugin's plugin runs the MPS control "
                "daemon of each MPS resource itself (no second DaemonSet, no mps.capable label)",
            )
        else:
            kept.append(doc)
    return kept, found


def translate(
    doc: dict[str, Any],
    plugin: dict[str, Any],
    configmaps: dict[str, dict[str, Any]],
    companions: Companions,
    migration: Migration,
    image: str,
) -> None:
    """The plugin DaemonSet ``doc`` (its plugin container ``plugin``) without NVIDIA's config
    manager, and with what the dropped companions did."""
    name = name_of(doc)
    pod = pod_of(doc)
    at = f"{name}: containers[{plugin.get('name', '?')}]"
    manager = _drop_config_manager(name, pod, migration)
    configs: dict[str, Any] | None = None
    if manager is not None:
        configs = _per_node(name, at, pod, plugin, manager, configmaps, migration)
    if companions.gfd is not None:
        _labels(name, at, pod, plugin, companions, migration)
    if companions.mps or configs:
        _mps(name, at, pod, plugin, configs, companions.mps, migration, image)


def _drop_config_manager(
    name: str, pod: dict[str, Any], migration: Migration
) -> dict[str, Any] | None:
    """Remove the config manager's containers; the sidecar's (else the init container's)."""
    found: dict[str, Any] | None = None
    for kind, where, container in list(containers(pod)):
        if not (nvidias(container) and command_of(container) == CONFIG_MANAGER):
            continue
        pod[kind].remove(container)
        what = "init container" if kind == "initContainers" else "sidecar"
        migration.add(
            f"{name}: {where}",
            Status.DROPPED,
            f"NVIDIA's config manager ({what}): the plugin itself follows the node's label and "
            "the ConfigMap (its variables are set on the plugin below)",
        )
        if found is None or kind == "containers":
            found = container
    if not pod.get("initContainers"):
        pod.pop("initContainers", None)
    if found is not None and pod.get("shareProcessNamespace") is True:
        del pod["shareProcessNamespace"]
        migration.add(
            f"{name}: shareProcessNamespace",
            Status.DROPPED,
            "only NVIDIA's config manager needed it (to signal the plugin by its process name)",
            True,
        )
    return found


def _per_node(
    name: str,
    at: str,
    pod: dict[str, Any],
    plugin: dict[str, Any],
    manager: dict[str, Any],
    configmaps: dict[str, dict[str, Any]],
    migration: Migration,
) -> dict[str, Any] | None:
    """Per-node configs on the plugin container: the config manager's settings as the
    plugin's variables, the ConfigMap mounted where the manager had it. Returns the configs
    (name -> text) when the ConfigMap is in the input."""
    srcdir = _env_value(manager, "CONFIG_FILE_SRCDIR") or "/available-configs"
    destination = _env_value(manager, "CONFIG_FILE_DST") or "/config/config.yaml"
    env = _env(plugin)
    file = _env_value(plugin, "CONFIG_FILE")
    if file == destination:
        env[:] = [e for e in env if not (isinstance(e, dict) and e.get("name") == "CONFIG_FILE")]
        migration.add(
            f"{at}.env.CONFIG_FILE",
            Status.DROPPED,
            "the file NVIDIA's config manager linked the chosen config to; the plugin reads "
            f"the configs from CONFIG_FILE_SRCDIR ({srcdir}) itself",
            file,
        )
    wanted: list[tuple[str, str | None]] = [("CONFIG_FILE_SRCDIR", srcdir)]
    label = _env_value(manager, "NODE_LABEL")
    if label and label != DEFAULT_NODE_LABEL:
        wanted.append(("NODE_LABEL", label))
    for variable in ("DEFAULT_CONFIG", "FALLBACK_STRATEGIES", "KUBECONFIG"):
        value = _env_value(manager, variable)
        if value:
            wanted.append((variable, value))
    for variable, value in wanted:
        if not _has_env(plugin, variable):
            env.append({"name": variable, "value": value})
            migration.add(
                f"{at}.env.{variable}",
                Status.CHANGED,
                "added, from NVIDIA's config manager, with its meaning",
                value,
            )
    if not _has_env(plugin, "NODE_NAME"):
        env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
        migration.add(
            f"{at}.env.NODE_NAME",
            Status.CHANGED,
            "added (the downward API's spec.nodeName): the Node whose label the plugin follows",
        )
    volume = _mount_configs(at, pod, plugin, manager, srcdir, destination, migration)
    if not pod.get("serviceAccountName"):
        migration.add(
            f"{name}: serviceAccountName",
            Status.DIFFERS,
            "none: the plugin reads its Node's label with the pod's ServiceAccount, which needs "
            'get, list and watch on nodes (apiGroups [""])',
        )
    return _configs(at, volume, configmaps, migration)


def _mount_configs(
    at: str,
    pod: dict[str, Any],
    plugin: dict[str, Any],
    manager: dict[str, Any],
    srcdir: str,
    destination: str,
    migration: Migration,
) -> dict[str, Any] | None:
    """The ConfigMap's volume mounted at ``srcdir`` in the plugin container, the linked file's
    volume gone. Returns the ConfigMap's volume."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    source = next(
        (m for m in manager.get("volumeMounts") or [] if m.get("mountPath") == srcdir), None
    )
    volume = volumes.get(source.get("name")) if source else None
    mounts = _mounts(plugin)
    linked = posixpath.dirname(destination)
    for mount in list(mounts):
        if mount.get("mountPath") == linked and (source is None or mount is not source):
            mounts.remove(mount)
            migration.add(
                f"{at}.volumeMounts[{mount.get('name')}]",
                Status.DROPPED,
                f"where NVIDIA's config manager linked the chosen config ({linked}); unused now",
                linked,
            )
            if not any(
                m.get("name") == mount.get("name")
                for _, _, c in containers(pod)
                for m in c.get("volumeMounts") or []
            ):
                pod["volumes"] = [
                    v for v in pod.get("volumes") or [] if v is not volumes.get(mount.get("name"))
                ]
                migration.add(
                    f"{at.split(': ')[0]}: volumes[{mount.get('name')}]",
                    Status.DROPPED,
                    "mounted only for NVIDIA's config manager's link",
                )
    if source is not None and not any(m.get("mountPath") == srcdir for m in mounts):
        mounts.append({"name": source["name"], "mountPath": srcdir, "readOnly": True})
        migration.add(
            f"{at}.volumeMounts[{source['name']}]",
            Status.CHANGED,
            "added: the whole ConfigMap, which the plugin reads and follows",
            srcdir,
        )
    return volume


def _configs(
    at: str,
    volume: dict[str, Any] | None,
    configmaps: dict[str, dict[str, Any]],
    migration: Migration,
) -> dict[str, Any] | None:
    """The configs of the mounted ConfigMap when the input has it, each read by the plugin's
    loader (a config it would refuse is named)."""
    cm_name = ((volume or {}).get("configMap") or {}).get("name")
    data = configmaps.get(str(cm_name)) if cm_name else None
    if data is None:
        if cm_name:
            migration.add(
                f"{at}: ConfigMap {cm_name}",
                Status.DIFFERS,
                "not in the input, so its configs were not checked: `nvplugin devices "
                "--config-file-srcdir DIR` checks them (DIR: the ConfigMap's files)",
            )
        return None
    for key, text in data.items():
        try:
            load_config(f"ConfigMap {cm_name}: {key}", text=str(text))
        except InputError as exc:
            migration.add(f"ConfigMap {cm_name}: data.{key}", Status.REFUSED, str(exc))
    return data


def _labels(
    name: str,
    at: str,
    pod: dict[str, Any],
    plugin: dict[str, Any],
    companions: Companions,
    migration: Migration,
) -> None:
    """GFD's labels from the plugin: its variables, and its output directory mounted."""
    gfd, gfd_pod = companions.gfd or {}, companions.gfd_pod or {}
    env = _env(plugin)
    for item in gfd.get("env") or []:
        if not isinstance(item, dict):
            continue
        variable = item.get("name")
        copy = variable in GFD_ENV or (
            variable in ("NAMESPACE", "POD_NAME") and _node_feature_api(gfd)
        )
        if copy and not _has_env(plugin, str(variable)):
            env.append(dict(item))
            migration.add(
                f"{at}.env.{variable}",
                Status.CHANGED,
                "added, from GPU Feature Discovery's container, with its meaning",
                item.get("value"),
            )
    if _node_feature_api(gfd):
        return
    output = _env_value(gfd, "GFD_OUTPUT_FILE") or NFD_FEATURE_FILE
    directory = posixpath.dirname(output)
    mount = next(
        (m for m in gfd.get("volumeMounts") or [] if m.get("mountPath") == directory), None
    )
    if not _has_env(plugin, "GFD_OUTPUT_FILE"):
        env.append({"name": "GFD_OUTPUT_FILE", "value": output})
        migration.add(
            f"{at}.env.GFD_OUTPUT_FILE",
            Status.CHANGED,
            "added: the plugin keeps the node's labels in NFD's feature file, as GFD did",
            output,
        )
    if mount is None:
        return
    volume = next(
        (v for v in gfd_pod.get("volumes") or [] if v.get("name") == mount.get("name")), None
    )
    names = {v.get("name") for v in pod.get("volumes") or []}
    if volume is not None and volume.get("name") not in names:
        pod.setdefault("volumes", []).append(dict(volume))
        migration.add(
            f"{name}: volumes[{volume.get('name')}]",
            Status.CHANGED,
            "added, from GPU Feature Discovery's pod: NFD's feature-file directory on the host",
        )
    if not any(m.get("mountPath") == directory for m in _mounts(plugin)):
        _mounts(plugin).append({"name": mount["name"], "mountPath": directory})
        migration.add(f"{at}.volumeMounts[{mount['name']}]", Status.CHANGED, "added", directory)


def _node_feature_api(gfd: dict[str, Any]) -> bool:
    return any(
        str(_env_value(gfd, variable)).lower() == "true" for variable in NODE_FEATURE_API_ENV
    )


def _mps(
    name: str,
    at: str,
    pod: dict[str, Any],
    plugin: dict[str, Any],
    configs: dict[str, Any] | None,
    had_daemonset: bool,
    migration: Migration,
    image: str,
) -> None:
    """What the plugin's MPS control daemons need, when a config shares GPUs through MPS:
    MPS's shared memory mounted on the host (an init container, as nvplugin's chart has),
    the MPS root's mounts propagated to the container, and a privileged container (it sets the
    GPUs' compute mode)."""
    uses = configs is not None and any(_uses_mps(str(text)) for text in configs.values())
    if not uses:
        if configs is None and had_daemonset:
            migration.add(
                f"{at}.securityContext",
                Status.DIFFERS,
                "the configs are not in the input: if one uses sharing.mps, the plugin container "
                "must be privileged and get MPS's shared memory as nvplugin's chart gives it "
                "(an init container mounting a tmpfs at <mps root>/shm)",
            )
        return
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    root = next(
        (m for m in _mounts(plugin) if m.get("mountPath") == "/mps" and m.get("name") in volumes),
        None,
    )
    if root is None:
        migration.add(
            f"{at}.volumeMounts",
            Status.REFUSED,
            "a config uses sharing.mps, but the plugin container has no MPS root mounted at "
            "/mps (NVIDIA's chart mounts mps.root there): add the hostPath volume and mount",
        )
        return
    if root.get("mountPropagation") != "HostToContainer":
        root["mountPropagation"] = "HostToContainer"
        migration.add(
            f"{at}.volumeMounts[{root.get('name')}].mountPropagation",
            Status.CHANGED,
            "HostToContainer: the tmpfs the init container mounts at <mps root>/shm reaches "
            "the plugin",
        )
    init = pod.setdefault("initContainers", [])
    if not any(isinstance(c, dict) and c.get("name") == "mps-shm" for c in init):
        init.append(
            {
                "name": "mps-shm",
                "image": image,
                "command": ["sh", "-c", MPS_SHM_SCRIPT],
                "securityContext": {"privileged": True, "runAsUser": 0, "runAsGroup": 0},
                "volumeMounts": [
                    {
                        "name": root["name"],
                        "mountPath": "/mps",
                        "mountPropagation": "Bidirectional",
                    }
                ],
            }
        )
        migration.add(
            f"{name}: initContainers[mps-shm]",
            Status.CHANGED,
            "added: MPS's shared memory (a 64 MiB tmpfs at <mps root>/shm on the host), which "
            "NVIDIA's MPS DaemonSet's mount-shm made",
        )
    context = plugin.get("securityContext")
    if not isinstance(context, dict) or context.get("privileged") is not True:
        context = dict(context) if isinstance(context, dict) else {}
        # Kubernetes refuses privileged with allowPrivilegeEscalation false; capabilities add
        # nothing to a privileged container.
        for key in ("allowPrivilegeEscalation", "capabilities"):
            context.pop(key, None)
        context["privileged"] = True
        plugin["securityContext"] = context
        migration.add(
            f"{at}.securityContext.privileged",
            Status.CHANGED,
            "true: the plugin sets the MPS GPUs' compute mode and runs their control daemon "
            "(what NVIDIA's privileged MPS DaemonSet did)",
        )


def _uses_mps(text: str) -> bool:
    try:
        config = load_config("config", text=text)
    except InputError:
        return False  # refused, and said, by _configs
    return bool(config.mps_resources)
