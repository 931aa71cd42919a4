"""``nvplugin probe``: the plugin's gRPC health check, for the chart's probes."""

from __future__ import annotations

import click

from nvplugin.cli.group import main, user_errors


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
