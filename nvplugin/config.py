"""The daemon's configuration: one versioned schema, four sources, strict about every key.

Precedence is flags > environment (``NVPLUGIN_<FLAG>``) > file (``--config``, YAML,
``version: v1``) > defaults. Every key is declared once in :data:`KEYS`; the file loader, the
environment reader and the flag merger all walk that table, so a key can never be accepted by one
source and silently dropped by another (NVIDIA's plugin ignores unknown keys, and its users lost
their sharing config that way). An unknown key or a wrong type is an :class:`InputError` naming
the source, the key path and the closest valid key; the CLI exits 2.

To add a key: add a :class:`Key` to :data:`KEYS` and a field to the dataclass that holds it.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from nvplugin.allocator import DEFAULT_BUDGET_S, POLICY_NAMES
from nvplugin.errors import InputError, describe
from nvplugin.node.health import DEFAULT_IGNORED_XIDS, HealthSettings
from nvplugin.plugin.metrics import address_problem
from nvplugin.plugin.resources import (
    DEFAULT_RESOURCE_NAME,
    Exclude,
    ResourceRules,
    parse_gpu_patterns,
    resolve_layout,
    resource_name_error,
)
from nvplugin.plugin.responses import (
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEFAULT_DEV_ROOT,
    DEFAULT_DEVICE_LIST_STRATEGY,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    cdi_annotation_prefix_problem,
)
from nvplugin.plugin.sharing import (
    ALLOCATIONS,
    TimeSlicing,
    ValueProblem,
    parse_replicated_resources,
)

CONFIG_VERSION = "v1"
ENV_PREFIX = "NVPLUGIN_"
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET_NAME = "kubelet.sock"
LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


class _Invalid(Exception):
    """A value's problem, before the caller adds where the value came from. ``subpath`` is where
    inside a structured value (``[1].replicas``); it is appended to the key path in messages."""

    def __init__(self, message: str, subpath: str = "") -> None:
        super().__init__(message)
        self.subpath = subpath


# --- value kinds: each checks a YAML value and parses an environment string ---------------------


@dataclass(frozen=True)
class Kind:
    """How a key's values look: ``check`` validates a YAML/flag value, ``parse`` an env string."""

    name: str
    check: Callable[[object], object]
    parse: Callable[[str], object]


def _check_str(value: object) -> object:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {describe(value)}")
    return value


def _check_bool(value: object) -> object:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {describe(value)}")
    return value


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _parse_bool(text: str) -> object:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _Invalid(f"expected true or false, got {text!r}")


def _check_number(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"expected a number, got {describe(value)}")
    if not math.isfinite(value):
        raise _Invalid(f"expected a finite number, got {value!r}")
    return float(value)


def _parse_number(text: str) -> object:
    try:
        return _check_number(float(text))
    except ValueError:
        raise _Invalid(f"expected a number, got {text!r}") from None


def _check_int_list(value: object) -> object:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list of integers, got {describe(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise _Invalid(f"expected a list of integers, got item {describe(item)}")
    return tuple(value)


def _parse_int_list(text: str) -> object:
    items = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return _check_int_list([int(item) for item in items])
    except ValueError:
        raise _Invalid(f"expected comma-separated integers, got {text!r}") from None


STRING = Kind("string", _check_str, lambda text: text)
BOOL = Kind("boolean", _check_bool, _parse_bool)
NUMBER = Kind("number", _check_number, _parse_number)
INT_LIST = Kind("list of integers", _check_int_list, _parse_int_list)


def _check_str_list(value: object) -> object:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list of strings, got {describe(value)}")
    for number, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise _Invalid(f"expected a non-empty string, got {describe(item)}", f"[{number}]")
    return tuple(value)


def _check_strategies(value: object) -> object:
    """A device-list strategy, a comma-separated string of them (as NVIDIA's flag takes), or a
    list; each known, none twice, at least one."""
    if isinstance(value, str):
        items: list[object] = [part.strip() for part in value.split(",")]
    elif isinstance(value, list):
        items = list(value)
    else:
        raise _Invalid(f"expected a string or a list of strings, got {describe(value)}")
    if not items or items == [""]:
        raise _Invalid(f"expected at least one of {', '.join(DEVICE_LIST_STRATEGIES)}")
    for item in items:
        if item not in DEVICE_LIST_STRATEGIES:
            raise _Invalid(
                f"{describe(item)} is not a device-list strategy; "
                f"have: {', '.join(DEVICE_LIST_STRATEGIES)}"
            )
        if items.count(item) > 1:
            raise _Invalid(f"{item!r} is listed twice")
    return tuple(str(item) for item in items)


def _no_env(text: str) -> object:
    raise _Invalid("can only be set in the config file")


def _structured(parse: Callable[[object], object]) -> Callable[[object], object]:
    """A check made of a parser that raises ValueProblem (its ``at`` becomes the subpath)."""

    def check(value: object) -> object:
        try:
            return parse(value)
        except ValueProblem as exc:
            raise _Invalid(exc.message, exc.at) from None

    return check


STR_LIST = Kind("list of strings", _check_str_list, _no_env)
STRATEGIES = Kind("string or list of strings", _check_strategies, lambda text: text)
REPLICATED = Kind(
    "list of {name, replicas, rename}", _structured(parse_replicated_resources), _no_env
)
GPU_PATTERNS = Kind("list of {pattern, name}", _structured(parse_gpu_patterns), _no_env)


# --- the schema ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One configuration key: its dotted path in the file, kind, default and extra rule.

    ``flag`` keys can also be set by the ``--<flag>`` option and the ``NVPLUGIN_<FLAG>``
    environment variable (the flag name is the path with ``.`` -> ``_``).
    """

    path: str
    kind: Kind
    default: object
    nullable: bool = False
    flag: bool = False
    choices: tuple[str, ...] = ()
    rule: Callable[[object], str | None] | None = None

    @property
    def flag_name(self) -> str:
        return self.path.replace(".", "_")

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.flag_name.upper()

    def check(self, value: object) -> object:
        """The value in its stored form, or :class:`_Invalid` saying what is wrong."""
        if value is None:
            if self.nullable:
                return None
            raise _Invalid(f"expected a {self.kind.name}, got null")
        checked = self.kind.check(value)
        if self.choices and checked not in self.choices:
            raise _Invalid(f"{checked!r} is not one of {', '.join(self.choices)}")
        if self.rule is not None:
            problem = self.rule(checked)
            if problem:
                raise _Invalid(problem)
        return checked


def _resource_rule(value: object) -> str | None:
    return resource_name_error(str(value))


def _non_negative(value: object) -> str | None:
    return None if isinstance(value, float) and value >= 0 else f"{value!r} is negative"


def _positive(value: object) -> str | None:
    return None if isinstance(value, float) and value > 0 else f"{value!r} is not positive"


def _address_rule(value: object) -> str | None:
    return address_problem(str(value))


def _absolute_rule(value: object) -> str | None:
    # DeviceSpecs' host paths are <dev_root>/dev/<name>: the kubelet needs them absolute.
    return None if str(value).startswith("/") else f"{value!r} is not an absolute path"


def _cdi_prefix_rule(value: object) -> str | None:
    return cdi_annotation_prefix_problem(str(value))


def _xid_rule(value: object) -> str | None:
    for xid in value if isinstance(value, tuple) else ():
        if xid < 0:
            return f"Xid {xid} is negative"
    return None


KEYS: tuple[Key, ...] = (
    Key("resource_name", STRING, DEFAULT_RESOURCE_NAME, flag=True, rule=_resource_rule),
    Key("allocation_policy", STRING, "best-effort", flag=True, choices=POLICY_NAMES),
    Key("allocation_budget_s", NUMBER, DEFAULT_BUDGET_S, flag=True, rule=_positive),
    Key("device_plugin_dir", STRING, DEFAULT_DEVICE_PLUGIN_DIR, flag=True),
    Key("kubelet_socket", STRING, None, nullable=True, flag=True),
    Key("fail_on_init_error", BOOL, True, flag=True),
    Key("pre_start_required", BOOL, False, flag=True),
    Key("log.format", STRING, None, nullable=True, flag=True, choices=LOG_FORMATS),
    Key("log.level", STRING, "info", flag=True, choices=LOG_LEVELS),
    Key("health.enabled", BOOL, True),
    Key("health.xids.ignore", INT_LIST, (), rule=_xid_rule),
    Key("health.xids.critical", INT_LIST, (), rule=_xid_rule),
    Key("health.recovery.quiet_s", NUMBER, 0.0, rule=_non_negative),
    # What containers receive (plugin/responses.py): NVIDIA's flag names, snake_case here.
    Key("device_list_strategy", STRATEGIES, DEFAULT_DEVICE_LIST_STRATEGY, flag=True),
    Key("device_id_strategy", STRING, "uuid", flag=True, choices=DEVICE_ID_STRATEGIES),
    Key("pass_device_specs", BOOL, False, flag=True),
    Key("dev_root", STRING, DEFAULT_DEV_ROOT, flag=True, rule=_absolute_rule),
    Key(
        "cdi_annotation_prefix",
        STRING,
        DEFAULT_CDI_ANNOTATION_PREFIX,
        flag=True,
        rule=_cdi_prefix_rule,
    ),
    # Time-slicing (plugin/sharing.py): NVIDIA's block, camelCase kept so configs port verbatim.
    Key("sharing.timeSlicing.renameByDefault", BOOL, False),
    Key("sharing.timeSlicing.failRequestsGreaterThanOne", BOOL, False),
    Key("sharing.timeSlicing.allocation", STRING, ALLOCATIONS[0], choices=ALLOCATIONS),
    Key("sharing.timeSlicing.resources", REPLICATED, ()),
    # Resources by GPU model, and GPUs hidden from every resource (plugin/resources.py).
    Key("resources.gpus", GPU_PATTERNS, ()),
    Key("resources.exclude.uuids", STR_LIST, ()),
    Key("resources.exclude.models", STR_LIST, ()),
    Key("health_service.not_serving_without_healthy_gpus", BOOL, True),
    Key("metrics_address", STRING, None, nullable=True, flag=True, rule=_address_rule),
)
_BY_PATH = {key.path: key for key in KEYS}
_BY_FLAG = {key.flag_name: key for key in KEYS if key.flag}
_BY_ENV = {key.env_name: key for key in KEYS if key.flag}


# --- the value -----------------------------------------------------------------------------------


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
    """The gRPC health service's settings (``health_service:``; the service takes this object):
    NOT_SERVING while unregistered, and, with ``not_serving_without_healthy_gpus``, while no GPU
    is Healthy."""

    not_serving_without_healthy_gpus: bool = True


@dataclass(frozen=True)
class Config:
    """The effective configuration. ``source`` names the file it was read from (None: none)."""

    resource_name: str
    allocation_policy: str
    device_plugin_dir: str
    kubelet_socket: str | None
    fail_on_init_error: bool
    pre_start_required: bool
    log: LogConfig
    health: HealthConfig
    health_service: HealthServiceConfig = HealthServiceConfig()
    metrics_address: str | None = None  # host:port of /metrics; None = no metrics endpoint
    allocation_budget_s: float = DEFAULT_BUDGET_S  # a best-effort search's time per request
    device_list_strategy: tuple[str, ...] = DEFAULT_DEVICE_LIST_STRATEGY
    device_id_strategy: str = DEVICE_ID_STRATEGIES[0]
    pass_device_specs: bool = False
    dev_root: str = DEFAULT_DEV_ROOT
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)  # names resolved
    resources: ResourceRules = field(default_factory=ResourceRules)  # names resolved
    source: str | None = None

    @property
    def kubelet_socket_path(self) -> str:
        """Where the kubelet serves Registration: the configured path or ``<dir>/kubelet.sock``."""
        if self.kubelet_socket is not None:
            return self.kubelet_socket
        return os.path.join(self.device_plugin_dir, KUBELET_SOCKET_NAME)

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration in the file's shape (for the start-up log line)."""
        return {
            "version": CONFIG_VERSION,
            "source": self.source,
            "resource_name": self.resource_name,
            "allocation_policy": self.allocation_policy,
            "allocation_budget_s": self.allocation_budget_s,
            "device_plugin_dir": self.device_plugin_dir,
            "kubelet_socket": self.kubelet_socket_path,
            "fail_on_init_error": self.fail_on_init_error,
            "pre_start_required": self.pre_start_required,
            "log": {"format": self.log.format, "level": self.log.level},
            "health": {
                "enabled": self.health.enabled,
                "xids": {
                    "ignore": list(self.health.ignore_xids),
                    "critical": list(self.health.critical_xids),
                    "ignored_effective": sorted(self.health.ignored_xids),
                },
                "recovery": {"quiet_s": self.health.recovery_quiet_s},
            },
            "device_list_strategy": list(self.device_list_strategy),
            "device_id_strategy": self.device_id_strategy,
            "pass_device_specs": self.pass_device_specs,
            "dev_root": self.dev_root,
            "cdi_annotation_prefix": self.cdi_annotation_prefix,
            "sharing": {"timeSlicing": self.time_slicing.as_dict()},
            "resources": self.resources.as_dict(),
            "health_service": {
                "not_serving_without_healthy_gpus": (
                    self.health_service.not_serving_without_healthy_gpus
                ),
            },
            "metrics_address": self.metrics_address,
        }


# --- loading -------------------------------------------------------------------------------------


def load_config(
    path: str | None,
    *,
    flags: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Merge defaults, the file at ``path``, ``env`` (only ``NVPLUGIN_*`` names are read) and
    ``flags`` (flag name -> value; None = not given). Raises :class:`InputError`."""
    values: dict[str, object] = {key.path: key.default for key in KEYS}
    if path is not None:
        values.update(_read_file(path))
    if env is not None:
        values.update(_read_env(env))
    if flags is not None:
        values.update(_read_flags(flags))
    return _build(values, path)


def _read_file(path: str) -> dict[str, object]:
    where = f"config file {path}"
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{where}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot read it: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{where}: not valid YAML{at}: {problem}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise InputError(f"{where}: expected a mapping of keys, got {describe(document)}")
    version = document.get("version")
    if "version" not in document:
        raise InputError(f'{where}: key "version" is missing; set it to {CONFIG_VERSION}')
    if version != CONFIG_VERSION:
        raise InputError(
            f'{where}: key "version": {describe(version)} is not supported; '
            f"the supported version is {CONFIG_VERSION}"
        )
    values: dict[str, object] = {}
    _walk(where, {k: v for k, v in document.items() if k != "version"}, "", values)
    return values


def _children(prefix: str) -> list[str]:
    """The valid key names directly under ``prefix`` ("" = top level), in schema order."""
    names: list[str] = [] if prefix else ["version"]
    for key in KEYS:
        if prefix and not key.path.startswith(prefix + "."):
            continue
        rest = key.path[len(prefix) + 1 :] if prefix else key.path
        head = rest.split(".", 1)[0]
        if head not in names:
            names.append(head)
    return names


def _walk(where: str, mapping: dict[Any, Any], prefix: str, out: dict[str, object]) -> None:
    valid = _children(prefix)
    for name, value in mapping.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        if not isinstance(name, str) or name not in valid:
            close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.6)
            hint = (
                f'did you mean "{_join(prefix, close[0])}"?'
                if close
                else f"valid keys here: {', '.join(valid)}"
            )
            raise InputError(f'{where}: unknown key "{path}"; {hint}')
        key = _BY_PATH.get(path)
        if key is None:  # a section
            if not isinstance(value, dict):
                raise InputError(
                    f'{where}: key "{path}": expected a mapping, got {describe(value)}'
                )
            _walk(where, value, path, out)
            continue
        try:
            out[path] = key.check(value)
        except _Invalid as exc:
            raise InputError(f'{where}: key "{path}{exc.subpath}": {exc}') from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _read_env(env: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        key = _BY_ENV.get(name)
        if key is None:
            close = difflib.get_close_matches(name, list(_BY_ENV), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"valid: {', '.join(_BY_ENV)}"
            raise InputError(f"environment variable {name}: not a setting; {hint}")
        text = env[name]
        if text == "":
            continue  # an empty variable counts as unset (templating leaves them empty)
        try:
            parsed = key.kind.parse(text)
            values[key.path] = key.check(parsed)
        except _Invalid as exc:
            raise InputError(
                f'environment variable {name} (config key "{key.path}"): {exc}'
            ) from None
    return values


def _read_flags(flags: Mapping[str, object]) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, value in flags.items():
        if value is None:
            continue
        key = _BY_FLAG.get(name)
        if key is None:
            raise InputError(f"unknown flag {name!r}")  # a programming error in the CLI
        try:
            values[key.path] = key.check(value)
        except _Invalid as exc:
            flag = "--" + name.replace("_", "-")
            raise InputError(f'flag {flag} (config key "{key.path}"): {exc}') from None
    return values


def _build(values: Mapping[str, object], source: str | None) -> Config:
    def get(path: str) -> Any:
        return values[path]

    try:  # rules across keys: resulting resource names, renames, collisions
        resources, time_slicing = resolve_layout(
            get("resource_name"),
            ResourceRules(
                get("resources.gpus"),
                Exclude(get("resources.exclude.uuids"), get("resources.exclude.models")),
            ),
            TimeSlicing(
                rename_by_default=get("sharing.timeSlicing.renameByDefault"),
                fail_requests_greater_than_one=get(
                    "sharing.timeSlicing.failRequestsGreaterThanOne"
                ),
                allocation=get("sharing.timeSlicing.allocation"),
                resources=get("sharing.timeSlicing.resources"),
            ),
        )
    except ValueProblem as exc:
        where = f"config file {source}" if source is not None else "config"
        raise InputError(f'{where}: key "{exc.at}": {exc.message}') from None
    return Config(
        resource_name=get("resource_name"),
        allocation_policy=get("allocation_policy"),
        allocation_budget_s=get("allocation_budget_s"),
        device_plugin_dir=get("device_plugin_dir"),
        kubelet_socket=get("kubelet_socket"),
        fail_on_init_error=get("fail_on_init_error"),
        pre_start_required=get("pre_start_required"),
        log=LogConfig(format=get("log.format"), level=get("log.level")),
        health=HealthConfig(
            enabled=get("health.enabled"),
            ignore_xids=get("health.xids.ignore"),
            critical_xids=get("health.xids.critical"),
            recovery_quiet_s=get("health.recovery.quiet_s"),
        ),
        health_service=HealthServiceConfig(
            not_serving_without_healthy_gpus=get("health_service.not_serving_without_healthy_gpus")
        ),
        metrics_address=get("metrics_address"),
        device_list_strategy=get("device_list_strategy"),
        device_id_strategy=get("device_id_strategy"),
        pass_device_specs=get("pass_device_specs"),
        dev_root=get("dev_root"),
        cdi_annotation_prefix=get("cdi_annotation_prefix"),
        time_slicing=time_slicing,
        resources=resources,
        source=source,
    )
