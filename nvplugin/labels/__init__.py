"""The node's labels: a pure function of what is served (the node and the plan) to ``key=value``.

GPU Feature Discovery's labels (:mod:`.gfd`) and nvplugin's few own ones (:mod:`.extra`), for
``nvplugin labels`` to print and ``nvplugin serve`` to keep current in NFD's feature file
(:mod:`.output`; the daemon's side is :mod:`nvplugin.plugin.labelling`). Nothing here calls NVML:
what the labels say of the node was read by discovery (:mod:`nvplugin.node`), and the machine
type is one file read (:func:`node_facts`).
"""

from __future__ import annotations

import os

from nvplugin.labels.extra import extra_labels
from nvplugin.labels.gfd import (
    LabelError,
    NodeFacts,
    gfd_labels,
    labels_without_gpus,
    other_models,
)
from nvplugin.labels.output import feature_text
from nvplugin.node.model import Driver, Topology
from nvplugin.node.sysfs import read_machine_type
from nvplugin.rm.plan import ResourcePlan

__all__ = [
    "LabelError",
    "NodeFacts",
    "feature_text",
    "labels_without_gpus",
    "machine_type_path",
    "node_facts",
    "node_labels",
    "other_models",
    "read_machine",
]

SYSFS = "/sys"


def node_labels(
    node: NodeFacts, plan: ResourcePlan | None, timestamp: int | None
) -> dict[str, str]:
    """Every label of ``node`` serving ``plan`` (None: nothing served yet), in key order:
    GFD's, then nvplugin's. ``timestamp``: seconds since the epoch, None to leave it out."""
    labels = gfd_labels(node, plan, timestamp)
    labels.update(extra_labels(node.topology, plan))
    return dict(sorted(labels.items()))


def machine_type_path(path: str, sysfs_root: str) -> str:
    """Where to read the machine-type file ``path``: a path under ``/sys`` is read under the
    node's sysfs root (a simulated node's generated tree), any other as it is."""
    if sysfs_root != SYSFS and (path == SYSFS or path.startswith(f"{SYSFS}/")):
        return os.path.join(sysfs_root, path[len(SYSFS) :].lstrip("/"))
    return path


def read_machine(machine_type_file: str, sysfs_root: str) -> str | None:
    """The machine type, from ``machine_type_file`` (see :func:`machine_type_path`)."""
    return read_machine_type(machine_type_path(machine_type_file, sysfs_root))


def node_facts(
    topology: Topology, driver: Driver, machine_type_file: str, sysfs_root: str
) -> NodeFacts:
    """The node as the labels see it; reads the machine-type file (nothing else)."""
    return NodeFacts(topology, driver, read_machine(machine_type_file, sysfs_root))
