"""Node commands: ``devices``, ``labels``, ``topo``, ``node import`` and ``node capture``."""

from __future__ import annotations

import sys
from typing import Any

import click

from nvplugin.cli.flags import (
    SIMULATE_HELP,
    config_file_option,
    node_config,
    node_config_options,
    plugin_config_options,
)
from nvplugin.cli.group import main, user_errors
from nvplugin.config.rules import MIG_STRATEGIES


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@plugin_config_options(
    "Also show which resource each GPU (MIG device) is served as under this config file "
    "(MIG strategy, resources by model, exclusions, time-slicing replicas)."
)
@node_config_options
@user_errors
def devices(
    simulate: str | None,
    output: str,
    config_path: str | None,
    mig_strategy: str | None,
    config_file_srcdir: str | None,
    node_label_value: str | None,
    default_config: str | None,
    fallback_strategies: str | None,
) -> None:
    """List the node's GPUs: index, UUID, model, memory, PCI bus id, NUMA node (and resource);
    MIG devices below them on a node with MIG.

    The resources are those `serve` would serve with the same config: --config, else
    CONFIG_FILE, and the environment variables `serve` reads (MIG_STRATEGY, NVPLUGIN_*, ...),
    so that a DaemonSet's env can be checked here.
    """
    import os

    from nvplugin.config import config_file, env_sets_config
    from nvplugin.node import views
    from nvplugin.nodesession import load_topology

    config_path = node_config(
        config_path, config_file_srcdir, node_label_value, default_config, fallback_strategies
    )
    topo = load_topology(simulate)
    labels = mig_labels = plan_dict = None
    env = dict(os.environ)
    path = config_file(config_path, env)
    per_node = config_file_srcdir is not None  # what serve serves there, config file or not
    if path is not None or mig_strategy is not None or per_node or env_sets_config(env):
        from nvplugin.config import load_config
        from nvplugin.rm.plan import plan_for

        flags = {} if mig_strategy is None else {"flags.migStrategy": mig_strategy}
        config = load_config(path, flags=flags, env=env)
        plan = plan_for(config, topo.gpus)
        for warning in plan.warnings:
            click.echo(f"warning: {warning}", err=True)
        labels, mig_labels, plan_dict = plan.labels(), plan.mig_labels(), plan.as_dict()
    if output == "json":
        click.echo(views.devices_json(topo, labels, plan_dict, mig_labels), nl=False)
    else:
        click.echo(views.devices_table(topo, labels, mig_labels), nl=False)


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@config_file_option(
    "The plugin's config file (nvplugin serve --config-file): MIG strategy, time-slicing, "
    "resources; the labels describe what it serves."
)
@click.option(
    "--mig-strategy",
    type=click.Choice(MIG_STRATEGIES),
    help="The MIG strategy (overrides the config file's; default: the file's, else none).",
)
@click.option("--no-timestamp", is_flag=True, help="Leave out nvidia.com/gfd.timestamp.")
@click.option(
    "--machine-type-file",
    metavar="FILE",
    help="The file holding the machine type (default: the config file's, else the DMI product "
    "name, /sys/class/dmi/id/product_name; under --simulate, /sys is the simulated node's).",
)
@user_errors
def labels(
    simulate: str | None,
    config_path: str | None,
    mig_strategy: str | None,
    no_timestamp: bool,
    machine_type_file: str | None,
) -> None:
    """Print the node's labels as GPU Feature Discovery writes them (key=value, NFD's feature-file
    format), for what the plugin serves under the config: nvidia.com/ labels, then nvplugin's.

    nvplugin serve keeps the same labels in NFD's features.d when flags.gfd.outputFile
    (GFD_OUTPUT_FILE) is set.
    """
    import time

    from nvplugin.config import load_config
    from nvplugin.labels import feature_text, node_facts, node_labels, other_models
    from nvplugin.nodesession import open_node
    from nvplugin.rm.plan import plan_for

    flags: dict[str, object] = {
        "flags.migStrategy": mig_strategy,
        "flags.gfd.noTimestamp": "true" if no_timestamp else None,
        "flags.gfd.machineTypeFile": machine_type_file,
    }
    config = load_config(config_path, flags=flags)
    with open_node(simulate) as node:  # the machine-type file may be in its simulated /sys
        scan = node.scan
        facts = node_facts(
            scan.topology, scan.driver, config.gfd.machine_type_file, node.sysfs_root
        )
    plan = plan_for(config, scan.topology.gpus)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    others = other_models(scan.topology.gpus)
    if others:
        click.echo(f"warning: nvidia.com/gpu.* labels describe one model, not {others}", err=True)
    stamp = None if config.gfd.no_timestamp else int(time.time())
    click.echo(feature_text(node_labels(facts, plan, stamp)), nl=False)


@main.command()
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@click.option(
    "--output",
    type=click.Choice(["matrix", "json", "mermaid"]),
    default="matrix",
    show_default=True,
)
@user_errors
def topo(simulate: str | None, output: str) -> None:
    """Show how the GPUs are wired: link matrix and pair scores, JSON, or a Mermaid graph."""
    from nvplugin.node import views
    from nvplugin.nodesession import load_topology

    topology = load_topology(simulate)
    render = {
        "matrix": views.topology_matrix,
        "json": views.topology_json,
        "mermaid": views.topology_mermaid,
    }[output]
    click.echo(render(topology), nl=False)


@main.group()
def node() -> None:
    """Node files from real machines: import nvidia-smi topo -m text, or capture through NVML."""


@node.command("import")
@click.argument("topo_file", metavar="TOPO.txt")
@click.option(
    "--gpus",
    "gpus_csv",
    metavar="GPUS.csv",
    help="Models, UUIDs, memory and bus ids: the output of `nvidia-smi --query-gpu=index,name,"
    "uuid,memory.total,pci.bus_id --format=csv` (else placeholders and node-file defaults).",
)
@click.option("--name", metavar="NAME", help="The node's name (default: TOPO.txt's file name).")
@click.option("-o", "--output", metavar="FILE", help="Write the node file here, not to stdout.")
@user_errors
def node_import(topo_file: str, gpus_csv: str | None, name: str | None, output: str | None) -> None:
    """Print a node file made from the text of `nvidia-smi topo -m` in TOPO.txt (- = stdin).

    Reads the text as any driver since 2016 prints it, whole (tabs or spaces, NIC rows and
    columns, affinity columns, legends): NUMA nodes and CPUs come from the affinity columns,
    NVSwitch links are inferred where the NVLinks need them; comments in the file say what was
    guessed. On a GPU node: nvidia-smi topo -m | nvplugin node import - > my-node.yaml
    """
    from pathlib import Path

    from nvplugin.nodefile.topoimport import import_topo

    topo = _read_input(topo_file, "topo file")
    gpus = _read_input(gpus_csv, "GPU CSV file") if gpus_csv is not None else None
    default_name = "imported" if topo_file == "-" else Path(topo_file).stem
    _write_output(import_topo(topo, name or default_name, gpus), output)


@node.command("capture")
@click.option("--simulate", metavar="NODE", help=SIMULATE_HELP)
@click.option("-o", "--output", metavar="FILE", help="Write the node file here, not to stdout.")
@user_errors
def node_capture(simulate: str | None, output: str | None) -> None:
    """Print this machine's exact node file, read through NVML and sysfs (on a GPU node).

    Models, UUIDs, memory, bus ids, NUMA nodes and distances, CPUs, every pair's PCIe relation
    (also under NVLink) and NVLinks, NVSwitch links. With --simulate, the node file of a
    simulated node as discovery sees it.
    """
    from nvplugin.nodesession import capture_node

    _write_output(capture_node(simulate), output)


def _read_input(path: str, what: str) -> Any:
    """A text input of a node command: a file (bounded, regular) or - for stdin."""
    from nvplugin import yamlinput
    from nvplugin.nodefile.topoimport import Source

    if path == "-":
        data = sys.stdin.buffer.read(yamlinput.MAX_BYTES + 1)
        return Source(yamlinput.decode(data, "standard input"), "standard input")
    source = f"{what} {path}"
    return Source(yamlinput.read_text(path, source), source)


def _write_output(text: str, output: str | None) -> None:
    from nvplugin.errors import InputError

    if output is None:
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise InputError(f"-o {output}: cannot write it: {exc.strerror or exc}") from None
    click.echo(f"wrote {output}", err=True)
