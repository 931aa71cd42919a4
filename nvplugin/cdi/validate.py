"""CDI's spec format, restated as checks, and the least spec version a spec's fields need.

The schema (CDI's ``schema/schema.json``, in words): a spec is an object with ``cdiVersion`` (a
released version string), ``kind`` (``<vendor>/<class>``), ``devices`` (a list) and optionally
``containerEdits`` and ``annotations`` (string to string). A device has a ``name`` and
``containerEdits`` (and optional ``annotations``). Container edits hold ``env`` (``KEY=VALUE``
strings), ``deviceNodes`` (``path`` required and absolute; optional ``hostPath``, ``type`` one of
``b c u p``, ``major``/``minor``/``fileMode``/``uid``/``gid`` non-negative integers,
``permissions`` of ``r w m``), ``mounts`` (``hostPath`` and an absolute ``containerPath``
required; ``options`` strings, ``type``), ``hooks`` (``hookName`` one of the OCI hook points,
an absolute ``path``; ``args``, ``env`` strings, ``timeout`` an integer), ``additionalGids`` and
``intelRdt``.

The rules beyond the schema (CDI's ``pkg/cdi`` and ``specs-go`` validation): the kind's and each
device name's syntax, names unique in the spec, a device's edits not empty, a ``b``/``c`` node
with both major and minor, and a version no lower than the fields used require:
0.4.0 for a mount ``type``, 0.5.0 for a device node ``hostPath`` or a device name beginning
with a digit, 0.6.0 for annotations or a ``.`` in the class, 0.7.0 for ``intelRdt`` or
``additionalGids`` (``specs-go/version.go`` of the CDI repository). Loaders reject a spec whose
version is lower than that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvplugin.config.rules import cdi_kind_problem, cdi_name_problem

VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
"""The released spec versions, oldest first; 0.3.0 is the oldest loaders accept."""
HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)
NODE_TYPES = ("b", "c", "u", "p")
_SPEC_KEYS = {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
_DEVICE_KEYS = {"name", "containerEdits", "annotations"}
_EDIT_KEYS = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt"}
_NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
_MOUNT_KEYS = {"hostPath", "containerPath", "options", "type"}
_HOOK_KEYS = {"hookName", "path", "args", "env", "timeout"}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = [spec.get("containerEdits") or {}]
    found += [(d.get("containerEdits") or {}) for d in spec.get("devices") or []]
    return [e for e in found if isinstance(e, Mapping)]


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The least CDI version whose fields ``spec`` uses (see the module docstring)."""
    edits = _edits(spec)
    devices = [d for d in spec.get("devices") or [] if isinstance(d, Mapping)]
    klass = str(spec.get("kind", "")).partition("/")[2]
    if any(e.get("intelRdt") or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in klass:
        return "0.6.0"
    names = [str(d.get("name", "")) for d in devices]
    nodes = [n for e in edits for n in e.get("deviceNodes") or [] if isinstance(n, Mapping)]
    if any(n and not n[0].isalpha() for n in names) or any(n.get("hostPath") for n in nodes):
        return "0.5.0"
    mounts = [m for e in edits for m in e.get("mounts") or [] if isinstance(m, Mapping)]
    if any(m.get("type") for m in mounts):
        return "0.4.0"
    return "0.3.0"


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def say(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def keys(self, value: Any, allowed: set[str], required: tuple[str, ...], where: str) -> bool:
        if not isinstance(value, Mapping):
            self.say(where, "expected an object")
            return False
        for key in sorted(set(value) - allowed):
            self.say(where, f"unknown field {key!r}")
        for key in required:
            if key not in value:
                self.say(where, f"{key!r} is required")
        return True

    def strings(self, value: Any, where: str) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.say(where, "expected a list of strings")

    def integer(self, value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.say(where, f"expected a non-negative integer, got {value!r}")

    def absolute(self, value: Any, where: str) -> None:
        if not isinstance(value, str) or not value.startswith("/"):
            self.say(where, f"expected an absolute path, got {value!r}")

    def edits(self, edits: Any, where: str) -> None:
        if not self.keys(edits, _EDIT_KEYS, (), where):
            return
        if "env" in edits:
            self.strings(edits["env"], f"{where}.env")
            for entry in edits["env"] if isinstance(edits["env"], list) else []:
                if isinstance(entry, str) and "=" not in entry[1:]:
                    self.say(f"{where}.env", f"{entry!r} is not KEY=VALUE")
        for n, node in enumerate(edits.get("deviceNodes") or []):
            self.node(node, f"{where}.deviceNodes[{n}]")
        for n, mount in enumerate(edits.get("mounts") or []):
            here = f"{where}.mounts[{n}]"
            if self.keys(mount, _MOUNT_KEYS, ("hostPath", "containerPath"), here):
                self.absolute(mount.get("containerPath"), f"{here}.containerPath")
                if "options" in mount:
                    self.strings(mount["options"], f"{here}.options")
        for n, hook in enumerate(edits.get("hooks") or []):
            here = f"{where}.hooks[{n}]"
            if self.keys(hook, _HOOK_KEYS, ("hookName", "path"), here):
                if hook.get("hookName") not in HOOK_NAMES:
                    self.say(here, f"hookName {hook.get('hookName')!r} is not one of {HOOK_NAMES}")
                self.absolute(hook.get("path"), f"{here}.path")
                for key in ("args", "env"):
                    if key in hook:
                        self.strings(hook[key], f"{here}.{key}")

    def node(self, node: Any, where: str) -> None:
        if not self.keys(node, _NODE_KEYS, ("path",), where):
            return
        self.absolute(node.get("path"), f"{where}.path")
        if "hostPath" in node:
            self.absolute(node["hostPath"], f"{where}.hostPath")
        for key in ("major", "minor", "fileMode", "uid", "gid"):
            if key in node:
                self.integer(node[key], f"{where}.{key}")
        kind = node.get("type")
        if kind is not None and kind not in NODE_TYPES:
            self.say(where, f"type {kind!r} is not one of {NODE_TYPES}")
        if kind in ("b", "c") and not ("major" in node and "minor" in node):
            self.say(where, f"a {kind!r} node needs both major and minor")
        perms = node.get("permissions")
        if perms is not None and (
            not isinstance(perms, str) or not perms or set(perms) - set("rwm")
        ):
            self.say(where, f"permissions {perms!r} are not of r, w, m")


def problems(spec: Any) -> list[str]:
    """What makes ``spec`` (a parsed spec) not a valid CDI spec; empty when it is."""
    check = _Checker()
    if not check.keys(spec, _SPEC_KEYS, ("cdiVersion", "kind", "devices"), "spec"):
        return check.problems
    version = spec.get("cdiVersion")
    if version not in VERSIONS:
        check.say(
            "cdiVersion", f"{version!r} is not a released CDI version ({', '.join(VERSIONS)})"
        )
    elif _key(version) < _key(minimum_version(spec)):
        check.say(
            "cdiVersion", f"{version} is lower than the {minimum_version(spec)} its fields need"
        )
    kind = spec.get("kind")
    problem = cdi_kind_problem(kind) if isinstance(kind, str) else "expected a string"
    if problem:
        check.say("kind", problem)
    devices = spec.get("devices")
    if not isinstance(devices, list):
        check.say("devices", "expected a list")
        devices = []
    seen: set[str] = set()
    for n, device in enumerate(devices):
        where = f"devices[{n}]"
        if not check.keys(device, _DEVICE_KEYS, ("name", "containerEdits"), where):
            continue
        name = device.get("name")
        problem = cdi_name_problem(name) if isinstance(name, str) else "expected a string"
        if problem:
            check.say(f"{where}.name", problem)
        elif name in seen:
            check.say(f"{where}.name", f"{name!r} is named twice")
        seen.add(str(name))
        edits = device.get("containerEdits")
        if isinstance(edits, Mapping) and not any(edits.get(k) for k in _EDIT_KEYS):
            check.say(f"{where}.containerEdits", "a device's edits cannot be empty")
        check.edits(edits, f"{where}.containerEdits")
    if "containerEdits" in spec:
        check.edits(spec["containerEdits"], "containerEdits")
    return check.problems
