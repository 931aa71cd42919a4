"""NVIDIA's Helm chart values (nvidia-device-plugin v0.17 to v0.20): every key, and what
nvplugin's chart does with each -- declared once, here.

A values file written for NVIDIA's chart (``helm show values``, edited) is passed to nvplugin's
chart unchanged; each of its keys is one of these:

- the chart value of a setting (``migStrategy``, ``deviceListStrategy``, ``cdi.nvidiaHookPath``,
  ...): declared with the setting (:mod:`nvplugin.config.model`, its ``chart``), not here;
- :attr:`Use.SAME`: nvplugin's chart has the value under the same name, with NVIDIA's meaning
  (``nameOverride``, ``affinity``, ``config.map``, ...); ``differs`` says what is not quite the
  same;
- :attr:`Use.HONOURED`: a value of NVIDIA's that nvplugin's chart implements with NVIDIA's
  meaning (``selectorLabelsOverride``, ``devicePlugin.enabled``, ...): its type, nvplugin's default
  and help are declared here, and ``charts/generate_schema.py`` writes them into the chart;
- :attr:`Use.DEFAULTS`: accepted at NVIDIA's defaults (``nvidia``, the defaults of every
  version), refused otherwise with ``why`` -- what the chart cannot do (yet). A key whose feature
  lands in nvplugin flips to ``HONOURED`` here, in one place;
- :attr:`Use.REFUSED`: refused even at NVIDIA's default (``image.repository``: NVIDIA's image is
  not nvplugin).

The chart's templates refuse every value they cannot use in one render error that lists them
all, with their key paths (``values.gfd.nameOverride``, ...); ``nvplugin migrate`` reads a values
file against the same declarations.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

JsonSchema = dict[str, Any]


class Use(enum.Enum):
    """What nvplugin's chart does with one of NVIDIA's values."""

    SAME = "same"
    """nvplugin's chart has it, same name and meaning (its own hand-written value)."""
    HONOURED = "honoured"
    """NVIDIA's value, implemented by nvplugin's chart as declared here."""
    DEFAULTS = "defaults"
    """Accepted at NVIDIA's defaults only; refused otherwise, saying why."""
    REFUSED = "refused"
    """Refused at NVIDIA's default too."""


def frozen(value: object) -> object:
    """JSON-like data made immutable: mappings as read-only mappings, lists as tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(frozen(item) for item in value)
    return value


def thawed(value: object) -> Any:
    """:func:`frozen` data as plain JSON data (dicts and lists)."""
    if isinstance(value, Mapping):
        return {key: thawed(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [thawed(item) for item in value]
    return value


@dataclass(frozen=True)
class NvidiaValue:
    """One of NVIDIA's chart values (``path`` as in values.yaml, ``devicePlugin.enabled``), or a
    whole block of them (``nfd``: every key below it).

    ``nvidia``: NVIDIA's default(s) across v0.17-v0.20, as :func:`frozen` data (several when the
    versions differ; empty: absent from NVIDIA's values.yaml). ``why``: for DEFAULTS and REFUSED,
    the reason a value is refused; for SAME and HONOURED, how nvplugin's chart differs from
    NVIDIA's (empty: it does not). HONOURED values also declare nvplugin's ``default`` (written
    into values.yaml), their JSON ``schema`` and ``help``. ``settings``: keys below a DEFAULTS
    block that are settings' chart values (declared with the setting: ``gfd.enabled``), honoured
    at any value rather than compared with NVIDIA's defaults.
    """

    path: str
    use: Use
    nvidia: tuple[object, ...] = ()
    why: str = ""
    default: object = None
    schema: JsonSchema | None = None
    help: str = ""
    settings: tuple[str, ...] = ()

    @property
    def parts(self) -> list[str]:
        return self.path.split(".")

    def defaults(self) -> list[Any]:
        """NVIDIA's defaults as JSON data."""
        return [thawed(value) for value in self.nvidia]

    def skipped(self) -> frozenset[str]:
        """The key paths of :attr:`settings`, which :func:`off_defaults` leaves alone."""
        return frozenset(f"{self.path}.{key}" for key in self.settings)


def _v(path: str, use: Use, *nvidia: object, **rest: Any) -> NvidiaValue:
    return NvidiaValue(path, use, tuple(frozen(value) for value in nvidia), **rest)


NVIDIA_IMAGE = re.compile(r"(?:^|/)nvidia/k8s-device-plugin$|^k8s-device-plugin$")
"""``image.repository`` naming NVIDIA's plugin image (``nvcr.io/nvidia/k8s-device-plugin``, or a
mirror of it): refused, since the chart runs ``nvplugin serve`` in it."""


NVIDIA_TAG = re.compile(r"^v0\.[0-9]+\.[0-9]+")
"""``image.tag`` naming one of NVIDIA's plugin releases (``v0.17.4``, ``v0.20.0-ubi9``): NVIDIA's
tags, which nvplugin's image never has (nvplugin's versions carry no ``v``). Left in a values
file whose ``image.repository`` was changed, it names an image that does not exist."""
NVIDIA_TAG_WHY = (
    "is a version of NVIDIA's plugin, not of nvplugin: nvplugin's image has no such tag; set "
    "image.tag to \"\" (nvplugin's version, the chart's appVersion) or to the tag you pushed "
    "nvplugin's image with"
)


NO_DEFAULT = (
    "A default config must be provided when more than one configuration is set in "
    "'config.map'. Either set the default using 'config.default' or provide a list of "
    "fallback strategies to try in 'config.fallbackStrategies'"
)
"""NVIDIA's chart's render error (templates/validation.yml) for a ``config.map`` that leaves a
node without the label with no config; its first sentence is NVIDIA's, word for word."""


def no_default_problem(
    names: list[str], default: str | None, fallbacks: list[str] | tuple[str, ...]
) -> str | None:
    """NVIDIA's chart's rule for ``config.map`` (entries ``names``): without ``config.default``,
    one of ``config.fallbackStrategies`` must find a config -- ``named`` an entry called
    ``default``, ``single`` exactly one entry, ``empty`` always -- else :data:`NO_DEFAULT`
    (the chart's templates apply the same rule: "nvplugin.noDefaultProblem")."""
    if not names or default:
        return None
    if (
        ("named" in fallbacks and "default" in names)
        or ("single" in fallbacks and len(names) == 1)
        or "empty" in fallbacks
    ):
        return None
    return (
        f"{NO_DEFAULT} (config.fallbackStrategies: [{', '.join(fallbacks)}]; config.map's "
        f"entries: {', '.join(sorted(names))})"
    )


GFD_ONLY = (
    "with gfd.enabled, NVIDIA's chart deploys GPU Feature Discovery alone (beside another "
    "device plugin); nvplugin's labels come from its plugin pods, which devicePlugin.enabled="
    "false leaves out, and nvplugin has no labels-only pod (its pods would register "
    "nvidia.com/gpu beside the other plugin): keep NVIDIA's GPU Feature Discovery for such a "
    "node, or set devicePlugin.enabled=true and remove the other plugin"
)
"""Why a GPU-Feature-Discovery-only release (``devicePlugin.enabled=false``,
``gfd.enabled=true``) is refused rather than rendered to nothing."""
NFD_NOT_DEPLOYED = (
    "NVIDIA's chart with gfd.enabled also deploys Node Feature Discovery (its nfd subchart, "
    "Chart.yaml's condition nfd.enabled,gfd.enabled), which turns the feature file or the "
    "NodeFeature objects into node labels; nvplugin's chart does not: deploy NFD with its own "
    "chart (keep NVIDIA's release's NFD, or install node-feature-discovery) before the swap, "
    "or no label arrives"
)
"""What ``migrate`` says of ``gfd.enabled``: the one thing that stops working after the swap."""


def gfd_only(values: Mapping[str, Any]) -> bool:
    """Whether chart ``values`` ask for GPU Feature Discovery without the plugin (the chart's
    templates apply the same rule: "nvplugin.gfdOnly")."""
    plugin = values.get("devicePlugin")
    gfd = values.get("gfd")
    enabled = plugin.get("enabled") if isinstance(plugin, Mapping) else None
    labels = gfd.get("enabled") if isinstance(gfd, Mapping) else None
    return enabled is False and labels is True


def _present(label: str, value: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": label, "operator": "In", "values": [value]}]}


_NFD_TOLERATIONS = [
    {
        "key": "node-role.kubernetes.io/master",
        "operator": "Equal",
        "value": "",
        "effect": "NoSchedule",
    },
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
]
_NFD = {
    "enabled": False,
    "nameOverride": "node-feature-discovery",
    "master": {
        "serviceAccount": {"name": "node-feature-discovery", "create": True},
        "config": {"extraLabelNs": ["nvidia.com"]},
    },
    "worker": {
        "tolerations": _NFD_TOLERATIONS,
        "config": {
            "sources": {
                "pci": {"deviceClassWhitelist": ["02", "03"], "deviceLabelFields": ["vendor"]}
            }
        },
    },
}
_NFD_UNTIL_V019 = {**_NFD, "enableNodeFeatureApi": False}
"""v0.17 and v0.18 also had ``nfd.enableNodeFeatureApi`` (GFD uses the NodeFeature API by
default from v0.19); nvplugin honours it as the chart value of ``flags.useNodeFeatureAPI``."""

NVIDIA_VALUES: tuple[NvidiaValue, ...] = (
    _v("config.name", Use.SAME, ""),
    _v("config.map", Use.SAME, {}),
    _v("config.default", Use.SAME, ""),
    _v("config.fallbackStrategies", Use.SAME, ["named", "single"]),
    _v("nameOverride", Use.SAME, ""),
    _v("fullnameOverride", Use.SAME, ""),
    _v("namespaceOverride", Use.SAME, ""),
    _v("imagePullSecrets", Use.SAME, []),
    _v(
        "image.repository",
        Use.REFUSED,
        "nvcr.io/nvidia/k8s-device-plugin",
        why="is NVIDIA's plugin image, not nvplugin's: set image.repository to where you "
        "pushed nvplugin's image (built from nvplugin's Dockerfile)",
    ),
    _v("image.pullPolicy", Use.SAME, "IfNotPresent"),
    _v(
        "image.tag",
        Use.SAME,
        "",
        why="\"\" is nvplugin's version (the chart's appVersion); one of NVIDIA's versions "
        "(v0.x.y) is refused",
    ),
    _v("updateStrategy", Use.SAME, {"type": "RollingUpdate"}),
    _v("podAnnotations", Use.SAME, {}),
    _v("podSecurityContext", Use.SAME, {}),
    _v(
        "securityContext",
        Use.SAME,
        {},
        why="yours is merged onto nvplugin's hardened one (uid 0, every capability dropped, a "
        "read-only root filesystem, the RuntimeDefault seccomp profile); NVIDIA's chart uses "
        "yours instead of its own",
    ),
    _v(
        "resources",
        Use.SAME,
        {},
        why="{} keeps nvplugin's defaults (requests cpu 50m, memory 96Mi; limit memory 256Mi); "
        "NVIDIA's chart sets none",
    ),
    _v("nodeSelector", Use.SAME, {}),
    _v(
        "affinity",
        Use.SAME,
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        _present("feature.node.kubernetes.io/pci-10de.present", "true"),
                        _present("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"),
                        _present("nvidia.com/gpu.present", "true"),
                    ]
                }
            }
        },
        why="nvplugin's default also takes NFD's pci-0302_10de and pci-0300_10de labels, not "
        "cpu-model.vendor_id (Tegra is not supported)",
    ),
    _v(
        "tolerations",
        Use.SAME,
        [
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
    ),
    _v("priorityClassName", Use.SAME, "system-node-critical"),
    _v("runtimeClassName", Use.SAME, None),
    _v(
        "selectorLabelsOverride",
        Use.HONOURED,
        {},
        default={},
        schema={"type": "object", "additionalProperties": {"type": "string"}},
        help="NVIDIA's: the DaemonSet's selector labels instead of name and instance (also "
        "added to the pods' labels).",
    ),
    _v(
        "componentSelectorLabels.enabled",
        Use.HONOURED,
        False,
        default=False,
        schema={"type": "boolean"},
        help="NVIDIA's: add `app.kubernetes.io/component: device-plugin` to the selector and "
        "the pods' labels (a DaemonSet's selector cannot change: only for new releases).",
    ),
    _v(
        "allowDefaultNamespace",
        Use.HONOURED,
        False,
        default=False,
        schema={"type": "boolean"},
        help="NVIDIA's: installing into the `default` namespace fails rendering unless this "
        "is true.",
    ),
    _v(
        "devicePlugin.enabled",
        Use.HONOURED,
        True,
        default=True,
        schema={"type": "boolean"},
        help="NVIDIA's: false renders no plugin (no DaemonSet, no ConfigMap).",
    ),
    _v(
        "devicePlugin.enableHostNetwork",
        Use.HONOURED,
        default=False,
        schema={"type": "boolean"},
        help="NVIDIA's: run the pods with `hostNetwork: true` (and `dnsPolicy: "
        "ClusterFirstWithHostNet`); the health and metrics ports are then the node's.",
    ),
    _v(
        "devicePlugin.containers.main.env",
        Use.HONOURED,
        [  # main after v0.20.0 (no tag up to v0.20.0 has the key: its template set these)
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ],
        default=[],
        schema={
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}},
            },
        },
        help="NVIDIA's: extra environment variables of the plugin container (after the ones "
        "the chart sets from values; a name the chart sets fails rendering). The image already "
        "sets `NVIDIA_VISIBLE_DEVICES=all`, `NVIDIA_DRIVER_CAPABILITIES=utility`.",
        why="nvplugin's default is [] (its image sets NVIDIA_VISIBLE_DEVICES=all and "
        "NVIDIA_DRIVER_CAPABILITIES=utility, all NVML needs)",
    ),
    _v(
        "gfd",
        Use.DEFAULTS,
        {
            "enabled": False,
            "nameOverride": "gpu-feature-discovery",
            "namespaceOverride": "",
            "noTimestamp": None,
            "sleepInterval": None,
            "securityContext": {"privileged": True},
            "enableHostNetwork": False,
        },
        why="nvplugin's chart deploys no GPU Feature Discovery DaemonSet (gfd.enabled makes the "
        "plugin pods label their nodes themselves); leave the other gfd.* values at NVIDIA's "
        "defaults or remove them",
        settings=("enabled", "noTimestamp", "sleepInterval"),
    ),
    _v(
        "nfd",
        Use.DEFAULTS,
        _NFD,
        _NFD_UNTIL_V019,
        why="nvplugin's chart does not deploy Node Feature Discovery (deploy it on its own, with "
        "its own chart); leave nfd.* at NVIDIA's defaults or remove it",
        settings=("enableNodeFeatureApi",),
    ),
    _v(
        "mps.enableHostPID",
        Use.DEFAULTS,
        True,  # v0.20.0 and after
        False,  # v0.18.2
        why="nvplugin runs each MPS control daemon in its own pod, which needs neither the host's "
        "PID namespace nor its network (NVIDIA's MPS DaemonSet does); leave mps.enableHostPID "
        "and mps.enableHostNetwork at NVIDIA's defaults or remove them",
    ),
    _v(
        "mps.enableHostNetwork",
        Use.DEFAULTS,
        False,
        why="nvplugin runs each MPS control daemon in its own pod, which needs neither the host's "
        "PID namespace nor its network (NVIDIA's MPS DaemonSet does); leave mps.enableHostPID "
        "and mps.enableHostNetwork at NVIDIA's defaults or remove them",
    ),
)
"""Every one of NVIDIA's chart values that is not a setting's chart value, in NVIDIA's order."""

BY_PATH: Mapping[str, NvidiaValue] = MappingProxyType({v.path: v for v in NVIDIA_VALUES})


def covering(path: str) -> NvidiaValue | None:
    """The declaration of ``path`` or of a block above it (``gfd`` covers ``gfd.nameOverride``)."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        found = BY_PATH.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def off_defaults(
    value: object, defaults: list[Any], path: str, skip: frozenset[str] = frozenset()
) -> list[str]:
    """The key paths under ``path`` where ``value`` is not one of NVIDIA's ``defaults`` (null is
    "not set", always accepted): a mapping is compared key by key against the mappings among
    the defaults, so a partial block at NVIDIA's defaults passes; the key paths in ``skip`` (a
    block's :attr:`NvidiaValue.settings`) are not compared. The chart's templates apply the same
    rule ("nvplugin.offDefaults")."""
    if value is None or _json(value) in {_json(d) for d in defaults}:
        return []
    maps = [d for d in defaults if isinstance(d, dict)]
    if not isinstance(value, dict) or not maps:
        return [path]
    out: list[str] = []
    for key in sorted(value):
        sub = f"{path}.{key}"
        if sub in skip:
            continue
        below = [d[key] for d in maps if key in d]
        out.extend(off_defaults(value[key], below, sub, skip) if below else [sub])
    return out


def _json(value: object) -> str:
    """Values compared as JSON (so true is not 1), as the templates compare them."""
    return json.dumps(value, sort_keys=True)
