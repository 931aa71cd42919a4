"""``nvplugin topology``: the NodeResourceTopology object a node would publish, for offline
checks (docs/topology.md)."""

from __future__ import annotations

import click

from nvplugin.cli.flags import SIMULATE_HELP, plugin_config_options
from nvplugin.cli.group import main, user_errors


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@plugin_config_options(
    "The plugin's config file (nvplugin serve --config-file): what is served, and the kubelet's "
    "policies the object says (nvplugin.topology)."
)
@click.option(
    "--node-name",
    metavar="NAME",
    help="The object's name (NODE_NAME; default: the node's name).",
)
@click.option("--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@user_errors
def topology(
    simulate: str | None,
    config_path: str | None,
    mig_strategy: str | None,
    node_name: str | None,
    output: str,
) -> None:
    """Print the NodeResourceTopology object nvplugin serve --publish-topology would publish for
    this node with no pod on it (every served device healthy; under the static CPU policy every
    CPU, the kubelet's reserved ones included; no owner)."""
    import json

    import yaml

    from nvplugin.config import load_config
    from nvplugin.nodesession import load_topology
    from nvplugin.nrt.bestgroups import BestGroups
    from nvplugin.nrt.kubeletconfig import merged, read_policies
    from nvplugin.nrt.objects import build_nrt, idle_answers
    from nvplugin.rm.plan import plan_for

    flags = {} if mig_strategy is None else {"flags.migStrategy": mig_strategy}
    config = load_config(config_path, flags=flags)
    topo = load_topology(simulate)
    plan = plan_for(config, topo.gpus)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    settings = config.topology
    from_file = read_policies(settings.kubelet_config) if settings.kubelet_config else None
    policies = merged(from_file, settings)
    listed, allocatable = idle_answers(topo, plan, policies.cpu_manager_policy)
    obj = build_nrt(
        node_name or topo.name, topo, plan, listed, allocatable, policies, BestGroups(topo)
    )
    if output == "json":
        click.echo(json.dumps(obj, indent=2))
    else:
        click.echo(yaml.safe_dump(obj, sort_keys=False), nl=False)
