"""``nvplugin preferred``: the preferred allocation for a pod on a node."""

from __future__ import annotations

import click

from nvplugin.allocator import POLICY_NAMES
from nvplugin.cli.flags import (
    SIMULATE_HELP,
)
from nvplugin.cli.group import main, user_errors
from nvplugin.config.rules import MIG_STRATEGIES


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
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
    from nvplugin.nodesession import load_topology
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
