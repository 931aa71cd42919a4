"""``nvplugin mps stop``: MPS turned off for good on this node (an uninstall's last step)."""

from __future__ import annotations

import click

from nvplugin.cli.flags import SIMULATE_HELP, config_file_option, setting_flags, setting_options
from nvplugin.cli.group import main, user_errors


@main.group()
def mps() -> None:
    """The MPS control daemons nvplugin runs for resources shared through MPS."""


@mps.command("stop")
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@config_file_option(
    "The plugin's config file (nvplugin serve --config-file): only its flags.mpsRoot and driver "
    "root are used."
)
@setting_options()
@user_errors
def stop(simulate: str | None, config_path: str | None, **options: object) -> None:
    """Stop the MPS control daemons nvplugin left running and restore the compute modes MPS
    recorded, for every GPU of this node.

    A plugin leaves its daemons running when it exits, so that their clients keep their server
    across its restart; the next plugin adopts them, or stops those its config no longer wants.
    Run this where no plugin will come (an uninstall), with the plugin's settings (flags,
    environment, config file): it stops nvplugin's daemons on pipe directories under the MPS
    root (flags.mpsRoot) that serve this node's GPUs, and puts each GPU with a record under
    <root>/compute-modes back in the mode it had before MPS. Run it while no plugin runs: a
    running plugin would start its daemons again. Exit 1 when a mode cannot be restored (its
    record stays).
    """
    import asyncio
    import os

    from nvplugin.config import config_file, load_config
    from nvplugin.errors import NvpluginError
    from nvplugin.log import configure
    from nvplugin.nodesession import open_node
    from nvplugin.plugin.mps import end_leftovers, mps_root

    env = dict(os.environ)
    config = load_config(config_file(config_path, env), flags=setting_flags(options), env=env)
    configure(config.log.format, config.log.level)
    with open_node(simulate, driver_root=config.container_driver_root) as node:
        root = mps_root(config, node.topology.gpus, node.driver_root)
        ended = asyncio.run(end_leftovers(root, node.nvml, [], env))
    click.echo(
        f"MPS root {root.path}: {len(ended.pipe_dirs)} control daemon(s) stopped, compute mode "
        f"restored on {len(ended.restored)} GPU(s)"
    )
    if ended.not_restored:
        raise NvpluginError(
            "cannot restore the compute mode of GPU(s) "
            f"{', '.join(map(str, ended.not_restored))} (their records stay under "
            f"{root.path}/compute-modes; the log says why)"
        )
