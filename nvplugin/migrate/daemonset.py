"""A DaemonSet manifest written for NVIDIA's image -> the same with nvplugin's image.

nvplugin's image runs such a DaemonSet as it is: its entrypoint serves, and it has NVIDIA's
``nvidia-device-plugin`` command. What can still stop it is read here the way the plugin reads it:
each flag and environment variable of the plugin container by the plugin's own loader (a value
nvplugin refuses is named, with the variable), and the user it runs as (root only: the kubelet's
directory is root's). What NVIDIA's chart runs beside the plugin (the config manager, GPU
Feature Discovery, the MPS control daemon) the plugin does itself: :mod:`.companions` drops them
and gives the plugin's pod what they brought.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nvplugin import __version__, yamlinput
from nvplugin.config import flag_names, load_config
from nvplugin.config.loader import (
    DISABLE_HEALTHCHECKS,
    ENABLE_HEALTHCHECKS,
    REFUSED_NAMES,
    env_names,
    refused_names,
)
from nvplugin.config.select import FLAGS
from nvplugin.errors import InputError
from nvplugin.migrate import companions
from nvplugin.migrate.findings import Migration, Status

RUNTIME_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_MONITOR_DEVICES")
"""Read by the NVIDIA container runtime, not by the plugin."""
SELECTION_ENV = frozenset(env for _, env in FLAGS.values())
"""Per-node selection's variables (NVIDIA's config manager's names), which serve reads."""
REFUSED_ENV = frozenset(r.env for r in REFUSED_NAMES)
"""NVIDIA's variables nvplugin refuses by name: read by the loader, which names them."""
PLUGIN_COMMANDS = ((), ("nvidia-device-plugin",))
"""The plugin container's command: none (the image's entrypoint) or NVIDIA's command."""
OTHER_COMMANDS = {
    "config-manager": "NVIDIA's config manager, in a pod without NVIDIA's plugin: nvplugin's "
    "plugin follows the node's label itself (per-node configs); remove this container",
    "gpu-feature-discovery": "GPU Feature Discovery beside the plugin in one pod: nvplugin's "
    "plugin writes GFD's labels itself (GFD_OUTPUT_FILE); remove this container",
    "mps-control-daemon": "NVIDIA's MPS control daemon beside the plugin in one pod: nvplugin's "
    "plugin runs the MPS control daemons itself; remove this container",
}


def migrate_daemonset(text: str, source: str, repository: str) -> Migration:
    """The migration of the manifests in ``text`` (named ``source``): every DaemonSet's
    containers of NVIDIA's image; NVIDIA's GPU Feature Discovery and MPS control daemon
    DaemonSets dropped, their work given to the plugin's; other objects pass unchanged."""
    documents = [doc for doc in yamlinput.load_all(text, source) if doc is not None]
    if not any(isinstance(doc, dict) and doc.get("kind") == "DaemonSet" for doc in documents):
        raise InputError(f"{source}: no DaemonSet in it")
    migration = Migration(
        "daemonset",
        f"nvplugin migrate: NVIDIA's DaemonSet {source} -> with nvplugin's image "
        "(kubectl apply -f THIS_FILE)",
        documents,
    )
    image = f"{repository}:{__version__}"
    kept, found = companions.collect(documents, migration)
    migration.output = kept
    configmaps = {
        str((doc.get("metadata") or {}).get("name")): doc.get("data") or {}
        for doc in kept
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap"
    }
    for doc in kept:
        if isinstance(doc, dict) and doc.get("kind") == "DaemonSet":
            plugin = _daemonset(doc, migration, image)
            if plugin is not None:
                companions.translate(doc, plugin, configmaps, found, migration, image)
    if found.gfd is not None:
        migration.add(
            found.gfd_name,
            Status.DIFFERS,
            "NVIDIA's chart with gfd.enabled also deploys Node Feature Discovery, which turns "
            "the feature file into node labels; nvplugin does not: keep NFD running (deploy it "
            "with its own chart if it came with NVIDIA's release) or no label arrives",
        )
    return migration


def _containers(pod: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("initContainers", "containers"):
        for container in pod.get(field) or []:
            if isinstance(container, dict):
                yield f"{field}[{container.get('name', '?')}]", container


def _daemonset(doc: dict[str, Any], migration: Migration, image: str) -> dict[str, Any] | None:
    """The DaemonSet's containers of NVIDIA's image migrated; its plugin container (None: it
    has none)."""
    name = companions.name_of(doc)
    pod = companions.pod_of(doc)
    plugins = [
        c
        for _, _, c in companions.containers(pod)
        if companions.nvidias(c) and tuple(c.get("command") or ()) in PLUGIN_COMMANDS
    ]
    plugin = plugins[0] if len(plugins) == 1 else None
    for where, container in _containers(pod):
        key = f"{name}: {where}"
        if not companions.nvidias(container):
            continue
        command = tuple(container.get("command") or ())
        if command not in PLUGIN_COMMANDS:
            program = companions.command_of(container)
            if plugin is not None and program == companions.CONFIG_MANAGER:
                continue  # dropped with what it did given to the plugin (companions)
            why = OTHER_COMMANDS.get(program, "not NVIDIA's plugin command")
            migration.add(f"{key}.command", Status.REFUSED, why, list(command))
            continue
        migration.add(
            f"{key}.image",
            Status.CHANGED,
            f"NVIDIA's plugin image -> {image}, nvplugin's (its entrypoint serves, and it has "
            "NVIDIA's nvidia-device-plugin command)",
            container.get("image"),
        )
        container["image"] = image
        if not command and container.get("args"):
            # NVIDIA's image's entrypoint is nvidia-device-plugin, nvplugin's is nvplugin: flags
            # given as args need NVIDIA's command named.
            migration.add(
                f"{key}.command",
                Status.CHANGED,
                "(none) -> [nvidia-device-plugin]: the args are NVIDIA's flags, which NVIDIA's "
                "image's entrypoint took; nvplugin's image's entrypoint is nvplugin",
            )
            container["command"] = ["nvidia-device-plugin"]
        _user(key, container, pod, migration)
        _settings(key, container, migration)
    return plugin


def _user(key: str, container: dict[str, Any], pod: dict[str, Any], migration: Migration) -> None:
    for where, context in (("securityContext", container), ("pod securityContext", pod)):
        sc = context.get("securityContext") or {}
        user = sc.get("runAsUser")
        if user not in (None, 0):
            migration.add(
                f"{key}.{where}.runAsUser",
                Status.REFUSED,
                "the plugin must run as root (the kubelet's device-plugin directory and "
                "kubelet.sock are root's); as another user it exits 2 saying so",
                user,
            )
            return
        if sc.get("runAsNonRoot") is True:
            migration.add(
                f"{key}.{where}.runAsNonRoot",
                Status.REFUSED,
                "the plugin runs as root (the image's default user, as NVIDIA's), which "
                "runAsNonRoot forbids",
                True,
            )
            return


def _settings(key: str, container: dict[str, Any], migration: Migration) -> None:
    """The container's flags and environment, each read by the plugin's loader on its own
    (every problem named, not just the first), then together (rules across keys)."""
    env = {
        e["name"]: str(e["value"])
        for e in container.get("env") or []
        if isinstance(e, dict) and "name" in e and "value" in e
    }
    known = env_names()
    before = len(migration.refused)
    everything: dict[str, str] = {}
    for name, value in env.items():
        if name in RUNTIME_ENV or name == "CONFIG_FILE":
            continue
        if name == ENABLE_HEALTHCHECKS and DISABLE_HEALTHCHECKS in env:
            continue  # read with DP_DISABLE_HEALTHCHECKS: the pair means one thing
        if name in (DISABLE_HEALTHCHECKS, ENABLE_HEALTHCHECKS):
            one = {n: env[n] for n in (DISABLE_HEALTHCHECKS, ENABLE_HEALTHCHECKS) if n in env}
        elif name in SELECTION_ENV:
            continue  # per-node selection's: read by serve, checked with the configs
        elif name in known or name.startswith("NVPLUGIN_") or name in REFUSED_ENV:
            one = {name: value}
        else:
            migration.add(f"{key}.env.{name}", Status.UNKNOWN, "not read by nvplugin; kept", value)
            continue
        everything.update(one)
        _load(f"{key}.env.{name}", migration, env=one)
    flags, problems = _parse_args([str(a) for a in container.get("args") or []])
    for arg, problem in problems:
        migration.add(f"{key}.args", Status.REFUSED, problem, arg)
    for path, (arg, given) in flags.items():
        _load(f"{key}.args", migration, flags={path: given}, arg=arg)
    if len(migration.refused) == before:
        _load(f"{key}", migration, env=everything, flags={p: v for p, (_, v) in flags.items()})


def _load(
    key: str,
    migration: Migration,
    *,
    env: dict[str, str] | None = None,
    flags: dict[str, object] | None = None,
    arg: str | None = None,
) -> None:
    try:
        load_config(None, env=env, flags=flags)
    except InputError as exc:
        migration.add(key, Status.REFUSED, str(exc), arg)


def _parse_args(args: list[str]) -> tuple[dict[str, tuple[str, object]], list[tuple[str, str]]]:
    """NVIDIA's flags as its command reads them (``--flag=value``, ``--flag value``, a boolean
    flag alone, one dash or two; a list flag repeated) -> key path -> (the argument, its value);
    and the arguments that are no flag of it. ``--config-file`` names a file in the pod: it is
    left to the plugin."""
    from nvplugin.config import SETTINGS
    from nvplugin.config.schema import List, Nullable

    names = flag_names()
    given: dict[str, tuple[str, list[str]]] = {}
    problems: list[tuple[str, str]] = []
    position = 0
    while position < len(args):
        arg = args[position]
        position += 1
        if not arg.startswith("-"):
            problems.append((arg, "not a flag of nvidia-device-plugin"))
            continue
        name, equals, value = arg.lstrip("-").partition("=")
        if name in ("config-file", "config"):
            position += 0 if equals else 1
            continue
        path = names.get(name)
        refused = {r.flag: r for r in REFUSED_NAMES}.get(name)
        if path is None and refused is not None:
            if not equals:
                following = args[position] if position < len(args) else None
                if following is not None and not following.startswith("-"):
                    value, position = following, position + 1
                else:
                    value = "true"
            problems.extend((arg, p) for p in refused_names({}, {name: value}))
            continue
        if path is None:
            problems.append((arg, "not a flag of nvidia-device-plugin"))
            continue
        if not equals:
            following = args[position] if position < len(args) else None
            if following is not None and not following.startswith("-"):
                value, position = following, position + 1
            else:
                value = "true"  # a boolean flag alone
        given.setdefault(path, (arg, []))[1].append(value)
    flags: dict[str, tuple[str, object]] = {}
    for path, (arg, values) in given.items():
        kind = SETTINGS[path].kind
        kind = kind.inner if isinstance(kind, Nullable) else kind
        flags[path] = (arg, values if isinstance(kind, List) else values[-1])
    return flags, problems
