"""The kubelet side: ``admit``, ``demo`` and ``kubelet`` (the fake kubelet standalone)."""

from __future__ import annotations

import sys

import click

from nvplugin.api import DEFAULT_DEVICE_PLUGIN_DIR
from nvplugin.cli.flags import (
    SIMULATE_HELP,
    node_config,
    node_config_options,
    plugin_config_options,
)
from nvplugin.cli.group import main, user_errors


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
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

    Sample pod files to start from: nvplugin/fakekubelet/samples/ (dgx-a100.yaml, dgx-1.yaml,
    dgx-a100-mig.yaml with --mig-strategy mixed).

    Starts the real plugin (nvplugin serve) on a temporary directory and drives it with the
    fake kubelet's topology, device and CPU managers, then its resource fit (CPU, memory, pods,
    device resources against the node's allocatable). Prints, per pod, whether it is admitted
    (else the kubelet's reason and message) and which GPUs, CPUs and NUMA nodes it gets.
    Exits 0 when every pod was decided, 1 when the plugin died during the run.
    """
    from nvplugin.admit import admission, verdicts
    from nvplugin.fakekubelet.topologymanager import parse_policy_options_flag
    from nvplugin.log import configure

    configure(None, "warning")
    config_path = node_config(
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
        click.echo(verdicts.to_json(outcome))
    else:
        click.echo(verdicts.to_table(outcome), nl=False)
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
    from nvplugin.fakekubelet.standalone import run
    from nvplugin.log import configure

    configure(None, "warning")
    run(device_plugin_dir, sys.stdout)
