"""The ``nvplugin`` command. Each command is a thin shell over the library; imports are lazy so
that a short command starts fast."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from nvplugin import __version__

F = TypeVar("F", bound=Callable[..., Any])


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


# Commands. Each section below is owned by one part of the package; keep each command a thin
# shell over its library module (imports inside the function, so start-up stays fast).

# --- node: devices, topo ---

_SIMULATE_HELP = (
    "Simulate a node instead of asking NVML: a built-in node name (dgx-1, dgx-2, dgx-a100, "
    "dgx-h100, pcie-8gpu, workstation-4gpu, no-numa, mixed-a100-t4) or a node-file path."
)


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    help="Also show which resource each GPU is served as under this config file (resources by "
    "model, exclusions, time-slicing replicas).",
)
@user_errors
def devices(simulate: str | None, output: str, config_path: str | None) -> None:
    """List the node's GPUs: index, UUID, model, memory, PCI bus id, NUMA node (and resource)."""
    from nvplugin.node import load_topology, report

    topo = load_topology(simulate)
    labels = plan_dict = None
    if config_path is not None:
        from nvplugin.config import load_config
        from nvplugin.plugin.resources import plan_resources

        config = load_config(config_path)
        plan = plan_resources(
            topo.gpus, config.resource_name, config.resources, config.time_slicing
        )
        for warning in plan.warnings:
            click.echo(f"warning: {warning}", err=True)
        labels, plan_dict = plan.labels(), plan.as_dict()
    if output == "json":
        click.echo(report.devices_json(topo, labels, plan_dict), nl=False)
    else:
        click.echo(report.devices_table(topo, labels), nl=False)


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
    default="best-effort",
    show_default=True,
    help="Allocation policy: best-effort or simple.",
)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--explain", is_flag=True, help="Show the chosen partition and why the group won.")
@user_errors
def preferred(
    simulate: str | None,
    size: int,
    available: str | None,
    must_include: str,
    policy: str,
    output: str,
    explain: bool,
) -> None:
    """Answer GetPreferredAllocation as the plugin would: which GPUs a pod of SIZE should get.

    Impossible requests (size 0, more than available, more must-include than size) print an
    empty answer and exit 0, as the kubelet would see it.
    """
    import json

    from nvplugin.allocator import check_policy_name, explain_allocation
    from nvplugin.allocator import report as allocator_report
    from nvplugin.node import load_topology

    check_policy_name(policy)  # unknown policy names fail before any work
    topology = load_topology(simulate)
    free = (
        tuple(range(len(topology)))
        if available is None
        else allocator_report.resolve_ids(topology, available, "--available")
    )
    required = allocator_report.resolve_ids(topology, must_include, "--must-include")
    allocator_report.check_must_include(free, required)
    answer = explain_allocation(policy, topology, free, required, size)
    if output == "json":
        click.echo(json.dumps(allocator_report.to_json(topology, answer, explain), indent=2))
    else:
        click.echo(allocator_report.to_text(topology, answer, size, required, explain))


# --- plugin: serve ---


@main.command()
@click.option("--simulate", metavar="NODE", help="Simulated node: built-in name or node file.")
@click.option("--config", "config_path", metavar="FILE", help="Config file (YAML, version: v1).")
@click.option("--device-plugin-dir", metavar="DIR", help="The kubelet's device-plugin directory.")
@click.option("--kubelet-socket", metavar="PATH", help="Default: <device-plugin-dir>/kubelet.sock.")
@click.option("--resource-name", metavar="NAME", help="Extended resource (nvidia.com/gpu).")
@click.option("--allocation-policy", metavar="P", help="best-effort (default) or simple.")
@click.option(
    "--allocation-budget-s",
    type=float,
    metavar="S",
    help="Time a best-effort answer may search on nodes no exact method answers quickly "
    "(default 0.1).",
)
@click.option("--log-format", metavar="F", help="json or console (default: console on a TTY).")
@click.option("--log-level", metavar="L", help="debug, info (default), warning or error.")
@click.option(
    "--fail-on-init-error/--no-fail-on-init-error",
    default=None,
    help="Exit 1 when NVML fails at start (default), or keep retrying with no devices.",
)
@click.option(
    "--pre-start-required/--no-pre-start-required",
    default=None,
    help="Ask the kubelet to call PreStartContainer.",
)
@click.option(
    "--device-list-strategy",
    metavar="S[,S]",
    help="How containers get their GPUs: envvar (default), volume-mounts, cdi-annotations, "
    "cdi-cri; several comma-separated.",
)
@click.option("--device-id-strategy", metavar="S", help="IDs given to containers: uuid or index.")
@click.option(
    "--pass-device-specs/--no-pass-device-specs",
    default=None,
    help="Add the /dev/nvidia* device nodes to Allocate responses.",
)
@click.option("--dev-root", metavar="DIR", help="Where the host's /dev/nvidia* live (default /).")
@click.option("--cdi-annotation-prefix", metavar="P", help="CDI annotation prefix (cdi.k8s.io/).")
@click.option(
    "--metrics-address",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics on http://HOST:PORT/metrics (default: off).",
)
@click.option("--discovery-retry-s", type=float, hidden=True)  # tests: shorter waits
@click.option("--socket-give-up-s", type=float, hidden=True)
@user_errors
def serve(
    simulate: str | None,
    config_path: str | None,
    discovery_retry_s: float | None,
    socket_give_up_s: float | None,
    **flags: object,
) -> None:
    """Run the device plugin: serve the kubelet, register, follow its restarts and GPU health.

    Settings come from flags, then NVPLUGIN_<FLAG> environment variables, then --config, then
    defaults. SIGTERM/SIGINT stop it (exit 0); SIGHUP reloads the config.
    """
    import os

    from nvplugin.config import load_config
    from nvplugin.plugin.daemon import run_daemon

    env = dict(os.environ)

    def load() -> Any:
        return load_config(config_path, flags=flags, env=env)

    # The daemon's own defaults apply unless a test shortens them.
    timing = {"discovery_retry_s": discovery_retry_s, "serve_give_up_s": socket_give_up_s}
    sys.exit(
        run_daemon(
            load(),
            reload=load,
            simulate=simulate,
            **{name: value for name, value in timing.items() if value is not None},
        )
    )


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
    --live any answer in time counts. The chart's probes run this in the plugin's container.
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
    "--config",
    "config_path",
    metavar="FILE",
    help="The plugin's config file (nvplugin serve --config): resources by GPU model, "
    "time-slicing, strategies.",
)
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
    config_path: str | None,
    output: str,
    kill_plugin_after: str | None,
    pods_file: str,
) -> None:
    """Admit the pods of PODS.yaml, in order, as a kubelet on this node would.

    Starts the real plugin (nvplugin serve) on a temporary directory and drives it with the
    fake kubelet's topology, device and CPU managers. Prints, per pod, whether it is admitted
    (else the kubelet's reason and message) and which GPUs, CPUs and NUMA nodes it gets.
    Exits 0 when every pod was decided, 1 when the plugin died during the run.
    """
    from nvplugin.kubelet import admit as admission
    from nvplugin.kubelet.topologymanager import parse_policy_options_flag
    from nvplugin.log import configure

    configure(None, "warning")
    settings = admission.AdmitSettings(
        simulate=simulate,
        topology_manager_policy=topology_manager_policy,
        topology_manager_scope=topology_manager_scope,
        topology_manager_policy_options=parse_policy_options_flag(topology_manager_policy_options),
        cpu_manager_policy=cpu_manager_policy,
        reserved_cpus=reserved_cpus,
        config=config_path,
        kill_plugin_after=kill_plugin_after,
    )
    report = admission.run_admit(settings, pods_file)
    if output == "json":
        click.echo(admission.to_json(report))
    else:
        click.echo(admission.to_table(report), nl=False)
    if report.plugin_failure is not None:
        click.echo(f"error: {report.plugin_failure}", err=True)
        sys.exit(1)


@main.command()
@user_errors
def demo() -> None:
    """Show the plugin and the kubelet's topology manager at work on simulated DGX nodes.

    Runs the real plugin and the fake kubelet (single-numa-node) and admits the sample pods
    shipped with nvplugin; takes a few seconds, needs no GPU.
    """
    from nvplugin.kubelet.demo import run_demo
    from nvplugin.log import configure

    configure(None, "warning")
    click.echo(run_demo(), nl=False)
