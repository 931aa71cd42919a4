"""The options several commands share: the plugin's config file and MIG strategy, per-node
selection, one option per setting, ``--simulate``'s help, and Go-style flags for NVIDIA's
command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from nvplugin.config.rules import MIG_STRATEGIES

F = TypeVar("F", bound=Callable[..., Any])


def config_file_option(help_text: str) -> Callable[[F], F]:
    """``--config-file FILE`` (NVIDIA's name) or ``--config FILE``: the plugin's config file.
    Every command that takes the plugin's config takes both spellings."""
    return click.option("--config-file", "--config", "config_path", metavar="FILE", help=help_text)


def plugin_config_options(config_help: str) -> Callable[[F], F]:
    """``--config-file``/``--config FILE`` and ``--mig-strategy``: the plugin's config a command
    works with."""

    def add(func: F) -> F:
        func = click.option(
            "--mig-strategy",
            type=click.Choice(MIG_STRATEGIES),
            help="The plugin's MIG strategy (nvplugin serve --mig-strategy; overrides the config "
            "file's; default: the file's, else none). Under mixed, MIG devices are served as "
            "nvidia.com/mig-<profile>.",
        )(func)
        return config_file_option(config_help)(func)

    return add


def node_config_options(func: F) -> F:
    """``--config-file-srcdir DIR --node-label-value VALUE``: the config of DIR a node with that
    label gets under per-node selection (serve --config-file-srcdir), used as --config."""
    options = [
        click.option(
            "--fallback-strategies",
            metavar="LIST",
            help="With --config-file-srcdir: serve's fallback strategies (default named,single).",
        ),
        click.option(
            "--default-config",
            metavar="NAME",
            help="With --config-file-srcdir: serve's default config (DEFAULT_CONFIG).",
        ),
        click.option(
            "--node-label-value",
            metavar="VALUE",
            help="With --config-file-srcdir: the node's nvidia.com/device-plugin.config label "
            "(absent: a node without it).",
        ),
        click.option(
            "--config-file-srcdir",
            metavar="DIR",
            help="Per-node configs (one file per name, the ConfigMap): use the one a node with "
            "--node-label-value would get; says which on stderr.",
        ),
    ]
    for option in options:
        func = option(func)
    return func


def node_config(
    config_path: str | None,
    srcdir: str | None,
    label: str | None,
    default_config: str | None,
    fallbacks: str | None,
) -> str | None:
    """The config file to use: ``config_path``, or the one per-node selection in ``srcdir``
    gives a node labelled ``label`` (said on stderr)."""
    from nvplugin.errors import InputError

    given = {
        "--node-label-value": label,
        "--default-config": default_config,
        "--fallback-strategies": fallbacks,
    }
    if srcdir is None:
        for flag, value in given.items():
            if value is not None:
                raise InputError(f"{flag} needs --config-file-srcdir DIR")
        return config_path
    if config_path is not None:
        raise InputError("--config and --config-file-srcdir: give one")
    from nvplugin.config.select import predict, read_selection

    flags = {
        "config_file_srcdir": srcdir,
        "default_config": default_config,
        "fallback_strategies": fallbacks,
    }
    selection = read_selection(flags, {})
    assert selection is not None
    choice, why_none = predict(label, selection)
    click.echo(f"config: {choice.describe()}", err=True)
    if why_none is not None:
        click.echo(
            f"warning: {why_none}: serve runs no config file on such a node (the built-in "
            "defaults, with its flags and environment) and logs why",
            err=True,
        )
    return choice.path(selection.srcdir)


def _simulate_help() -> str:
    from nvplugin.nodesession import builtin_names

    return (
        "Simulate a node instead of asking NVML: a built-in node name "
        f"({', '.join(builtin_names())}) or a node-file path."
    )


SIMULATE_HELP = _simulate_help()


def setting_options(nvidia_only: bool = False) -> Callable[[F], F]:
    """One option per config setting that has flags (nvplugin/config/model.py), with NVIDIA's
    names and forms for NVIDIA's settings: ``--flag`` alone or ``--flag=true|false`` for
    booleans, list flags repeatable and comma-separated. Each lands in ``setting_<n>``, n the
    setting's number. ``nvidia_only``: NVIDIA's settings only (``nvidia-device-plugin``), their
    help in NVIDIA's style (``[$MIG_STRATEGY]``)."""

    def add(func: F) -> F:
        from nvplugin.config import SETTINGS
        from nvplugin.config.schema import Bool, List, Nullable

        for number, (path, setting) in reversed(list(enumerate(SETTINGS.items()))):
            if not setting.flags or (nvidia_only and path.startswith("nvplugin.")):
                continue
            kind = setting.kind.inner if isinstance(setting.kind, Nullable) else setting.kind
            extra: dict[str, Any] = {}
            if isinstance(kind, Bool):
                extra = {"is_flag": False, "flag_value": "true", "metavar": "true|false"}
            elif isinstance(kind, List):
                extra = {"multiple": True, "metavar": "V[,V]"}
            default = _default_text(setting)
            if nvidia_only:
                names = " ".join(f"[${name}]" for name in setting.env)
                text = f"{setting.help} ({path}{'; ' + default if default else ''}) {names}"
            else:
                env = ", ".join(setting.env)
                text = (
                    f"{setting.help} (config {path}; env {env}{'; ' + default if default else ''})"
                )
            func = click.option(
                *(f"--{name}" for name in setting.flags),
                f"setting_{number}",
                default=None,
                help=text,
                **extra,
            )(func)
        from nvplugin.config.loader import REFUSED_NAMES

        for number, refused in enumerate(REFUSED_NAMES):
            func = click.option(
                f"--{refused.flag}",
                f"refused_{number}",
                default=None,
                is_flag=False,
                flag_value="true",
                metavar="true|false",
                hidden=True,
                help=f"NVIDIA's; refused: {refused.why} [${refused.env}]",
            )(func)
        return func

    return add


def _default_text(setting: Any) -> str:
    """``default X`` for an option's help (empty for an empty or absent default); durations as
    the config file writes them (``0.1s``)."""
    from nvplugin.config.schema import Duration, format_duration

    default = setting.default
    if default is None or default == () or default == "":
        return ""
    if isinstance(setting.kind, Duration):
        return f"default {format_duration(float(default))}"
    if isinstance(default, bool):
        return f"default {str(default).lower()}"
    if isinstance(default, tuple):
        return f"default {','.join(str(item) for item in default)}"
    return f"default {default}"


CONFIG_FILE_HELP = (
    "Config file (YAML or JSON; NVIDIA's v1 format plus nvplugin's keys); env CONFIG_FILE."
)


def selection_options(func: F) -> F:
    """``serve``'s per-node config options: NVIDIA's config manager's flags and variables
    (nvplugin/config/select.py)."""
    helps = {
        "config_file_srcdir": "Per-node configs: the directory of configs, one file per name "
        "(the ConfigMap mounted as a volume); the node's label chooses among them, followed "
        "while serving.",
        "node_label": "The node label naming the config (default nvidia.com/device-plugin.config).",
        "default_config": "The config of a node without the label.",
        "fallback_strategies": "Without a default config: named (the config called default), "
        "single (the only one), empty (none), tried in order (default named,single).",
        "node_name": "This node's name, to read its label (the downward API's spec.nodeName).",
        "kubeconfig": "A kubeconfig file for the API (default: the in-cluster service account).",
    }
    from nvplugin.config.select import FLAGS

    for key, (flag, env) in reversed(FLAGS.items()):
        func = click.option(
            f"--{flag}", f"select_{key}", metavar="V", help=f"{helps[key]} (env {env})"
        )(func)
    return func


class GoFlags(click.Command):
    """A command that parses flags as Go does, as NVIDIA's does: ``-mig-strategy=mixed`` is
    ``--mig-strategy=mixed`` (a single-dash long name of one of its options is that option)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        names = {
            name for param in self.params if isinstance(param, click.Option) for name in param.opts
        }
        return super().parse_args(
            ctx,
            [
                "-" + arg
                if arg.startswith("-")
                and not arg.startswith("--")
                and "-" + arg.split("=")[0] in names
                else arg
                for arg in args
            ],
        )


def setting_flags(options: dict[str, Any]) -> dict[str, object]:
    """The settings given as options (:func:`setting_options`' ``setting_<n>``), by path: the
    ``flags`` of :func:`nvplugin.config.load_config`."""
    from nvplugin.config import SETTINGS

    paths = list(SETTINGS)
    return {
        paths[int(name.split("_")[1])]: value
        for name, value in options.items()
        if name.startswith("setting_")
    }
