"""The ``nvplugin`` command. Each command is a thin shell over the library; imports are lazy so
that a short command starts fast."""

from __future__ import annotations

import sys

from nvplugin.plugin.signals import PendingSignals

if sys.argv[1:2] == ["serve"] or sys.argv[0].rpartition("/")[2] == "nvidia-device-plugin":
    # ``nvplugin serve`` (and ``nvidia-device-plugin``) handles SIGTERM, SIGINT and SIGHUP from
    # here on, before click and the rest are imported (a tenth of a second, more on a loaded
    # node), in which SIGHUP's default action would kill it. ``serve`` takes the recorder over
    # (PendingSignals.current).
    PendingSignals.install()

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from nvplugin import __version__
from nvplugin.allocator import POLICY_NAMES
from nvplugin.api import DEFAULT_DEVICE_PLUGIN_DIR
from nvplugin.config.rules import MIG_STRATEGIES

F = TypeVar("F", bound=Callable[..., Any])

NVIDIA_COMMAND = "nvidia-device-plugin"
"""The name of NVIDIA's plugin command, which nvplugin's package installs too (it serves)."""


def user_errors(func: F) -> F:
    """Turn :class:`nvplugin.errors.NvpluginError` into a one-line message and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from nvplugin.errors import NvpluginError

        try:
            return func(*args, **kwargs)
        except NvpluginError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nvplugin")
def main() -> None:
    """Kubernetes device plugin for NVIDIA GPUs, with simulated nodes and a fake kubelet."""
    from nvplugin.log import configure

    # Logs go to stderr, warnings and up, unless a command sets its own (serve: its config's):
    # stdout carries the command's output alone (--output json is JSON and nothing else).
    configure(None, "warning")


# Commands. Each section below is owned by one part of the package; keep each command a thin
# shell over its library module (imports inside the function, so start-up stays fast).

# --- node: devices, topo, node import, node capture ---


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


def _node_config(
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
    from nvplugin.config.select import config_for, read_selection

    flags = {
        "config_file_srcdir": srcdir,
        "default_config": default_config,
        "fallback_strategies": fallbacks,
    }
    selection = read_selection(flags, {})
    assert selection is not None
    choice = config_for(label, selection)
    click.echo(f"config: {choice.describe()}", err=True)
    return choice.path(selection.srcdir)


def _simulate_help() -> str:
    from nvplugin.node import builtin_names

    return (
        "Simulate a node instead of asking NVML: a built-in node name "
        f"({', '.join(builtin_names())}) or a node-file path."
    )


_SIMULATE_HELP = _simulate_help()


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@plugin_config_options(
    "Also show which resource each GPU (MIG device) is served as under this config file "
    "(MIG strategy, resources by model, exclusions, time-slicing replicas)."
)
@node_config_options
@user_errors
def devices(
    simulate: str | None,
    output: str,
    config_path: str | None,
    mig_strategy: str | None,
    config_file_srcdir: str | None,
    node_label_value: str | None,
    default_config: str | None,
    fallback_strategies: str | None,
) -> None:
    """List the node's GPUs: index, UUID, model, memory, PCI bus id, NUMA node (and resource);
    MIG devices below them on a node with MIG.

    The resources are those `serve` would serve with the same config: --config, else
    CONFIG_FILE, and the environment variables `serve` reads (MIG_STRATEGY, NVPLUGIN_*, ...),
    so that a DaemonSet's env can be checked here.
    """
    import os

    from nvplugin.config import config_file, env_sets_config
    from nvplugin.node import load_topology, report

    config_path = _node_config(
        config_path, config_file_srcdir, node_label_value, default_config, fallback_strategies
    )
    topo = load_topology(simulate)
    labels = mig_labels = plan_dict = None
    env = dict(os.environ)
    path = config_file(config_path, env)
    if path is not None or mig_strategy is not None or env_sets_config(env):
        from nvplugin.config import load_config
        from nvplugin.rm.plan import plan_for

        flags = {} if mig_strategy is None else {"flags.migStrategy": mig_strategy}
        config = load_config(path, flags=flags, env=env)
        plan = plan_for(config, topo.gpus)
        for warning in plan.warnings:
            click.echo(f"warning: {warning}", err=True)
        labels, mig_labels, plan_dict = plan.labels(), plan.mig_labels(), plan.as_dict()
    if output == "json":
        click.echo(report.devices_json(topo, labels, plan_dict, mig_labels), nl=False)
    else:
        click.echo(report.devices_table(topo, labels, mig_labels), nl=False)


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@config_file_option(
    "The plugin's config file (nvplugin serve --config-file): MIG strategy, time-slicing, "
    "resources; the labels describe what it serves."
)
@click.option(
    "--mig-strategy",
    type=click.Choice(MIG_STRATEGIES),
    help="The MIG strategy (overrides the config file's; default: the file's, else none).",
)
@click.option("--no-timestamp", is_flag=True, help="Leave out nvidia.com/gfd.timestamp.")
@click.option(
    "--machine-type-file",
    metavar="FILE",
    help="The file holding the machine type (default: the config file's, else the DMI product "
    "name, /sys/class/dmi/id/product_name; under --simulate, /sys is the simulated node's).",
)
@user_errors
def labels(
    simulate: str | None,
    config_path: str | None,
    mig_strategy: str | None,
    no_timestamp: bool,
    machine_type_file: str | None,
) -> None:
    """Print the node's labels as GPU Feature Discovery writes them (key=value, NFD's feature-file
    format), for what the plugin serves under the config: nvidia.com/ labels, then nvplugin's.

    nvplugin serve keeps the same labels in NFD's features.d when flags.gfd.outputFile
    (GFD_OUTPUT_FILE) is set.
    """
    import time

    from nvplugin.config import load_config
    from nvplugin.labels import feature_text, node_facts, node_labels, other_models
    from nvplugin.node import open_node
    from nvplugin.rm.plan import plan_for

    flags: dict[str, object] = {
        "flags.migStrategy": mig_strategy,
        "flags.gfd.noTimestamp": "true" if no_timestamp else None,
        "flags.gfd.machineTypeFile": machine_type_file,
    }
    config = load_config(config_path, flags=flags)
    with open_node(simulate) as node:  # the machine-type file may be in its simulated /sys
        scan = node.scan
        facts = node_facts(
            scan.topology, scan.driver, config.gfd.machine_type_file, node.sysfs_root
        )
    plan = plan_for(config, scan.topology.gpus)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    others = other_models(scan.topology.gpus)
    if others:
        click.echo(f"warning: nvidia.com/gpu.* labels describe one model, not {others}", err=True)
    stamp = None if config.gfd.no_timestamp else int(time.time())
    click.echo(feature_text(node_labels(facts, plan, stamp)), nl=False)


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option(
    "--output",
    type=click.Choice(["matrix", "json", "mermaid"]),
    default="matrix",
    show_default=True,
)
@user_errors
def topo(simulate: str | None, output: str) -> None:
    """Show how the GPUs are wired: link matrix and pair scores, JSON, or a Mermaid graph."""
    from nvplugin.node import load_topology, report

    topology = load_topology(simulate)
    render = {
        "matrix": report.topology_matrix,
        "json": report.topology_json,
        "mermaid": report.topology_mermaid,
    }[output]
    click.echo(render(topology), nl=False)


@main.group()
def node() -> None:
    """Node files from real machines: import nvidia-smi topo -m text, or capture through NVML."""


@node.command("import")
@click.argument("topo_file", metavar="TOPO.txt")
@click.option(
    "--gpus",
    "gpus_csv",
    metavar="GPUS.csv",
    help="Models, UUIDs, memory and bus ids: the output of `nvidia-smi --query-gpu=index,name,"
    "uuid,memory.total,pci.bus_id --format=csv` (else placeholders and node-file defaults).",
)
@click.option("--name", metavar="NAME", help="The node's name (default: TOPO.txt's file name).")
@click.option("-o", "--output", metavar="FILE", help="Write the node file here, not to stdout.")
@user_errors
def node_import(topo_file: str, gpus_csv: str | None, name: str | None, output: str | None) -> None:
    """Print a node file made from the text of `nvidia-smi topo -m` in TOPO.txt (- = stdin).

    Reads the text as any driver since 2016 prints it, whole (tabs or spaces, NIC rows and
    columns, affinity columns, legends): NUMA nodes and CPUs come from the affinity columns,
    NVSwitch links are inferred where the NVLinks need them; comments in the file say what was
    guessed. On a GPU node: nvidia-smi topo -m | nvplugin node import - > my-node.yaml
    """
    from pathlib import Path

    from nvplugin.node.topoimport import import_topo

    topo = _read_input(topo_file, "topo file")
    gpus = _read_input(gpus_csv, "GPU CSV file") if gpus_csv is not None else None
    default_name = "imported" if topo_file == "-" else Path(topo_file).stem
    _write_output(import_topo(topo, name or default_name, gpus), output)


@node.command("capture")
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option("-o", "--output", metavar="FILE", help="Write the node file here, not to stdout.")
@user_errors
def node_capture(simulate: str | None, output: str | None) -> None:
    """Print this machine's exact node file, read through NVML and sysfs (on a GPU node).

    Models, UUIDs, memory, bus ids, NUMA nodes and distances, CPUs, every pair's PCIe relation
    (also under NVLink) and NVLinks, NVSwitch links. With --simulate, the node file of a
    simulated node as discovery sees it.
    """
    from nvplugin.node.capture import capture

    _write_output(capture(simulate), output)


def _read_input(path: str, what: str) -> Any:
    """A text input of a node command: a file (bounded, regular) or - for stdin."""
    from nvplugin import yamlinput
    from nvplugin.node.topoimport import Source

    if path == "-":
        data = sys.stdin.buffer.read(yamlinput.MAX_BYTES + 1)
        return Source(yamlinput.decode(data, "standard input"), "standard input")
    source = f"{what} {path}"
    return Source(yamlinput.read_text(path, source), source)


def _write_output(text: str, output: str | None) -> None:
    from nvplugin.errors import InputError

    if output is None:
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise InputError(f"-o {output}: cannot write it: {exc.strerror or exc}") from None
    click.echo(f"wrote {output}", err=True)


# --- allocator: preferred ---


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option("--size", type=int, required=True, help="How many GPUs the pod asks for.")
@click.option(
    "--available",
    metavar="IDS",
    help="Free GPUs: comma-separated UUIDs or indices (default: every GPU).",
)
@click.option(
    "--must-include",
    metavar="IDS",
    default="",
    help="GPUs the answer must contain (comma-separated UUIDs or indices).",
)
@click.option(
    "--policy",
    type=click.Choice(POLICY_NAMES),
    default=POLICY_NAMES[0],
    show_default=True,
    help="Allocation policy.",
)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--explain", is_flag=True, help="Show the chosen partition and why the group won.")
@click.option(
    "--mig-strategy",
    type=click.Choice(MIG_STRATEGIES),
    default=MIG_STRATEGIES[0],
    show_default=True,
    help="Serve MIG devices as the plugin would under this strategy (see --resource).",
)
@click.option(
    "--resource",
    metavar="NAME",
    help="A MIG resource to ask about (nvidia.com/mig-1g.5gb under mixed, nvidia.com/gpu under "
    "single); IDs are then MIG UUIDs or <gpu>:<mig index>, and --policy is the plugin's "
    "allocationPolicy for it (best-effort: the MIG policy; simple: the lowest first).",
)
@user_errors
def preferred(
    simulate: str | None,
    size: int,
    available: str | None,
    must_include: str,
    policy: str,
    output: str,
    explain: bool,
    mig_strategy: str,
    resource: str | None,
) -> None:
    """Answer GetPreferredAllocation as the plugin would: which GPUs a pod of SIZE should get.

    Impossible requests (size 0, more than available, more must-include than size) print an
    empty answer and exit 0, as the kubelet would see it.
    """
    from nvplugin.node import load_topology
    from nvplugin.rm.query import answer_preferred

    answer = answer_preferred(
        load_topology(simulate),
        mig_strategy=mig_strategy,
        resource=resource,
        policy=policy,
        available=available,
        must_include=must_include,
        size=size,
        explain=explain,
        output=output,
    )
    click.echo(answer)


# --- plugin: serve ---


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


_CONFIG_FILE_HELP = (
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


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@config_file_option(_CONFIG_FILE_HELP)
@selection_options
@setting_options()
@click.option("--discovery-retry-s", type=float, hidden=True)  # tests: shorter waits
@click.option("--socket-give-up-s", type=float, hidden=True)
@click.option("--api-backoff-s", type=(float, float), hidden=True)  # initial, maximum
@click.option("--api-watch-s", type=int, hidden=True)
@user_errors
def serve(
    simulate: str | None,
    config_path: str | None,
    discovery_retry_s: float | None,
    socket_give_up_s: float | None,
    api_backoff_s: tuple[float, float] | None,
    api_watch_s: int | None,
    **options: object,
) -> None:
    """Run the device plugin: serve the kubelet, register, follow its restarts and GPU health.

    Settings come from flags, then environment variables (NVIDIA's names for NVIDIA's settings,
    NVPLUGIN_* for nvplugin's), then the config file, then defaults. SIGTERM/SIGINT stop it
    (exit 0); SIGHUP reloads the config. With --config-file-srcdir it runs the config its node's
    label names and follows the label and the directory. Without a kubelet
    (--simulate on a laptop), run `nvplugin kubelet --device-plugin-dir DIR` beside it.
    """
    _serve(
        simulate,
        config_path,
        discovery_retry_s,
        socket_give_up_s,
        options,
        api_backoff_s=api_backoff_s,
        api_watch_s=api_watch_s,
    )


def _serve(
    simulate: str | None,
    config_path: str | None,
    discovery_retry_s: float | None,
    socket_give_up_s: float | None,
    options: dict[str, object],
    *,
    api_backoff_s: tuple[float, float] | None = None,
    api_watch_s: int | None = None,
) -> None:
    """``serve``'s work, shared with ``nvidia-device-plugin``."""
    # First, before any import or file read (and usually since this module's first lines): a
    # signal is never fatal (SIGHUP before serving reloads once serving; SIGTERM/SIGINT before
    # serving stop cleanly).
    pending = PendingSignals.current()

    import os

    from nvplugin.config import SETTINGS, config_file, load_config
    from nvplugin.config.select import first_choice, read_selection
    from nvplugin.errors import InputError

    env = dict(os.environ)
    paths = list(SETTINGS)
    chosen = {k[len("select_") :]: v for k, v in options.items() if k.startswith("select_")}
    flags = {
        paths[int(name.split("_")[1])]: value
        for name, value in options.items()
        if name.startswith("setting_")
    }
    path = config_file(config_path, env)

    def load_file(file: str | None) -> Any:
        return load_config(file, flags=flags, env=env)

    selection = read_selection(chosen, env)
    following = None
    if selection is None:
        config = load_file(path)  # a bad config exits 2 before gRPC is even imported
    else:
        if path is not None:
            raise InputError(
                f"--config-file (CONFIG_FILE) {path} and --config-file-srcdir "
                f"(CONFIG_FILE_SRCDIR) {selection.srcdir}: give one; the directory's configs are "
                "chosen per node by its label"
            )
        from nvplugin.plugin.selection import Following

        start = first_choice(selection, load_file)
        following = Following(selection, start, load_file)
        config = start.config
    from nvplugin.config.pod import read_pod
    from nvplugin.plugin.daemon import run_daemon
    from nvplugin.plugin.selection import ApiTiming

    timing: dict[str, Any] = {"discovery_retry_s": discovery_retry_s}
    timing["serve_give_up_s"] = socket_give_up_s
    if api_backoff_s is not None or api_watch_s is not None:
        backoff = api_backoff_s or (ApiTiming.backoff_initial_s, ApiTiming.backoff_max_s)
        timing["api_timing"] = ApiTiming(*backoff, watch_s=api_watch_s)
    # The daemon's own defaults apply unless a test shortens them.
    sys.exit(
        run_daemon(
            config,
            reload=lambda: load_file(path),
            simulate=simulate,
            pending=pending,
            following=following,
            pod=read_pod(chosen, env),
            **{name: value for name, value in timing.items() if value is not None},
        )
    )


class _GoFlags(click.Command):
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


@main.command(
    NVIDIA_COMMAND,
    cls=_GoFlags,
    hidden=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="nvplugin's own settings: NVPLUGIN_* variables or the config file's nvplugin: block "
    "(nvplugin serve --help lists them). --simulate NODE serves a simulated node, as "
    "nvplugin serve does.",
)
@config_file_option(
    "The path to the configuration file to use (NVIDIA's v1 format, plus nvplugin's keys). "
    "[$CONFIG_FILE]"
)
@setting_options(nvidia_only=True)
@click.option("--simulate", metavar="NODE", hidden=True)
@click.option("--discovery-retry-s", type=float, hidden=True)
@click.option("--socket-give-up-s", type=float, hidden=True)
@click.version_option(__version__, prog_name=f"{NVIDIA_COMMAND} (nvplugin)")
@user_errors
def nvidia_device_plugin(
    simulate: str | None,
    config_path: str | None,
    discovery_retry_s: float | None,
    socket_give_up_s: float | None,
    **options: object,
) -> None:
    """NVIDIA device plugin for Kubernetes -- here nvplugin, which serves exactly as
    `nvplugin serve` does.

    NVIDIA's command, flags and environment variables, with NVIDIA's meaning: a DaemonSet
    written for NVIDIA's plugin (command: [nvidia-device-plugin]) runs nvplugin's image
    unchanged. Settings come from flags, then environment variables, then the config file.
    """
    _serve(simulate, config_path, discovery_retry_s, socket_give_up_s, options)


# --- migrate ---


@main.command()
@click.option(
    "--values",
    "values_file",
    metavar="FILE",
    help="A values file of NVIDIA's chart (helm show values, or helm get values RELEASE).",
)
@click.option(
    "--daemonset",
    "daemonset_file",
    metavar="FILE",
    help="A manifest with a DaemonSet written for NVIDIA's image (static, or rendered by "
    "NVIDIA's chart).",
)
@click.option(
    "--image-repository",
    metavar="REPO",
    default="nvplugin",
    show_default=True,
    help="Where nvplugin's image is (built from its Dockerfile): what NVIDIA's image becomes.",
)
@click.option("--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@user_errors
def migrate(
    values_file: str | None, daemonset_file: str | None, image_repository: str, output: str
) -> None:
    """Print nvplugin's equivalent of NVIDIA's deployment, and every change, by key path.

    A values file becomes the values for nvplugin's chart; a DaemonSet, the same DaemonSet with
    nvplugin's image. Above the YAML, as comments: what changed, what was dropped (NVIDIA's
    defaults of what nvplugin does not do), what differs, what nvplugin refuses (left out; the
    input as it is would fail), what nvplugin does not know. Exits 2 when something is refused,
    else 0.
    """
    from nvplugin import yamlinput
    from nvplugin.errors import InputError
    from nvplugin.migrate import report
    from nvplugin.migrate.daemonset import migrate_daemonset
    from nvplugin.migrate.values import migrate_values

    if values_file is None and daemonset_file is None:
        raise InputError("migrate: give --values FILE, --daemonset FILE, or both")
    migrations = []
    if values_file is not None:
        text = yamlinput.read_text(values_file, f"values file {values_file}")
        migrations.append(migrate_values(text, values_file, image_repository))
    if daemonset_file is not None:
        text = yamlinput.read_text(daemonset_file, f"manifest {daemonset_file}")
        migrations.append(migrate_daemonset(text, daemonset_file, image_repository))
    if output == "json":
        click.echo(report.to_json(migrations), nl=False)
    else:
        click.echo(report.to_text(migrations), nl=False)
    refused = sum(len(m.refused) for m in migrations)
    if refused:
        click.echo(
            f'error: {refused} key(s) nvplugin cannot use ("refused" above): fix them before '
            "installing",
            err=True,
        )
        sys.exit(2)


# --- chart/probe: probe ---


@main.command()
@click.option(
    "--socket",
    "socket_path",
    required=True,
    metavar="PATH",
    help="The plugin socket, e.g. /var/lib/kubelet/device-plugins/nvplugin-gpu.sock.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=3.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@click.option(
    "--service",
    default="",
    metavar="NAME",
    help='Health-service name to check: "" (the plugin, default) or its resource name.',
)
@click.option(
    "--live",
    is_flag=True,
    help="Succeed on any answer, SERVING or not (liveness/startup probes).",
)
@user_errors
def probe(socket_path: str, timeout_s: float, service: str, live: bool) -> None:
    """Exit 0 if the plugin on SOCKET reports SERVING on its gRPC health service, else 1.

    SERVING means registered with the kubelet and (by default) at least one healthy GPU. With
    --live any answer in time counts. (The chart's probes ask the same over HTTP: /readyz, /livez.)
    """
    from nvplugin.plugin.probe import probe_socket

    result = probe_socket(socket_path, timeout_s, service=service, live=live)
    why = f": {result.reason}" if result.reason else ""
    click.echo(f"ok: {result.socket} answers the health check, {result.status}{why}")


# --- kubelet: admit, demo ---


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option(
    "--topology-manager-policy",
    metavar="P",
    default="none",
    show_default=True,
    help="none, best-effort, restricted or single-numa-node.",
)
@click.option(
    "--topology-manager-scope",
    metavar="S",
    default="container",
    show_default=True,
    help="container or pod.",
)
@click.option(
    "--topology-manager-policy-options",
    metavar="K=V,...",
    default="",
    help="prefer-closest-numa-nodes=true, max-allowable-numa-nodes=N.",
)
@click.option(
    "--cpu-manager-policy",
    metavar="P",
    default="none",
    show_default=True,
    help="none or static (static needs --reserved-cpus).",
)
@click.option("--reserved-cpus", metavar="LIST", help="CPUs kept for the system, e.g. 0-1.")
@click.option(
    "--max-pods",
    type=int,
    default=110,
    show_default=True,
    help="Pods the node runs at most (the kubelet's --max-pods).",
)
@click.option(
    "--system-reserved",
    metavar="R=Q,...",
    help="Resources kept for the system, e.g. cpu=1,memory=2Gi (the kubelet's flag).",
)
@click.option(
    "--kube-reserved",
    metavar="R=Q,...",
    help="Resources kept for Kubernetes' daemons, e.g. cpu=1,memory=2Gi (the kubelet's flag).",
)
@plugin_config_options(
    "The plugin's config file (nvplugin serve --config-file): resources by GPU model, "
    "time-slicing, strategies."
)
@node_config_options
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--kill-plugin-after", metavar="POD", hidden=True)
@click.argument("pods_file", metavar="PODS.yaml")
@user_errors
def admit(
    simulate: str | None,
    topology_manager_policy: str,
    topology_manager_scope: str,
    topology_manager_policy_options: str,
    cpu_manager_policy: str,
    reserved_cpus: str | None,
    max_pods: int,
    system_reserved: str | None,
    kube_reserved: str | None,
    config_path: str | None,
    mig_strategy: str | None,
    config_file_srcdir: str | None,
    node_label_value: str | None,
    default_config: str | None,
    fallback_strategies: str | None,
    output: str,
    kill_plugin_after: str | None,
    pods_file: str,
) -> None:
    """Admit the pods of PODS.yaml, in order, as a kubelet on this node would.

    Sample pod files to start from: nvplugin/kubelet/samples/ (dgx-a100.yaml, dgx-1.yaml,
    dgx-a100-mig.yaml with --mig-strategy mixed).

    Starts the real plugin (nvplugin serve) on a temporary directory and drives it with the
    fake kubelet's topology, device and CPU managers, then its resource fit (CPU, memory, pods,
    device resources against the node's allocatable). Prints, per pod, whether it is admitted
    (else the kubelet's reason and message) and which GPUs, CPUs and NUMA nodes it gets.
    Exits 0 when every pod was decided, 1 when the plugin died during the run.
    """
    from nvplugin.admit import admission, report
    from nvplugin.kubelet.topologymanager import parse_policy_options_flag
    from nvplugin.log import configure

    configure(None, "warning")
    config_path = _node_config(
        config_path, config_file_srcdir, node_label_value, default_config, fallback_strategies
    )
    settings = admission.AdmitSettings(
        simulate=simulate,
        topology_manager_policy=topology_manager_policy,
        topology_manager_scope=topology_manager_scope,
        topology_manager_policy_options=parse_policy_options_flag(topology_manager_policy_options),
        cpu_manager_policy=cpu_manager_policy,
        reserved_cpus=reserved_cpus,
        config=config_path,
        mig_strategy=mig_strategy,
        kill_plugin_after=kill_plugin_after,
        max_pods=max_pods,
        system_reserved=system_reserved,
        kube_reserved=kube_reserved,
    )
    outcome = admission.run_admit(settings, pods_file)
    for warning in outcome.warnings:
        click.echo(f"warning: {warning}", err=True)
    if output == "json":
        click.echo(report.to_json(outcome))
    else:
        click.echo(report.to_table(outcome), nl=False)
    if outcome.plugin_failure is not None:
        click.echo(f"error: {outcome.plugin_failure}", err=True)
        sys.exit(1)


@main.command()
@user_errors
def demo() -> None:
    """Show the plugin and the kubelet's topology manager at work on simulated DGX nodes.

    Runs the real plugin and the fake kubelet (single-numa-node) and admits the sample pods
    shipped with nvplugin; takes a few seconds, needs no GPU.
    """
    from nvplugin.admit.demo import run_demo
    from nvplugin.log import configure

    configure(None, "warning")
    click.echo(run_demo(), nl=False)


@main.command()
@click.option(
    "--device-plugin-dir",
    metavar="DIR",
    required=True,
    help="Serve kubelet.sock here: the --device-plugin-dir of the nvplugin serve to attach to "
    f"(serve's default is {DEFAULT_DEVICE_PLUGIN_DIR}).",
)
@user_errors
def kubelet(device_plugin_dir: str) -> None:
    """Run the fake kubelet for a `nvplugin serve` you started yourself, until Ctrl-C.

    Serves the kubelet's Registration API on DIR/kubelet.sock (deleting the sockets in DIR, as
    the kubelet does when it starts; the plugin registers again) and prints each registration
    and each change of a resource's devices, health and NUMA nodes. Refuses a DIR where a
    kubelet answers already.
    """
    from nvplugin.kubelet.standalone import run
    from nvplugin.log import configure

    configure(None, "warning")
    run(device_plugin_dir, sys.stdout)
