"""CPUs from what a machine shows: the CPU Affinity lists of nvidia-smi topo -m (fit_affinities)
and the two node-file forms (CpuSpec, CpuLists) that :class:`CpuLayout` is built from."""

from __future__ import annotations

import pytest

from nvplugin.node.model import CpuLayout, parse_cpu_list
from nvplugin.nodefile.cpus import CpuLists, CpuSpec, fit_affinities


def cpus(text: str) -> tuple[int, ...]:
    return parse_cpu_list(text)


def test_dgx_a100_lists_without_numa_ids_land_on_their_nodes() -> None:
    """Drivers before the NUMA Affinity column: the lists of nodes 3, 1, 7, 5 of eight (NPS4)."""
    lists = [cpus("48-63,176-191"), cpus("16-31,144-159"), cpus("112-127,240-255")]
    fit = fit_affinities({}, lists, 1)
    assert fit is not None
    assert fit.cpus == CpuSpec(2, 64, 2) and fit.numa_nodes == 8
    assert fit.labels == (3, 1, 7)


def test_one_thread_per_core_when_lists_are_single_runs_per_node() -> None:
    fit = fit_affinities({(0,): cpus("0-51"), (1,): cpus("52-103")}, [], 2)
    assert fit is not None and fit.cpus == CpuSpec(2, 52, 1)


def test_the_sibling_offset_reveals_cpus_above_the_highest_listed() -> None:
    """Only NUMA node 0 has GPUs: its siblings start at 32, so the machine has 64 CPUs."""
    fit = fit_affinities({(0,): cpus("0-15,32-47")}, [], 1)
    assert fit is not None and fit.cpus == CpuSpec(2, 16, 2) and fit.numa_nodes == 2


def test_a_numa_range_is_the_union_of_its_nodes() -> None:
    fit = fit_affinities({(0, 1): cpus("0-31,128-159"), (6, 7): cpus("96-127,224-255")}, [], 8)
    assert fit is not None and fit.cpus == CpuSpec(2, 64, 2)


def test_lists_no_layout_reproduces_are_written_as_they_are() -> None:
    even, odd = tuple(range(0, 32, 2)), tuple(range(1, 32, 2))
    fit = fit_affinities({(0,): even, (2,): odd}, [], 3)
    assert fit is not None
    assert fit.cpus == CpuLists((even, (), odd), (even, odd), 1)
    assert fit.numa_nodes == 3 and "check with lscpu" in fit.notes[0]


def test_no_lists_no_fit() -> None:
    assert fit_affinities({}, [], 1) is None


def test_from_lists_gives_builds_layouts_back() -> None:
    built = CpuLayout.build(2, 8, 2, 4)
    lists = CpuLists(
        tuple(built.on_node(n) for n in range(4)), (built.on_socket(0), built.on_socket(1)), 2
    )
    assert lists.layout() == built == built.normalized()


@pytest.mark.parametrize(
    ("numa", "sockets", "threads", "problem"),
    [
        ([[0, 1], [1, 2]], [[0, 1, 2]], 1, "CPU 1 is on NUMA nodes 0 and 1"),
        ([[0, 1, 2]], [[0, 1, 2]], 2, "not a multiple of 2"),
        ([[0, 1]], [[0, 1, 2]], 1, "CPU 2 of socket 0 is on no NUMA node"),
        ([[0, 1, 2]], [[0, 1]], 1, "CPU 2 of NUMA node 0 is in no socket"),
    ],
)
def test_from_lists_refuses_lists_that_disagree(
    numa: list[list[int]], sockets: list[list[int]], threads: int, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        CpuLayout.from_lists(numa, sockets, threads)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("0-3,", "empty item"), ("3-1", "runs backwards"), ("0-99999", "above 4095"), ("x", "not a")],
)
def test_cpu_list_syntax_errors(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_cpu_list(text, 4095)
