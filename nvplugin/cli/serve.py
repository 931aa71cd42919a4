"""``nvplugin serve`` and NVIDIA's ``nvidia-device-plugin``: the device plugin itself."""

from __future__ import annotations

import sys
from typing import Any

import click

from nvplugin import __version__
from nvplugin.cli.flags import (
    CONFIG_FILE_HELP,
    SIMULATE_HELP,
    GoFlags,
    config_file_option,
    selection_options,
    setting_flags,
    setting_options,
)
from nvplugin.cli.group import NVIDIA_COMMAND, main, user_errors
from nvplugin.pid1 import serve_below_init
from nvplugin.plugin.signals import PendingSignals


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@config_file_option(CONFIG_FILE_HELP)
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
    serve_below_init()  # as PID 1: an init stays behind to reap and forward (nvplugin.pid1)
    pending = PendingSignals.current()

    import os

    from nvplugin.config import config_file, load_config
    from nvplugin.config.select import RECORD_NAME, first_choice, read_selection
    from nvplugin.errors import InputError

    env = dict(os.environ)
    chosen = {k[len("select_") :]: v for k, v in options.items() if k.startswith("select_")}
    flags = setting_flags(options)
    from nvplugin.config.loader import REFUSED_NAMES, refused_names

    refused = {
        REFUSED_NAMES[int(name.split("_")[1])].flag: value
        for name, value in options.items()
        if name.startswith("refused_")
    }
    for problem in refused_names({}, refused):
        raise InputError(problem)
    path = config_file(config_path, env)

    selection = read_selection(chosen, env)
    # Per-node configs are read only inside their directory (a link out of it is refused).
    within = selection.srcdir if selection is not None else None

    def load_file(file: str | None) -> Any:
        return load_config(file, flags=flags, env=env, within=within)

    scratch = None
    if simulate is not None:  # before any config is loaded for use: each one gets it
        from nvplugin.config.loader import given

        mine = given(MPS_ROOT_KEY, path if selection is None else None, flags=flags, env=env)
        scratch = None if mine else _simulated_mps_root(flags)
    try:
        following = None
        if selection is None:
            config = load_file(path)  # a bad config exits 2 before gRPC is even imported
        else:
            if path is not None:
                raise InputError(
                    f"--config-file (CONFIG_FILE) {path} and --config-file-srcdir "
                    f"(CONFIG_FILE_SRCDIR) {selection.srcdir}: give one; the directory's configs "
                    "are chosen per node by its label"
                )
            from nvplugin.plugin.selection import Following

            record = os.path.join(load_file(None).device_plugin_dir, RECORD_NAME)
            start = first_choice(selection, load_file, record)
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
        status = run_daemon(
            config,
            reload=lambda: load_file(path),
            simulate=simulate,
            pending=pending,
            following=following,
            pod=read_pod(chosen, env),
            keep_mps=False if scratch is not None else None,
            **{name: value for name, value in timing.items() if value is not None},
        )
    finally:
        if scratch is not None:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(status)


MPS_ROOT_KEY = "flags.mpsRoot"


def _simulated_mps_root(flags: dict[str, object]) -> str | None:
    """Under ``--simulate`` with no MPS root given (flag, environment, config file): a scratch
    MPS root in place of the host's default one (which a simulated node must not create or
    leave behind: ``/run/nvidia/mps``), as ``nvplugin admit`` does. Put into ``flags`` for every
    config loaded, its path returned (the caller removes it at exit, and its daemons stop with
    the plugin). None when a container mounts the host's root at NVIDIA's container root
    ``/mps`` (nvplugin's chart with ``simulate``, whose MPS clients get the host's root)."""
    import os
    import tempfile

    from nvplugin.api.nvidia import MPS_CONTAINER_ROOT

    if os.path.isdir(MPS_CONTAINER_ROOT):
        return None
    # Under /tmp, not $TMPDIR: the pipe directory's socket paths must stay short.
    scratch = tempfile.mkdtemp(dir="/tmp", prefix="nvplugin-mps-")
    flags[MPS_ROOT_KEY] = scratch
    return scratch


@main.command(
    NVIDIA_COMMAND,
    cls=GoFlags,
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
