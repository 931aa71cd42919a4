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
    "dgx-h100, pcie-8gpu, workstation-4gpu, no-numa) or a node-file path."
)


@main.command()
@click.option("--simulate", metavar="NODE", help=_SIMULATE_HELP)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@user_errors
def devices(simulate: str | None, output: str) -> None:
    """List the node's GPUs: index, UUID, model, memory, PCI bus id, NUMA node."""
    from nvplugin.node import load_topology, report

    topo = load_topology(simulate)
    render = report.devices_json if output == "json" else report.devices_table
    click.echo(render(topo), nl=False)


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

    from nvplugin.allocator import explain_allocation, make_policy
    from nvplugin.allocator import report as allocator_report
    from nvplugin.node import load_topology

    topology = load_topology(simulate)
    make_policy(policy, topology)  # unknown policy names fail before any work
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
@click.option("--discovery-retry-s", type=float, default=30.0, hidden=True)
@user_errors
def serve(
    simulate: str | None,
    config_path: str | None,
    discovery_retry_s: float,
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

    sys.exit(
        run_daemon(load(), reload=load, simulate=simulate, discovery_retry_s=discovery_retry_s)
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
@user_errors
def probe(socket_path: str, timeout_s: float) -> None:
    """Exit 0 if the plugin on SOCKET answers GetDevicePluginOptions in time, else 1.

    The chart's liveness, readiness and startup probes run this in the plugin's container.
    """
    from nvplugin.plugin.probe import probe_socket

    result = probe_socket(socket_path, timeout_s)
    click.echo(
        f"ok: {result.socket} answers GetDevicePluginOptions "
        f"(pre_start_required={str(result.pre_start_required).lower()}, "
        f"get_preferred_allocation_available="
        f"{str(result.get_preferred_allocation_available).lower()})"
    )


# --- kubelet: admit, demo ---
