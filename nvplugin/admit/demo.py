"""``nvplugin demo`` (and ``make run``): the plugin and the kubelet's topology manager at work, on
simulated nodes, in a few seconds, with no GPU.

Two acts, each a real ``nvplugin serve`` process driven by the fake kubelet with the
``single-numa-node`` policy, admitting sample pods shipped in ``nvplugin/fakekubelet/samples/``:

1. **dgx-a100** (NVSwitch: every GPU pair has 12 NVLinks; two GPUs per NUMA node) with the static
   CPU manager: pods get GPUs and exclusive CPUs from one NUMA node; an init container's GPU is
   reused by the app container; a 4-GPU pod is refused (``TopologyAffinityError``), since no NUMA
   node holds four GPUs.
2. **dgx-1** (hybrid cube-mesh: pairs with two, one or no NVLinks): inside the NUMA node the
   kubelet chose, the plugin picks the GPUs (GetPreferredAllocation) -- double-NVLink pairs,
   leaving another double-NVLink pair for the next pod -- where the kubelet alone would take
   the first free GPUs.
3. **dgx-a100-mig** with ``migStrategy: mixed``: MIG devices are resources like any other
   (``nvidia.com/mig-1g.5gb``, ...) with their parent GPU's NUMA node; the plugin keeps a pod's
   MIG devices on one parent, and single-numa-node refuses a pod whose profile is spread over
   two NUMA nodes.
4. **mixed-a100-t4** with the A100s shared through MPS and the T4s time-sliced: a pod's MPS
   shares are its memory and thread limits (two shares of a GPU, twice the memory), run by the MPS
   control daemon the plugin starts (the simulated node's stand-in).

The acts run concurrently; the report is built from what actually happened (nothing in it is
canned except the act titles and the one-line stories).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import resources
from itertools import combinations

from nvplugin.admit.admission import AdmitReport, AdmitSettings, admit_pods
from nvplugin.admit.verdicts import to_table
from nvplugin.fakekubelet.pods import Pod, load_pods
from nvplugin.node.model import Topology
from nvplugin.nodesession import load_topology

SAMPLES = "samples"
"""The sample pod files' folder in :mod:`nvplugin.fakekubelet` (``nvplugin admit --help``
names it)."""


@dataclass(frozen=True)
class Act:
    title: str
    story: str
    sample: str  # file name in nvplugin/fakekubelet/samples/
    settings: AdmitSettings
    config: str | None = None  # the plugin's config file in samples/configs/, if the act needs one


ACTS = (
    Act(
        title="NVSwitch node, NUMA-aligned GPUs and CPUs",
        story=(
            "Every GPU pair of a DGX A100 has 12 NVLinks through the NVSwitches, so what matters\n"
            "is locality: with single-numa-node a pod's GPUs and exclusive CPUs must share one\n"
            "NUMA node, and a NUMA node here holds two GPUs."
        ),
        sample="dgx-a100.yaml",
        settings=AdmitSettings(
            simulate="dgx-a100",
            topology_manager_policy="single-numa-node",
            cpu_manager_policy="static",
            reserved_cpus="0-1",
        ),
    ),
    Act(
        title="NVLink-aware choice inside the NUMA node",
        story=(
            "A DGX-1's GPUs are wired unevenly (two, one or no NVLinks per pair). The kubelet\n"
            "picks the NUMA node; the plugin picks the GPUs in it (GetPreferredAllocation)."
        ),
        sample="dgx-1.yaml",
        settings=AdmitSettings(simulate="dgx-1", topology_manager_policy="single-numa-node"),
    ),
    Act(
        title="MIG devices as resources (migStrategy mixed)",
        story=(
            "MIG is on on six GPUs of this DGX A100 (five cut into MIG devices, one not yet),\n"
            "served as one resource per profile beside nvidia.com/gpu for the two GPUs with MIG\n"
            "off. A MIG device has its parent GPU's NUMA node; the plugin keeps a pod's MIG\n"
            "devices on one parent GPU."
        ),
        sample="dgx-a100-mig.yaml",
        settings=AdmitSettings(
            simulate="dgx-a100-mig",
            topology_manager_policy="single-numa-node",
            mig_strategy="mixed",
        ),
    ),
    Act(
        title="MPS shares beside time-slicing",
        story=(
            "The A100s are shared through MPS, four shares each: a share is a quarter of the\n"
            "GPU's memory and SMs, enforced by the MPS control daemon the plugin runs. Shares\n"
            "are packed (sharedDevicesAllocationPolicy): a pod asking for two gets two of one\n"
            "GPU, twice the memory and SMs. The T4s are time-sliced (no limits)."
        ),
        sample="mixed-a100-t4-mps.yaml",
        settings=AdmitSettings(
            simulate="mixed-a100-t4", topology_manager_policy="single-numa-node"
        ),
        config="mixed-a100-t4-mps.yaml",
    ),
)


def sample_config(name: str) -> str:
    """A sample config file of the plugin's shipped with the package (``samples/configs/``)."""
    return resources.files("nvplugin.fakekubelet").joinpath(SAMPLES, "configs", name).read_text()


def sample_pods(name: str) -> list[Pod]:
    """A sample pod file shipped with the package."""
    text = resources.files("nvplugin.fakekubelet").joinpath(SAMPLES, name).read_text()
    return load_pods(text, f"samples/{name}")


def _nvlinks(topology: Topology, gpus: tuple[int, ...]) -> str:
    n = sum(topology.link(a, b).nvlinks for a, b in combinations(gpus, 2))
    return f"{n} NVLink{'s' if n != 1 else ''}"


def _describe(topology: Topology, gpus: tuple[int, ...]) -> str:
    """``0,3 (GPU0-GPU3 NV2+PHB, score 230)``; big groups by NVLink total."""
    what = (
        f"GPU{gpus[0]}-GPU{gpus[1]} {topology.link(gpus[0], gpus[1]).cell}"
        if len(gpus) == 2
        else _nvlinks(topology, gpus)
    )
    return f"{','.join(map(str, gpus))} ({what}, score {topology.group_score(gpus)})"


def explain_choices(report: AdmitReport) -> list[str]:
    """For every multi-GPU container: its links, and what taking the first free GPUs of the
    same NUMA node (the kubelet without GetPreferredAllocation) would have given; for every
    container with several MIG devices, their parent GPUs."""
    topology = report.topology
    used: set[int] = set()
    lines = []
    for result in report.results:
        if not result.admitted:
            continue
        taken: set[int] = set()
        for c in result.containers:
            gpus = c.gpu_indices
            if len(c.mig_devices) >= 2:
                parents = ", ".join(f"GPU{gpu}" for gpu in gpus)
                lines.append(
                    f"{result.pod}/{c.name}: MIG devices {','.join(c.mig_devices)} on {parents}"
                )
            elif len(gpus) >= 2 and not c.mig_devices:
                line = f"{result.pod}/{c.name}: GPUs {_describe(topology, gpus)}"
                nodes = set(c.numa_nodes or ())
                free = [
                    g.index
                    for g in topology.gpus
                    if g.index not in used and (not nodes or g.numa_node in nodes)
                ]
                first_fit = tuple(free[: len(gpus)])
                if len(first_fit) == len(gpus) and first_fit != gpus:
                    line += (
                        "\n    (first fit on that NUMA node would give "
                        f"{_describe(topology, first_fit)})"
                    )
                lines.append(line)
            taken |= set(gpus)
        used |= taken
    return lines


async def _run_acts(configs: dict[str, str]) -> list[AdmitReport]:
    work = []
    for act in ACTS:
        topology = load_topology(act.settings.simulate)
        settings = replace(act.settings, config=configs.get(act.title))
        work.append(admit_pods(settings, sample_pods(act.sample), topology))
    return list(await asyncio.gather(*work))


@contextlib.contextmanager
def _config_files() -> Iterator[dict[str, str]]:
    """Each act's config file, written for the run: act title -> path (removed after)."""
    paths = {}
    try:
        for act in ACTS:
            if act.config is not None:
                fd, path = tempfile.mkstemp(prefix="nvplugin-demo-", suffix=".yaml")
                with os.fdopen(fd, "w") as out:
                    out.write(sample_config(act.config))
                paths[act.title] = path
        yield paths
    finally:
        for path in paths.values():
            with contextlib.suppress(OSError):
                os.unlink(path)


def run_demo() -> str:
    """Run every act; the report as text."""
    with _config_files() as configs:
        reports = asyncio.run(_run_acts(configs))
    out = [
        "nvplugin demo: the real device plugin (nvplugin serve, simulated node) driven by the",
        "fake kubelet over its unix sockets, topology manager policy single-numa-node.",
    ]
    for number, (act, report) in enumerate(zip(ACTS, reports, strict=True), start=1):
        out += ["", f"== {number}. {act.title} ({act.settings.simulate}) ==", act.story, ""]
        out.append(to_table(report).rstrip("\n"))
        choices = explain_choices(report)
        if choices:
            out += ["", "GPU choices:"] + [f"  {line}" for line in choices]
        if report.plugin_failure:
            out.append(f"error: {report.plugin_failure}")
    out += [
        "",
        "Try your own pods: nvplugin admit --simulate NODE "
        "--topology-manager-policy POLICY PODS.yaml",
    ]
    return "\n".join(out) + "\n"
