"""The chart rendered by real Helm: every manifest valid for Kubernetes 1.31+ (strict schemas), lint
clean in strict mode, and the fields that decide whether the plugin works on a node."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

import nvplugin
from tests.support.chartvalues import VALUE_SETS
from tests.support.helm import CHART_DIR, NAMESPACE, Rendered, render, render_error

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# The oldest Kubernetes the chart supports and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())


@pytest.fixture(scope="module")
def renders() -> dict[str, Rendered]:
    return {name: render(values) for name, values in VALUE_SETS.items()}


@pytest.fixture(scope="module")
def default(renders: dict[str, Rendered]) -> Rendered:
    return renders["defaults"]


# --- valid Kubernetes, clean lint -----------------------------------------------------------------


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_every_manifest_is_valid_kubernetes_in_strict_mode(
    renders: dict[str, Rendered], case: str, kube: str
) -> None:
    rendered = renders[case]
    assert rendered.objects, "nothing rendered"
    for obj in rendered.objects:
        kubernetes_validate.validate(obj, kube, strict=True)


def test_strict_validation_is_not_vacuous(default: Rendered) -> None:
    broken = yaml.safe_load(yaml.safe_dump(default.daemonset))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_lint_strict_has_no_warnings(case: str) -> None:
    report = helm.lint(
        str(CHART_DIR),
        VALUE_SETS[case],
        strict=True,
        namespace=NAMESPACE,
        kube_version="v1.31.0",
    )
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [] and report["errors"] == []


def test_lint_reports_bad_values() -> None:
    report = helm.lint(str(CHART_DIR), {"image": {"tag": 5}}, strict=True)
    assert any("/image/tag" in e for e in report["errors"])


RBAC = ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]


def test_objects_rendered(renders: dict[str, Rendered]) -> None:
    assert renders["defaults"].kinds() == ["DaemonSet"]  # no config file: the plugin's defaults
    # Config files: per-node selection, which reads the Node.
    assert renders["config-string"].kinds() == sorted(["ConfigMap", "DaemonSet", *RBAC])
    assert renders["existing-configmap"].kinds() == sorted(["DaemonSet", *RBAC])


# --- the DaemonSet: what reaches the plugin -------------------------------------------------------


def test_defaults_run_serve_with_the_kubelet_dir(default: Rendered) -> None:
    ds = default.daemonset
    assert ds["metadata"]["name"] == "nvplugin"
    assert ds["metadata"]["namespace"] == NAMESPACE
    assert default.container["args"] == ["serve", "--device-plugin-dir", DEVICE_PLUGIN_DIR]
    assert default.env == {
        "MPS_ROOT": "/run/nvidia/mps",  # as NVIDIA's chart sets it, MPS or not
        "NVPLUGIN_RESOURCE_NAME": "nvidia.com/gpu",
        "NVPLUGIN_HEALTH_PROBE_ADDRESS": "0.0.0.0:9401",
    }
    assert "command" not in default.container  # the image's ENTRYPOINT (nvplugin) runs


def test_image_defaults_to_the_package_version(default: Rendered) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == nvplugin.__version__
    assert default.container["image"] == f"nvplugin:{nvplugin.__version__}"
    assert default.container["imagePullPolicy"] == "IfNotPresent"


def test_image_tag_and_digest(renders: dict[str, Rendered]) -> None:
    assert renders["everything"].container["image"] == "registry.example.com/nvplugin:9.9.9"
    assert renders["digest"].container["image"] == "nvplugin@sha256:" + "ab" * 32
    assert renders["digest"].container["imagePullPolicy"] == "Always"
    assert renders["everything"].pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert "imagePullSecrets" not in renders["defaults"].pod


def test_device_plugin_dir_is_a_host_directory_mounted_at_the_same_path(
    default: Rendered,
) -> None:
    volumes = {v["name"]: v for v in default.pod["volumes"]}
    assert volumes["device-plugin"]["hostPath"] == {"path": DEVICE_PLUGIN_DIR, "type": "Directory"}
    mounts = {m["name"]: m for m in default.container["volumeMounts"]}
    assert mounts["device-plugin"] == {"name": "device-plugin", "mountPath": DEVICE_PLUGIN_DIR}


def test_other_kubelet_root_moves_mount_and_flag_together() -> None:
    path = "/var/lib/k0s/kubelet/device-plugins"
    rendered = render({"devicePluginPath": path})
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    assert volumes["device-plugin"]["hostPath"]["path"] == path
    assert {m["mountPath"] for m in rendered.container["volumeMounts"]} >= {path}
    assert rendered.container["args"][1:3] == ["--device-plugin-dir", path]


def test_a_configmap_means_per_node_configs(renders: dict[str, Rendered]) -> None:
    rendered = renders["config-string"]
    cm = rendered.one("ConfigMap")
    assert cm["metadata"]["name"] == "nvplugin-config"
    assert cm["metadata"]["namespace"] == NAMESPACE
    # The whole ConfigMap, as a directory the kubelet keeps up to date (no items, no subPath).
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    assert volumes["config"]["configMap"] == {"name": "nvplugin-config"}
    mounts = {m["name"]: m for m in rendered.container["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/etc/nvplugin", "readOnly": True}
    assert "--config-file" not in rendered.container["args"]
    # NVIDIA's config manager's variables; the node's name from the downward API.
    assert rendered.env["CONFIG_FILE_SRCDIR"] == "/etc/nvplugin"
    assert rendered.env["FALLBACK_STRATEGIES"] == "named,single"
    assert "DEFAULT_CONFIG" not in rendered.env
    assert rendered.env_fields == {"NODE_NAME": "spec.nodeName"}
    several = renders["several-configs"]
    assert sorted(several.one("ConfigMap")["data"]) == ["default", "t4"]
    assert several.env["DEFAULT_CONFIG"] == "t4"
    assert 'runs "t4" (config.default)' in several.notes
    assert "nvidia.com/device-plugin.config=KEY" in several.notes
    assert "every node uses" not in several.notes


@pytest.mark.parametrize(
    ("config", "env"),
    [
        ({"map": {"default": "", "other": ""}}, {"FALLBACK_STRATEGIES": "named,single"}),
        (
            {"map": {"a": "", "b": ""}, "fallbackStrategies": ["named", "empty"]},
            {"FALLBACK_STRATEGIES": "named,empty"},
        ),
        ({"map": {"a": ""}, "default": "a"}, {"DEFAULT_CONFIG": "a"}),
        ({"name": "theirs", "default": "t4"}, {"DEFAULT_CONFIG": "t4"}),
        ({"map": {"a": ""}, "fallbackStrategies": ["single"]}, {"FALLBACK_STRATEGIES": "single"}),
    ],
)
def test_nvidias_default_and_fallbacks_reach_the_plugin(
    config: dict[str, Any], env: dict[str, str]
) -> None:
    rendered = render({"config": config})
    assert env.items() <= rendered.env.items()


def test_existing_configmap_is_mounted_whole_by_name(renders: dict[str, Rendered]) -> None:
    rendered = renders["existing-configmap"]
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    assert volumes["config"]["configMap"] == {"name": "my-nvplugin"}
    assert rendered.env["DEFAULT_CONFIG"] == "plugin"
    assert "my-nvplugin (yours)" in rendered.notes


def test_per_node_configs_read_the_node_and_nothing_else(renders: dict[str, Rendered]) -> None:
    rendered = renders["several-configs"]
    account = rendered.one("ServiceAccount")
    assert account["metadata"] == {
        "name": "nvplugin",
        "namespace": NAMESPACE,
        "labels": account["metadata"]["labels"],
    }
    assert rendered.pod["serviceAccountName"] == "nvplugin"
    assert rendered.pod["automountServiceAccountToken"] is True
    role = rendered.one("ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    binding = rendered.one("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvplugin", "namespace": NAMESPACE}
    ]
    # Cluster-wide names carry the namespace: two releases in two namespaces do not collide.
    assert NAMESPACE in role["metadata"]["name"]
    other = render({"config": {"name": "x"}, "namespaceOverride": "gpu-operator"})
    assert other.one("ClusterRole")["metadata"]["name"] != role["metadata"]["name"]
    # Without config files: no account, no role, no token.
    default = renders["defaults"]
    assert "serviceAccountName" not in default.pod
    assert default.pod["automountServiceAccountToken"] is False


def test_chart_values_reach_the_plugin_as_its_environment(renders: dict[str, Rendered]) -> None:
    rendered = renders["everything"]
    assert rendered.env == {
        "NVPLUGIN_RESOURCE_NAME": "example.com/a100",
        "NVPLUGIN_ALLOCATION_POLICY": "simple",
        "NVPLUGIN_LOG_FORMAT": "console",
        "NVPLUGIN_LOG_LEVEL": "debug",
        "NVPLUGIN_METRICS_ADDRESS": "0.0.0.0:9400",
        "NVPLUGIN_HEALTH_PROBE_ADDRESS": "0.0.0.0:9401",
        # NVIDIA's values, as NVIDIA's chart passes them
        "MIG_STRATEGY": "none",
        "FAIL_ON_INIT_ERROR": "false",
        "PASS_DEVICE_SPECS": "true",
        "DEVICE_LIST_STRATEGY": "envvar,cdi-annotations",
        "DEVICE_ID_STRATEGY": "index",
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "MPS_ROOT": "/run/nvidia/mps",
        # config.map: per-node configs
        "CONFIG_FILE_SRCDIR": "/etc/nvplugin",
        "FALLBACK_STRATEGIES": "named,single",
    }
    assert rendered.container["args"][-2:] == ["--simulate", "dgx-a100"]


def test_a_simulated_node_gets_a_writable_tmp_under_the_read_only_root(
    renders: dict[str, Rendered],
) -> None:
    # The simulated node writes its sysfs tree and driver root (with a program to run) into a
    # temporary directory: the root filesystem is read-only and a container's /dev/shm noexec,
    # so without a volume at /tmp the plugin cannot start (No usable temporary directory).
    simulated, real = renders["everything"], renders["defaults"]
    assert simulated.container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in simulated.container["volumeMounts"]}
    volumes = {v["name"]: v for v in simulated.pod["volumes"]}
    assert volumes[mounts["/tmp"]] == {"name": "tmp", "emptyDir": {}}
    assert "/tmp" not in {m["mountPath"] for m in real.container["volumeMounts"]}


def test_nvidia_driver_root_is_mounted_where_the_plugin_loads_nvml(
    renders: dict[str, Rendered],
) -> None:
    rendered = renders["everything"]
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    assert volumes["driver-root"]["hostPath"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    mounts = {m["name"]: m for m in rendered.container["volumeMounts"]}
    assert mounts["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/driver-root",  # the plugin's containerDriverRoot default
        "readOnly": True,
    }
    # Without the NVIDIA runtime, NVML needs the host's /dev/nvidia*: privileged.
    plain = render({"nvidiaDriverRoot": "/"})
    assert plain.container["securityContext"]["privileged"] is True
    assert "driver-root" not in {v["name"] for v in renders["defaults"].pod["volumes"]}


def test_no_unset_setting_leaks_into_env_or_config(default: Rendered) -> None:
    # MPS_ROOT: NVIDIA's chart's value, set by default (it mounts nothing without sharing.mps).
    assert list(default.env) == [
        "MPS_ROOT",
        "NVPLUGIN_RESOURCE_NAME",
        "NVPLUGIN_HEALTH_PROBE_ADDRESS",
    ]
    assert default.kinds() == ["DaemonSet"]


def test_service_links_are_off(default: Rendered) -> None:
    # The pod needs no Service addresses; the plugin would skip them anyway.
    assert default.pod["enableServiceLinks"] is False
    assert default.pod["automountServiceAccountToken"] is False


# --- probes ---------------------------------------------------------------------------------------


HEALTH_PORT = {"name": "health", "containerPort": 9401, "protocol": "TCP"}


@pytest.mark.parametrize(
    ("probe", "path"),
    [("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")],
)
def test_probes_are_the_kubelets_http_gets_on_the_plugins_health_endpoint(
    default: Rendered, probe: str, path: str
) -> None:
    # Readiness needs a resource SERVING; startup and liveness any answer (a plugin whose GPUs
    # are lost must show NotReady, not be restarted in a loop). Nothing runs in the container.
    spec = default.container[probe]
    assert spec["httpGet"] == {"path": path, "port": "health"}
    assert "exec" not in spec
    assert spec["timeoutSeconds"] == 3
    assert spec["periodSeconds"] >= 1 and spec["failureThreshold"] >= 1
    assert default.container["ports"] == [HEALTH_PORT]
    assert default.env["NVPLUGIN_HEALTH_PROBE_ADDRESS"] == "0.0.0.0:9401"


def test_probe_port_and_timings_come_from_values() -> None:
    rendered = render(
        {
            "probes": {
                "port": 8081,
                "timeoutSeconds": 4,
                "liveness": {"periodSeconds": 30, "failureThreshold": 5},
            }
        }
    )
    live = rendered.container["livenessProbe"]
    assert (live["timeoutSeconds"], live["periodSeconds"], live["failureThreshold"]) == (4, 30, 5)
    assert rendered.container["ports"] == [HEALTH_PORT | {"containerPort": 8081}]
    assert rendered.env["NVPLUGIN_HEALTH_PROBE_ADDRESS"] == "0.0.0.0:8081"


def test_metrics_and_probes_on_one_port_fail_rendering() -> None:
    message = render_error({"metrics": {"enabled": True, "port": 9500}, "probes": {"port": 9500}})
    assert "values.metrics.port and values.probes.port are both 9500" in message


def test_metrics_off_by_default(default: Rendered) -> None:
    assert default.container["ports"] == [HEALTH_PORT]
    assert "NVPLUGIN_METRICS_ADDRESS" not in default.env
    annotations = default.daemonset["spec"]["template"]["metadata"]["annotations"]
    assert not [name for name in annotations if name.startswith("prometheus.io/")]


def test_metrics_port_env_and_scrape_annotations() -> None:
    rendered = render({"metrics": {"enabled": True, "port": 9500}})
    assert rendered.container["ports"] == [
        {"name": "metrics", "containerPort": 9500, "protocol": "TCP"},
        HEALTH_PORT,
    ]
    assert rendered.env["NVPLUGIN_METRICS_ADDRESS"] == "0.0.0.0:9500"
    annotations = rendered.daemonset["spec"]["template"]["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")} == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9500",
        "prometheus.io/path": "/metrics",
    }


def test_probes_can_be_disabled(renders: dict[str, Rendered]) -> None:
    container = renders["no-probes"].container
    assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(container)
    assert "ports" not in container  # nothing bound
    assert "NVPLUGIN_HEALTH_PROBE_ADDRESS" not in renders["no-probes"].env


# --- security -------------------------------------------------------------------------------------


def test_hardened_security_context_by_default(default: Rendered) -> None:
    assert default.container["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "securityContext" not in default.pod  # podSecurityContext is empty


def test_privileged_only_with_device_specs_or_the_host_driver(renders: dict[str, Rendered]) -> None:
    context = renders["everything"].container["securityContext"]
    assert context["privileged"] is True
    assert context["allowPrivilegeEscalation"] is True  # the API rejects privileged without it
    assert "capabilities" not in context
    assert context["readOnlyRootFilesystem"] is True
    for case in set(VALUE_SETS) - {"everything", "mps"}:
        assert "privileged" not in renders[case].container["securityContext"], case
    off = render({"compatWithCPUManager": False}).container["securityContext"]
    assert "privileged" not in off


@pytest.mark.parametrize(
    "config",
    [
        {"flags": {"plugin": {"passDeviceSpecs": True}}},
        "version: v1\nflags:\n  plugin:\n    passDeviceSpecs: true\n",
    ],
)
def test_pass_device_specs_in_the_config_is_privileged_too(config: object) -> None:
    # The plugin only sees the host's /dev/nvidia* nodes privileged, wherever the setting is made.
    rendered = render({"config": {"map": {"default": config}}})
    assert rendered.container["securityContext"]["privileged"] is True
    off = {"flags": {"plugin": {"passDeviceSpecs": False}}}
    context = render({"config": {"map": {"default": off}}}).container["securityContext"]
    assert "privileged" not in context


# --- MPS ------------------------------------------------------------------------------------------


def test_mps_mounts_the_root_and_a_tmpfs_for_its_shared_memory(
    renders: dict[str, Rendered],
) -> None:
    rendered = renders["mps"]
    pod, container = rendered.pod, rendered.container
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["mps-root"]["hostPath"] == {
        "path": "/var/run/nvidia/mps",
        "type": "DirectoryOrCreate",
    }
    # DirectoryOrCreate: the kubelet checks the type before the init container makes the
    # directory, so a node that never had MPS would wait in Init forever with Directory.
    assert volumes["mps-shm"]["hostPath"] == {
        "path": "/var/run/nvidia/mps/shm",
        "type": "DirectoryOrCreate",
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["mps-root"] == {
        "name": "mps-root",
        "mountPath": "/mps",  # NVIDIA's container root: the plugin looks there first
        "mountPropagation": "HostToContainer",
    }
    assert mounts["mps-shm"] == {"name": "mps-shm", "mountPath": "/dev/shm"}
    # The tmpfs NVIDIA's MPS daemon set mounts, made by an init container that puts it on the host.
    (init,) = pod["initContainers"]
    assert init["image"] == container["image"]
    assert init["securityContext"]["privileged"] is True
    assert init["volumeMounts"] == [
        {"name": "mps-root", "mountPath": "/mps", "mountPropagation": "Bidirectional"}
    ]
    script = init["command"][-1]
    assert "mount -t tmpfs" in script and "size=64M" in script and "/mps/shm" in script
    # MPS_ROOT: the host path the plugin names in Allocate; CUDA for the daemon; privileged for
    # the compute mode. No host IPC or PID namespace: shared memory and pipes are mounted.
    assert rendered.env["MPS_ROOT"] == "/var/run/nvidia/mps"
    assert rendered.env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert container["securityContext"]["privileged"] is True
    for key in ("hostIPC", "hostPID", "hostNetwork", "shareProcessNamespace"):
        assert key not in pod


def _extra_env_names(values: dict[str, Any]) -> set[str]:
    """The variables NVIDIA's ``devicePlugin.containers.main.env`` value gives the container."""
    env = values.get("devicePlugin", {}).get("containers", {}).get("main", {}).get("env", [])
    return {entry["name"] for entry in env}


def test_without_an_mps_config_nothing_of_mps_is_mounted(renders: dict[str, Rendered]) -> None:
    for case in set(VALUE_SETS) - {"mps"}:
        pod = renders[case].pod
        assert "initContainers" not in pod, case
        assert not {"mps-root", "mps-shm"} & {v["name"] for v in pod["volumes"]}, case
        given = _extra_env_names(VALUE_SETS[case])  # set by the values themselves
        assert "NVIDIA_DRIVER_CAPABILITIES" not in set(renders[case].env) - given, case
    # Any entry counts: a node may be given it.
    other = render(
        {
            "config": {
                "map": {
                    "a": "version: v1\n",
                    "b": {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
                },
                "default": "a",
            }
        }
    )
    assert other.pod["initContainers"][0]["name"] == "mps-shm"
    empty = render(
        {"config": {"map": {"a": "sharing:\n  mps:\n", "b": {"sharing": None}}, "default": "a"}}
    )
    assert "initContainers" not in empty.pod


# --- scheduling -----------------------------------------------------------------------------------


def test_scheduling_defaults(default: Rendered) -> None:
    pod = default.pod
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
    ]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # Terms are ORed: any one label puts the plugin on the node.
    labels = [(t["matchExpressions"][0]["key"], t["matchExpressions"][0]["values"]) for t in terms]
    assert all(len(t["matchExpressions"]) == 1 for t in terms)
    assert ("nvidia.com/gpu.present", ["true"]) in labels
    assert ("feature.node.kubernetes.io/pci-10de.present", ["true"]) in labels
    assert "nodeSelector" not in pod
    assert "runtimeClassName" not in pod
    assert default.daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }


def test_scheduling_values(renders: dict[str, Rendered]) -> None:
    rendered = renders["everything"]
    pod = rendered.pod
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert "priorityClassName" not in pod
    assert pod["securityContext"] == {"fsGroup": 0}
    assert rendered.daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "affinity" not in renders["no-probes"].pod
    assert "tolerations" not in renders["no-probes"].pod
    assert rendered.container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}


# --- names, labels, annotations -------------------------------------------------------------------


def test_names_and_namespace_overrides(renders: dict[str, Rendered]) -> None:
    rendered = renders["overrides"]
    for obj in rendered.objects:
        assert obj["metadata"]["namespace"] == "gpu-operator"
    assert rendered.daemonset["metadata"]["name"] == "gpu"
    assert (
        render({"fullnameOverride": "gpu", "config": {"map": {"c": ""}}}).one("ConfigMap")[
            "metadata"
        ]["name"]
        == "gpu-config"
    )
    ds = renders["everything"].daemonset
    assert ds["metadata"]["name"] == "nvplugin-gpu-plugin"
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpu-plugin",
        "app.kubernetes.io/instance": "nvplugin",
    }


def test_selector_matches_pod_labels(renders: dict[str, Rendered]) -> None:
    for case, rendered in renders.items():
        ds = rendered.daemonset
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items(), case
    labels = renders["everything"].daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels["example.com/tier"] == "node"


def test_config_edits_do_not_roll_the_pods(renders: dict[str, Rendered]) -> None:
    # The plugin follows the ConfigMap in place: no checksum of it in the pod template.
    one = render({"config": {"map": {"c": "nvplugin:\n  preStartRequired: true\n"}}})
    other = render({"config": {"map": {"c": "nvplugin:\n  preStartRequired: false\n"}}})
    assert one.daemonset == other.daemonset
    for rendered in renders.values():
        annotations = rendered.daemonset["spec"]["template"]["metadata"]["annotations"]
        assert not [name for name in annotations if name.startswith("checksum/")]
    annotations = renders["everything"].daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "ml"


def test_notes_tell_the_user_where_to_look(renders: dict[str, Rendered]) -> None:
    notes = renders["defaults"].notes
    assert "kube-system/nvplugin" in notes
    assert f"{DEVICE_PLUGIN_DIR}/nvplugin-gpu.sock" in notes
    assert r".status.allocatable.nvidia\.com/gpu" in notes
    assert "SIMULATED" in renders["everything"].notes
    assert "SIMULATED" not in notes


# --- node labels (gfd.enabled) ----------------------------------------------------------------


FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def test_gfd_enabled_labels_from_the_plugin_pod(renders: dict[str, Rendered]) -> None:
    """NVIDIA's gfd.enabled: no second DaemonSet; the plugin pod writes GFD's feature file into
    NFD's directory on the host, GFD's noTimestamp and sleepInterval passed as GFD's variables."""
    rendered = renders["labels"]
    assert rendered.kinds() == ["DaemonSet"]
    assert rendered.env["GFD_OUTPUT_FILE"] == f"{FEATURES_DIR}/gfd"
    assert rendered.env["GFD_NO_TIMESTAMP"] == "true"
    assert rendered.env["GFD_SLEEP_INTERVAL"] == "5m"
    mount = next(m for m in rendered.container["volumeMounts"] if m["name"] == "node-features")
    assert mount == {"name": "node-features", "mountPath": FEATURES_DIR}  # read-write
    volume = next(v for v in rendered.pod["volumes"] if v["name"] == "node-features")
    assert volume["hostPath"] == {"path": FEATURES_DIR, "type": "DirectoryOrCreate"}
    assert "automountServiceAccountToken" in rendered.pod  # the file mode needs no API access
    assert rendered.pod["automountServiceAccountToken"] is False
    assert "Node Feature Discovery's worker" in rendered.notes
    assert "kubectl get pods -A -l app.kubernetes.io/name=node-feature-discovery" in rendered.notes


NODEFEATURE_RULES = [
    {
        "apiGroups": ["nfd.k8s-sigs.io"],
        "resources": ["nodefeatures"],
        "verbs": ["create", "get", "update"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
]


def test_nodefeature_mode_gets_a_namespaced_role_and_nothing_more(
    renders: dict[str, Rendered],
) -> None:
    """gfd.enabled with NVIDIA's (v0.17, v0.18) nfd.enableNodeFeatureApi: the plugin publishes a
    NodeFeature object; the chart passes GFD_USE_NODE_FEATURE_API and the pod's node, namespace
    and name (the downward API), and grants create/get/update of NodeFeatures and get of pods
    in the release's namespace: a Role, no ClusterRole, no list/watch/delete. No host directory."""
    rendered = renders["nodefeatures"]
    assert rendered.kinds() == ["DaemonSet", "Role", "RoleBinding", "ServiceAccount"]
    assert rendered.env["GFD_USE_NODE_FEATURE_API"] == "true"
    assert rendered.env_fields == {
        "NODE_NAME": "spec.nodeName",
        "NAMESPACE": "metadata.namespace",
        "POD_NAME": "metadata.name",
    }
    role = rendered.one("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == NODEFEATURE_RULES
    binding = rendered.one("RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvplugin", "namespace": NAMESPACE}
    ]
    assert rendered.pod["serviceAccountName"] == "nvplugin"
    assert rendered.pod["automountServiceAccountToken"] is True
    assert all(v["name"] != "node-features" for v in rendered.pod["volumes"])
    assert "kubectl get crd nodefeatures.nfd.k8s-sigs.io" in rendered.notes
    # With per-node configs too: both grants, NODE_NAME once.
    both = render({**VALUE_SETS["nodefeatures"], "config": {"name": "my-nvplugin"}})
    assert both.kinds() == sorted(["DaemonSet", "Role", "RoleBinding", *RBAC])
    names = [e["name"] for e in both.container["env"]]
    assert names.count("NODE_NAME") == 1 and "NAMESPACE" in names
    # Without gfd.enabled, enableNodeFeatureApi (NFD's own setting too) changes nothing here.
    alone = render({"nfd": {"enableNodeFeatureApi": True}})
    assert alone.kinds() == ["DaemonSet"] and "GFD_USE_NODE_FEATURE_API" not in alone.env


def test_labelling_is_off_by_default(default: Rendered) -> None:
    assert not {"GFD_OUTPUT_FILE", "GFD_NO_TIMESTAMP", "GFD_SLEEP_INTERVAL"} & set(default.env)
    assert all(v["name"] != "node-features" for v in default.pod["volumes"])
    assert "feature" not in default.notes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"gfd": {"enabled": True, "nameOverride": "gfd"}},
            'values.gfd.nameOverride: "gfd": nvplugin\'s chart deploys no GPU Feature Discovery',
        ),
        ({"gfd": {"enabled": "yes"}}, "/gfd/enabled"),
        ({"gfd": {"sleepInterval": "a minute"}}, "/gfd/sleepInterval"),
        ({"gfd": {"noTimestamp": "true"}}, "/gfd/noTimestamp"),
    ],
)
def test_gfd_values_nvplugin_cannot_take_fail_rendering(
    values: dict[str, Any], message: str
) -> None:
    assert message in render_error(values)
