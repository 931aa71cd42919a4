"""Reading the config from its four sources: flags > environment > file > defaults.

Each source is read against :data:`~nvplugin.config.model.SETTINGS` (the one declaration of
every key), so a key cannot be accepted by one source and silently dropped by another. The file
is YAML or JSON, read through the bounded reader (:mod:`nvplugin.yamlinput`); ``version`` is
optional (v1), as in NVIDIA's plugin. Environment variables: NVIDIA's names for NVIDIA's
settings (``PASS_DEVICE_SPECS``, ``DEVICE_LIST_STRATEGY``, ...), ``NVPLUGIN_*`` for nvplugin's,
and NVIDIA's ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` for the Xid lists. An
``NVPLUGIN_*`` name that is no setting is an error (a typo), except the variables Kubernetes
injects for a Service whose name starts with ``nvplugin`` (service links), which are skipped.

Any failure -- unreadable file, bad YAML, a wrong value, a hostile one -- is an
:class:`~nvplugin.errors.InputError` naming the source and the key path: exit 2 at start, the
running config kept on reload.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from nvplugin import yamlinput
from nvplugin.config.model import SCHEMA, SETTINGS, Config, build
from nvplugin.config.schema import Invalid, Setting, unknown_key
from nvplugin.errors import InputError, describe, shortened, show
from nvplugin.node.health import DEFAULT_IGNORED_XIDS

ENV_PREFIX = "NVPLUGIN_"
CONFIG_FILE_ENV = "CONFIG_FILE"
"""NVIDIA's variable for the config file (``--config-file`` wins over it)."""
DISABLE_HEALTHCHECKS = "DP_DISABLE_HEALTHCHECKS"
ENABLE_HEALTHCHECKS = "DP_ENABLE_HEALTHCHECKS"
_SERVICE_LINK = re.compile(
    r"NVPLUGIN_(?:[A-Z0-9_]+_)?(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)"
)
"""What Kubernetes sets for a Service named ``nvplugin`` (or ``nvplugin-<x>``) in the same
namespace: ``NVPLUGIN_SERVICE_HOST``, ``NVPLUGIN_SERVICE_PORT[_<NAME>]``, ``NVPLUGIN_PORT``,
``NVPLUGIN_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]``. No setting's variable has these shapes."""


@dataclass(frozen=True)
class RefusedName:
    """A flag and environment variable of NVIDIA's plugin that nvplugin has no setting for and
    refuses by name (at NVIDIA's default, false, it is accepted: it changes nothing)."""

    flag: str
    env: str
    why: str


REFUSED_NAMES = (
    RefusedName(
        "cdi-disable-hooks",
        "CDI_DISABLE_HOOKS",
        "NVIDIA's plugin (v0.20) leaves the hooks out of the CDI specs it generates; nvplugin "
        "does not support generating CDI specs yet, so it cannot leave their hooks out: remove "
        "it, or set it to false",
    ),
)
"""NVIDIA's names nvplugin refuses rather than silently ignoring (exit 2, naming them)."""
_GO_FALSE = ("0", "f", "F", "false", "FALSE", "False")
"""What Go's strconv.ParseBool reads as false (NVIDIA's flags and variables are parsed so)."""


def refused_names(env: Mapping[str, str], flags: Mapping[str, object] | None = None) -> list[str]:
    """The problems of :data:`REFUSED_NAMES` in ``env`` and ``flags`` (flag name without
    ``--`` -> the value given; None: not given): one message each, naming the flag or
    variable."""
    problems = []
    for refused in REFUSED_NAMES:
        given = (flags or {}).get(refused.flag)
        if given is not None and str(given) not in _GO_FALSE:
            problems.append(f"flag --{refused.flag}={show(str(given))}: {refused.why}")
        value = env.get(refused.env, "")
        if value != "" and value not in _GO_FALSE:
            problems.append(f"environment variable {refused.env}={show(value)}: {refused.why}")
    return problems


def load_config(
    path: str | None,
    *,
    flags: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    text: str | None = None,
) -> Config:
    """Merge defaults, the file at ``path``, ``env`` and ``flags`` (key path -> value; a string,
    or a list of strings for a repeated flag; None or empty = not given). ``text``: the file's
    content, given (``path`` then only names it in messages: a ConfigMap entry, say). Raises
    InputError."""
    values: dict[str, object] = {path_: setting.default for path_, setting in SETTINGS.items()}
    notes: list[str] = []
    if path is not None:
        values.update(_read_file(path, notes, text))
    if env is not None:
        values.update(_read_env(env))
    if flags is not None:
        values.update(_read_flags(flags))
    try:
        return build(values, path, tuple(notes))
    except Invalid as exc:
        where = f"config file {path}" if path is not None else "config"
        raise InputError(f'{where}: key "{exc.at}": {exc.message}') from None


def given(
    key: str,
    path: str | None,
    *,
    flags: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Whether the file at ``path``, ``env`` or ``flags`` (as :func:`load_config` takes them)
    set setting ``key`` (a key path, ``flags.mpsRoot``), to whatever value. Raises InputError as
    :func:`load_config` does."""
    if flags is not None and key in _read_flags(flags):
        return True
    if env is not None and key in _read_env(env):
        return True
    return path is not None and key in _read_file(path, [])


def config_file(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The config file a command reads: ``--config-file``, else ``CONFIG_FILE`` (empty: none)."""
    return flag or env.get(CONFIG_FILE_ENV) or None


def env_sets_config(env: Mapping[str, str]) -> bool:
    """Whether ``env`` says anything about the config: a config file, or a setting's variable
    (NVIDIA's Xid variables included) that is not empty."""
    names = (CONFIG_FILE_ENV, DISABLE_HEALTHCHECKS, ENABLE_HEALTHCHECKS, *env_names())
    return any(env.get(name) for name in names)


def env_names() -> dict[str, str]:
    """Every environment variable that sets a setting -> its key path."""
    return {name: path for path, setting in SETTINGS.items() for name in setting.env}


def flag_names() -> dict[str, str]:
    """Every ``serve`` flag (without ``--``) that sets a setting -> its key path."""
    return {name: path for path, setting in SETTINGS.items() for name in setting.flags}


# --- the file ------------------------------------------------------------------------------------


def _read_file(path: str, notes: list[str], text: str | None = None) -> dict[str, object]:
    where = f"config file {path}"
    if text is None:
        text = yamlinput.read_text(path, where)
    document = yamlinput.load(text, where)
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise InputError(f"{where}: expected a mapping of keys, got {describe(document)}")
    out: dict[str, object] = {}
    seen: list[str] = []
    try:
        SCHEMA.check(document, "", out, seen)
    except Invalid as exc:
        at = f'key "{exc.at}": ' if exc.at else ""
        raise InputError(f"{where}: {at}{exc.message}") from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        # A last guard: checking is written to raise only Invalid, whatever the value.
        raise InputError(f"{where}: cannot check it: {shortened(str(exc), 200)}") from None
    notes.extend(SETTINGS[key].note for key in seen if SETTINGS[key].note)
    return out


# --- the environment -----------------------------------------------------------------------------


def _read_env(env: Mapping[str, str]) -> dict[str, object]:
    known = env_names()
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and name not in known and not _SERVICE_LINK.fullmatch(name):
            ours = [n for n in known if n.startswith(ENV_PREFIX)]
            error = unknown_key(name, ours)
            hint = error.message.split("; ", 1)[1]
            raise InputError(f"environment variable {shortened(name, 100)}: not a setting; {hint}")
    for problem in refused_names(env):
        raise InputError(problem)
    values: dict[str, object] = _health_env(env)
    for path, setting in SETTINGS.items():
        for name in setting.env:
            text = env.get(name, "")
            if text == "":
                continue  # an empty variable counts as unset (templating leaves them empty)
            try:
                values[path] = setting.check(_parse(setting, text))
            except Invalid as exc:
                raise InputError(
                    f'environment variable {name} (config key "{path}{exc.at}"): {exc.message}'
                ) from None
            break  # the first variable set wins, as in NVIDIA's plugin
    return values


def _health_env(env: Mapping[str, str]) -> dict[str, object]:
    """NVIDIA's Xid variables, with NVIDIA's documented meaning: ``DP_DISABLE_HEALTHCHECKS`` =
    ``all`` (or ``xids``) turns health checks off, else lists Xids to ignore besides the default
    ones; ``DP_ENABLE_HEALTHCHECKS`` lists Xids that count even if ignored (``all``: none
    ignored) -- and with ``DP_DISABLE_HEALTHCHECKS=all``, the only Xids that count
    (``nvplugin.health.xids.only``; NVIDIA's own code checks nothing at all then, against its
    documentation). Either variable sets the whole Xid policy, over the file's."""
    disable = _xid_items(env, DISABLE_HEALTHCHECKS)
    enable = _xid_items(env, ENABLE_HEALTHCHECKS)
    if not disable and not enable:
        return {}
    out: dict[str, object] = {
        "nvplugin.health.xids.ignore": (),
        "nvplugin.health.xids.critical": (),
        "nvplugin.health.xids.only": (),
    }
    ignore: tuple[int, ...] = ()
    if "all" in disable or "xids" in disable:
        if not enable:
            out["nvplugin.health.enabled"] = False
        elif "all" not in enable:
            out["nvplugin.health.xids.only"] = _xids(
                enable, ENABLE_HEALTHCHECKS, "nvplugin.health.xids.only"
            )
            return out
    elif disable:
        ignore = _xids(disable, DISABLE_HEALTHCHECKS, "nvplugin.health.xids.ignore")
        out["nvplugin.health.xids.ignore"] = ignore
    if "all" in enable:
        out["nvplugin.health.xids.critical"] = tuple(sorted(DEFAULT_IGNORED_XIDS | set(ignore)))
    elif enable:
        out["nvplugin.health.xids.critical"] = _xids(
            enable, ENABLE_HEALTHCHECKS, "nvplugin.health.xids.critical"
        )
    return out


def _xid_items(env: Mapping[str, str], name: str) -> list[str]:
    return [item.strip().lower() for item in env.get(name, "").split(",") if item.strip()]


def _xids(items: list[str], name: str, path: str) -> tuple[int, ...]:
    for item in items:
        if not (item.isdigit() and len(item) < 10):
            raise InputError(
                f'environment variable {name} (config key "{path}"): {show(item)} is not an '
                "Xid (a number), all or xids"
            )
    return tuple(int(item) for item in items)


# --- flags ---------------------------------------------------------------------------------------


def _read_flags(flags: Mapping[str, object]) -> dict[str, object]:
    by_path = {path: setting for path, setting in SETTINGS.items() if setting.flags}
    values: dict[str, object] = {}
    for path, value in flags.items():
        if value is None or value == ():
            continue
        setting = by_path.get(path)
        if setting is None:
            raise InputError(f"unknown flag for {path!r}")  # a programming error in the CLI
        try:
            if isinstance(value, str):
                value = _parse(setting, value)
            elif isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
                parsed = [_parse(setting, text) for text in value]
                value = [item for part in parsed for item in _as_list(part)]
            values[path] = setting.check(value)
        except Invalid as exc:
            flag = "--" + setting.flags[0]
            raise InputError(f'flag {flag} (config key "{path}{exc.at}"): {exc.message}') from None
    return values


def _parse(setting: Setting, text: str) -> object:
    return setting.kind.parse(text)


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else [value]
