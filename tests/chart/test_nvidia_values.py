"""NVIDIA's chart values files, as users have them, through nvplugin's chart with real Helm: each
renders in one go once image.repository names nvplugin's image; every key is honoured with
NVIDIA's meaning or accepted at NVIDIA's default; what the chart cannot do is refused in one
error listing every key path."""

from __future__ import annotations

import copy
import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from nvplugin.chart.values import NVIDIA_VALUES, Use, covering
from nvplugin.config import SETTINGS
from tests.support.helm import CHART_DIR, render, render_error
from tests.support.nvidia import (
    NVIDIA_IMAGE,
    NVPLUGIN_IMAGE,
    VALUES_VERSIONS,
    leaves,
    values,
    with_nvplugin_image,
)

RENDER_ERROR = "execution error at (nvplugin/templates/"
SETTING_VALUES = {
    value.path: path
    for path, setting in SETTINGS.items()
    if setting.chart is not None
    for value in setting.chart.values
}


def _problems(error: str) -> list[str]:
    """The key paths a render error lists."""
    assert error.startswith(RENDER_ERROR), error
    assert "nvplugin's chart cannot use these values" in error, error
    return re.findall(r"^  - values\.([A-Za-z0-9_.]+):", error, re.M)


@pytest.mark.parametrize("version", VALUES_VERSIONS)
def test_nvidias_values_file_renders_in_one_go_with_nvplugins_image(version: str) -> None:
    rendered = render(with_nvplugin_image(values(version)))
    assert rendered.kinds() == ["DaemonSet"]
    assert rendered.container["image"] == f"{NVPLUGIN_IMAGE}:0.1.0"
    for kube in ("1.31", kubernetes_validate.utils.latest_version()):
        kubernetes_validate.validate(rendered.daemonset, kube, strict=True)
    # NVIDIA's scheduling, as NVIDIA's values say it.
    pod = rendered.pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]]
    assert "feature.node.kubernetes.io/cpu-model.vendor_id" in keys
    assert pod["priorityClassName"] == "system-node-critical"
    # securityContext: {} keeps nvplugin's hardened context, as root.
    context = rendered.container["securityContext"]
    assert context["runAsUser"] == 0 and context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("version", VALUES_VERSIONS)
def test_nvidias_image_fails_the_render_naming_image_repository(version: str) -> None:
    error = render_error(values(version))
    assert _problems(error) == ["image.repository"]
    assert f'values.image.repository: "{NVIDIA_IMAGE}" is NVIDIA\'s plugin image' in error
    mirrored = values(version)
    mirrored["image"]["repository"] = "harbor.example.com/nvidia/k8s-device-plugin"
    assert _problems(render_error(mirrored)) == ["image.repository"]


@pytest.mark.parametrize("version", VALUES_VERSIONS)
def test_every_key_of_nvidias_values_is_declared(version: str) -> None:
    """Each key is a setting's chart value or declared in chartvalues.py -- nothing passes
    through undeclared."""
    undeclared = [
        path
        for path in leaves(values(version))
        if path not in SETTING_VALUES and covering(path) is None
    ]
    assert undeclared == []


def _everything_nvplugin_cannot_do(version: str) -> tuple[dict[str, Any], list[str]]:
    data = with_nvplugin_image(values(version))
    data["image"]["repository"] = NVIDIA_IMAGE
    data["gfd"]["enabled"] = True  # honoured, as gfd.sleepInterval
    data["gfd"]["sleepInterval"] = "60s"
    data["gfd"]["nameOverride"] = "gfd"
    data["nfd"]["worker"]["config"]["sources"]["pci"]["deviceClassWhitelist"] = ["03"]
    data["mps"]["enableHostNetwork"] = True
    data["gdsEnabled"] = True
    data["deviceDiscoveryStrategy"] = "tegra"
    data["cdi"]["nvidiaHookPath"] = "/usr/local/bin/nvidia-cdi-hook"
    expected = [
        "image.repository",
        "gfd.nameOverride",
        "nfd.worker.config.sources.pci.deviceClassWhitelist",
        "mps.enableHostNetwork",
        "deviceDiscoveryStrategy",
        "gdsEnabled",
        "cdi.nvidiaHookPath",
    ]
    return data, expected


@pytest.mark.parametrize("version", VALUES_VERSIONS)
def test_one_render_error_lists_every_value_nvplugin_cannot_use(version: str) -> None:
    data, expected = _everything_nvplugin_cannot_do(version)
    error = render_error(data)
    assert sorted(_problems(error)) == sorted(expected)
    assert f"cannot use these values ({len(expected)})" in error
    assert 'values.gfd.nameOverride: "gfd": nvplugin\'s chart deploys no GPU Feature' in error
    assert "values.mps.enableHostNetwork: true: nvplugin runs each MPS control daemon" in error


def test_blocks_accepted_at_nvidias_defaults_of_any_version() -> None:
    """nfd's defaults differ between releases (enableNodeFeatureApi until v0.19): each
    release's block, or a part of it, is accepted; null is "not set"."""
    old, new = values("v0.18.2")["nfd"], values("v0.20.0")["nfd"]
    assert "enableNodeFeatureApi" in old and "enableNodeFeatureApi" not in new
    for nfd in (old, new, {"master": old["master"]}, {"enableNodeFeatureApi": None}):
        render({"nfd": nfd})
    # enableNodeFeatureApi is flags.useNodeFeatureAPI's chart value: honoured at any value.
    error = render_error({"nfd": {**new, "enableNodeFeatureApi": True, "image": {}}})
    assert _problems(error) == ["nfd.image"]


def test_the_declarations_cover_what_the_issue_named() -> None:
    declared = {v.path: v.use for v in NVIDIA_VALUES}
    for path in ("selectorLabelsOverride", "allowDefaultNamespace", "devicePlugin.enabled"):
        assert declared[path] is Use.HONOURED
    for path in ("gfd", "nfd", "mps.enableHostPID", "mps.enableHostNetwork"):
        assert declared[path] is Use.DEFAULTS
    assert "mps.root" in SETTING_VALUES  # honoured: flags.mpsRoot's chart value
    assert declared["image.repository"] is Use.REFUSED
    assert {"cdi.nvidiaHookPath", "cdi.featureFlags", "nvidiaDevRoot"} <= set(SETTING_VALUES)


# --- NVIDIA's values the chart honours, one by one ------------------------------------------------


def test_selector_labels_override() -> None:
    rendered = render({"selectorLabelsOverride": {"app": "nvidia-device-plugin-ds"}})
    daemonset = rendered.daemonset
    assert daemonset["spec"]["selector"]["matchLabels"] == {"app": "nvidia-device-plugin-ds"}
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == "nvidia-device-plugin-ds"
    assert labels["app.kubernetes.io/name"] == "nvplugin"
    default = render().daemonset["spec"]["selector"]["matchLabels"]
    assert default == {
        "app.kubernetes.io/name": "nvplugin",
        "app.kubernetes.io/instance": "nvplugin",
    }


def test_component_selector_labels() -> None:
    daemonset = render({"componentSelectorLabels": {"enabled": True}}).daemonset
    component = {"app.kubernetes.io/component": "device-plugin"}
    assert component.items() <= daemonset["spec"]["selector"]["matchLabels"].items()
    assert component.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_the_default_namespace_needs_allow_default_namespace() -> None:
    with helm.Chart.load(str(CHART_DIR)) as chart, pytest.raises(helm.HelmError) as caught:
        chart.render(None, name="nvplugin", namespace="default", is_install=True)
    assert _problems(str(caught.value)) == ["allowDefaultNamespace"]
    with helm.Chart.load(str(CHART_DIR)) as chart:
        manifests = chart.render(
            {"allowDefaultNamespace": True}, name="nvplugin", namespace="default", is_install=True
        )
    assert "kind: DaemonSet" in manifests["nvplugin/templates/daemonset.yaml"]
    # namespaceOverride moves it out of default, as in NVIDIA's chart
    rendered = render({"namespaceOverride": "gpu"}, namespace="default")
    assert rendered.daemonset["metadata"]["namespace"] == "gpu"


def test_device_plugin_disabled_renders_nothing() -> None:
    rendered = render(
        {"devicePlugin": {"enabled": False}, "config": {"map": {"default": "version: v1\n"}}}
    )
    assert rendered.kinds() == []
    assert "devicePlugin.enabled is false: nothing is deployed" in rendered.notes
    # still checked: a disabled plugin with NVIDIA's image is refused all the same
    error = render_error(
        {"devicePlugin": {"enabled": False}, "image": {"repository": NVIDIA_IMAGE}}
    )
    assert _problems(error) == ["image.repository"]


def test_host_network() -> None:
    pod = render({"devicePlugin": {"enableHostNetwork": True}}).pod
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostNetwork" not in render().pod


def test_main_container_env() -> None:
    env = [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    rendered = render({"devicePlugin": {"containers": {"main": {"env": env}}}})
    assert rendered.container["env"][-1] == env[0]
    taken = [{"name": "MIG_STRATEGY", "value": "mixed"}]
    error = render_error(
        {"migStrategy": "single", "devicePlugin": {"containers": {"main": {"env": taken}}}}
    )
    assert _problems(error) == ["devicePlugin.containers.main.env"]
    assert "MIG_STRATEGY is set by the chart from a value" in error


def test_nvidia_dev_root_and_cdi_values() -> None:
    rendered = render({"nvidiaDevRoot": "/run/nvidia/driver", "cdi": {"nvidiaHookPath": None}})
    assert rendered.env["NVIDIA_DEV_ROOT"] == "/run/nvidia/driver"
    assert "NVIDIA_CDI_HOOK_PATH" not in rendered.env
    render({"cdi": {"nvidiaHookPath": "/usr/bin/nvidia-ctk", "featureFlags": ""}})
    error = render_error({"cdi": {"featureFlags": "disable-nvsandboxutils"}})
    assert _problems(error) == ["cdi.featureFlags"]


def test_a_privileged_security_context_as_nvidias_chart_takes_it() -> None:
    """NVIDIA's chart uses securityContext as given; {privileged: true} merged onto nvplugin's
    hardened one must still be a context Kubernetes accepts."""
    rendered = render({"securityContext": {"privileged": True}})
    context = rendered.container["securityContext"]
    assert context["privileged"] is True and context["allowPrivilegeEscalation"] is True
    assert "capabilities" not in context
    kubernetes_validate.validate(rendered.daemonset, "1.31", strict=True)


def test_nvidias_values_do_not_change_what_nvplugin_renders_by_default() -> None:
    """NVIDIA's keys at NVIDIA's defaults add nothing: the DaemonSet is nvplugin's, but for the
    scheduling NVIDIA's values spell out."""
    mine = render({"image": {"repository": NVPLUGIN_IMAGE}}).daemonset
    theirs = render(with_nvplugin_image(values("v0.18.2"))).daemonset
    for obj in (mine, theirs):
        spec = obj["spec"]["template"]["spec"]
        for key in ("affinity", "tolerations"):
            spec.pop(key)
    assert copy.deepcopy(mine) == theirs


def test_the_chart_readme_shows_the_error_helm_prints() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    shown = re.search(r"```text\n(nvplugin's chart cannot use .*?)\n```", readme, re.S)
    assert shown is not None
    error = render_error({"image": {"repository": NVIDIA_IMAGE}, "nfd": {"enabled": True}})
    assert error.startswith(RENDER_ERROR)
    assert error.split("): ", 1)[1] == shown.group(1)
