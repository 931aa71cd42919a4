"""``nvplugin cdi generate`` and ``nvplugin cdi check``: the CDI spec a node gets, and whether
every name the plugin would hand out resolves in the specs the node has."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from nvplugin.cli.flags import SIMULATE_HELP, config_file_option, setting_flags, setting_options
from nvplugin.cli.group import main, user_errors

if TYPE_CHECKING:
    from nvplugin.config import Config


@main.group()
def cdi() -> None:
    """The CDI spec nvplugin writes for the cdi-annotations and cdi-cri strategies."""


def _config(config_path: str | None, options: dict[str, object]) -> Config:
    import os

    from nvplugin.config import config_file, load_config

    env = dict(os.environ)
    return load_config(config_file(config_path, env), flags=setting_flags(options), env=env)


_CONFIG_HELP = (
    "The plugin's config file (nvplugin serve --config-file): which devices are served and how "
    "they are named (MIG strategy, deviceIDStrategy, resources), the driver roots, the kind."
)


@cdi.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@config_file_option(_CONFIG_HELP)
@click.option(
    "--output",
    metavar="FILE|-",
    default="-",
    show_default=True,
    help="Where to write the spec (atomically); - for stdout.",
)
@setting_options()
@user_errors
def generate(simulate: str | None, config_path: str | None, output: str, **options: Any) -> None:
    """Print or write the CDI spec `serve` writes for this node under its config: one device per
    name Allocate can return, plus `all`. The driver root is read where the plugin's container
    sees it (--container-driver-root; on a host, give /). Exit 1, naming what is missing, when
    the spec cannot be whole (with --fail-on-init-error=false: said on stderr, written anyway).
    """
    from nvplugin.cdi.generate import generate as make
    from nvplugin.cdi.generate import incomplete
    from nvplugin.cdi.writer import spec_file_name, spec_text, write_file
    from nvplugin.nodesession import open_node
    from nvplugin.rm.plan import plan_for

    config = _config(config_path, options)
    with open_node(simulate, driver_root=config.container_driver_root) as node:
        plan = plan_for(config, node.topology.gpus)
        made = make(config, plan, node.topology, node.scan.driver.version, node.driver_root)
    target = spec_file_name(config.cdi_kind) if output == "-" else output
    if made.missing:
        error = incomplete(target, made.missing)
        if config.fail_on_init_error:
            raise error
        click.echo(f"warning: {error}", err=True)
    if output == "-":
        sys.stdout.write(spec_text(made.spec))
    else:
        write_file(output, spec_text(made.spec))
        click.echo(f"wrote {output}: {len(made.spec['devices'])} devices", err=True)


@cdi.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@config_file_option(_CONFIG_HELP)
@click.option(
    "--spec-dir",
    "spec_dirs",
    metavar="DIR",
    multiple=True,
    help="A CDI spec directory, lowest priority first (repeatable; default /etc/cdi and "
    "/var/run/cdi, the runtimes' defaults).",
)
@setting_options()
@user_errors
def check(
    simulate: str | None, config_path: str | None, spec_dirs: tuple[str, ...], **options: Any
) -> None:
    """Say whether every CDI name the plugin would return under its config resolves in the
    specs of the spec directories -- nvplugin's own spec, or the container toolkit's
    nvidia.com/gpu spec when nvplugin.cdi.kind points there: one line per name, then what to
    change for each that does not. Exit 1 when a name does not resolve."""
    from nvplugin.cdi import registry as specs
    from nvplugin.cdi.check import advice, check_names
    from nvplugin.cdi.generate import qualified_names
    from nvplugin.errors import NvpluginError
    from nvplugin.nodesession import load_topology
    from nvplugin.rm.plan import plan_for

    config = _config(config_path, options)
    dirs = spec_dirs or specs.DEFAULT_SPEC_DIRS
    plan = plan_for(config, load_topology(simulate).gpus)
    names = qualified_names(config, plan)
    registry = specs.load(dirs)
    for error in registry.errors:
        click.echo(f"warning: {error}", err=True)
    findings = check_names(names, registry)
    for finding in findings:
        if finding.entry is not None:
            nodes = ",".join(finding.entry.nodes)
            click.echo(f"ok {finding.name} {finding.entry.path} {nodes}")
        else:
            click.echo(f"unresolved {finding.name}: {finding.reason}")
    bad = [f for f in findings if f.entry is None]
    for line in advice(config.cdi_kind, config.device_id_strategy, findings, registry, dirs):
        click.echo(f"fix: {line}")
    if bad:
        raise NvpluginError(
            f"{len(bad)} of {len(findings)} CDI names do not resolve in {' and '.join(dirs)}"
        )
