"""The scheduler side: ``scheduler-extender`` (kube-scheduler's HTTP extender) and ``place``
("where can this pod go, and why not there")."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from nvplugin.cli.group import main, user_errors

if TYPE_CHECKING:
    from nvplugin.extender.view import View

F = TypeVar("F", bound=Callable[..., Any])

LISTEN_HELP = "Address to serve the extender on, HOST:PORT."


def _view(weight_numa: float, weight_group: float, reservation_s: float) -> View:
    from nvplugin.extender.view import View, Weights

    if weight_numa < 0 or weight_group < 0:
        from nvplugin.errors import InputError

        raise InputError("--weight-numa and --weight-group must not be negative")
    return View(weights=Weights(weight_numa, weight_group), reservation_s=reservation_s)


def _weights(func: F) -> F:
    for option in reversed(
        [
            click.option("--weight-numa", type=float, default=1.0, show_default=True,
                         help="Prioritize: weight of fewer NUMA nodes for the pod."),
            click.option("--weight-group", type=float, default=0.5, show_default=True,
                         help="Prioritize: weight of the best GPU group's score."),
        ]
    ):  # fmt: skip
        func = option(func)
    return func


@main.command("scheduler-extender")
@click.option("--listen", default="0.0.0.0:8888", show_default=True, help=LISTEN_HELP)
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Else the pod's service account.")
@click.option(
    "--reservation-s",
    type=float,
    default=120.0,
    show_default=True,
    help="How long a bound pod counts against its node at most, until the node's NRT shows it.",
)
@_weights
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
@click.option("--log-format", type=click.Choice(["json", "console"]))
@user_errors
def scheduler_extender(
    listen: str,
    kubeconfig: str | None,
    reservation_s: float,
    weight_numa: float,
    weight_group: float,
    log_level: str,
    log_format: str | None,
) -> None:
    """kube-scheduler's HTTP extender: filter (the kubelet's own topology admission on each
    node's NodeResourceTopology) and prioritize (fewer NUMA nodes, better GPU groups)."""
    import asyncio

    from nvplugin.errors import InputError
    from nvplugin.extender.service import run_extender
    from nvplugin.log import configure

    configure(log_format, log_level)
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InputError(f"--listen: {listen!r} is not HOST:PORT")
    view = _view(weight_numa, weight_group, reservation_s)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run_extender(
                view, host.strip("[]") or "0.0.0.0", int(port), kubeconfig, dict(os.environ)
            )
        )


@main.command()
@click.option("--kubeconfig", help="Read NRT objects from the API (default: KUBECONFIG).")
@click.option(
    "--nrt",
    "nrt_files",
    multiple=True,
    metavar="FILE",
    help="Offline: NRT objects from YAML/JSON files (one or many documents).",
)
@_weights
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.argument("pod_file", metavar="POD.yaml")
@user_errors
def place(
    kubeconfig: str | None,
    nrt_files: tuple[str, ...],
    weight_numa: float,
    weight_group: float,
    output: str,
    pod_file: str,
) -> None:
    """Each node's verdict, reason and score for POD.yaml: where can it go, and why not there."""
    from nvplugin.extender.place import load_nrts, read_api_nrts, render_table
    from nvplugin.fakekubelet.pods import load_pod_file
    from nvplugin.log import configure

    configure(None, "error")
    pods = load_pod_file(pod_file)
    view = _view(weight_numa, weight_group, 0.0)
    objects = load_nrts(nrt_files) if nrt_files else read_api_nrts(kubeconfig)
    for nrt in objects:
        view.set_nrt(nrt)
    rows = [(pod, view.explain(pod, view.names())) for pod in pods]
    if output == "json":
        json.dump([{"pod": pod.name, "nodes": list(r)} for pod, r in rows], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for pod, r in rows:
            click.echo(render_table(pod.name, r))
