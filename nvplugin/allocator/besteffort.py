"""The best-effort policy: the exact objective of ../shared/docs/allocation.md, in milliseconds.

NVIDIA's allocator enumerates every partition of the free GPUs (22 million for 16 GPUs at size
3). We never enumerate: the topology is fixed for the life of the process, so at start-up we
build, once, the subset tables of :mod:`nvplugin.allocator.tables` (every subset's score, and
per group size the best partition score of every subset). A query is then a few numpy
operations over the at most C(16, 8) = 12870 candidate groups, whatever the available set: there
is no answer cache, and a never-seen request is as fast as a repeated one.

Nodes with more than :data:`TABLE_GPUS` GPUs (no built-in node has them) take an exact but slower
path: each query builds the tables over its own available GPUs for its one size. Measured on a
2-core machine at the worst size: ~0.1 s for 16 available GPUs, ~0.4 s / 30 MB for 18, ~5 s /
120 MB for 20, and over 3x more time per extra GPU beyond that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nvplugin.allocator.base import Allocation, Request, check_request
from nvplugin.allocator.tables import Tables
from nvplugin.node.model import Topology

TABLE_GPUS = 16
"""Largest node whose tables are built once at start-up (2^16 masks: ~5 MB, ~0.3 s)."""


def _indices(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


class BestEffort:
    """Exact best-effort allocation over one topology (see the module docstring)."""

    name = "best-effort"

    def __init__(self, topology: Topology, *, table_gpus: int = TABLE_GPUS) -> None:
        self._topology = topology
        n = len(topology)
        self._tables = Tables.build(topology.scores, range(1, n + 1)) if n <= table_gpus else None
        if self._tables is not None and n:
            # One query at start-up runs every code path once (numpy's first calls are slower),
            # so the kubelet's first request is as fast as the rest.
            self.allocate(range(n), [], max(1, n // 2))

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def table_bytes(self) -> int:
        """Memory held by the start-up tables (0 on the per-query path)."""
        return self._tables.nbytes if self._tables is not None else 0

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        request = check_request(len(self._topology), available, must_include, size)
        if request.impossible:
            return []
        tables, labels = self._tables_for(request)
        best = tables.best_group(
            _relabel(request.available_mask, labels),
            _relabel(request.must_include_mask, labels),
            request.size,
        )
        assert best is not None, "a possible request always has a candidate group"
        return list(self._out(best[0], labels))

    def solve(self, available: Sequence[int], must_include: Sequence[int], size: int) -> Allocation:
        """Like :meth:`allocate`, with the group's score, OPT and a best partition."""
        request = check_request(len(self._topology), available, must_include, size)
        if request.impossible:
            return Allocation(self.name, (), None, None, reason=request.impossible)
        tables, labels = self._tables_for(request)
        chosen, own, total = tables.candidates(
            _relabel(request.available_mask, labels),
            _relabel(request.must_include_mask, labels),
            request.size,
        )
        optimal = total == total.max()
        ranked = sorted(
            zip(
                own[optimal].tolist(),
                range(int(optimal.sum())),
                chosen[optimal].tolist(),
                strict=True,
            ),
            key=lambda item: (-item[0], item[1]),
        )
        answer = self._explain(tables, labels, request, ranked[0][2])
        contenders = tuple((self._out(mask, labels), score) for score, _, mask in ranked)
        return dataclasses.replace(answer, contenders=contenders)

    def evaluate(self, available: Sequence[int], group: Sequence[int], policy: str) -> Allocation:
        """Score a group another policy chose: its own score and the best partition of
        ``available`` that contains it as a full group (``partition_score``)."""
        request = check_request(len(self._topology), available, group, len(group))
        if request.impossible:
            return Allocation(policy, (), None, None, reason=request.impossible)
        tables, labels = self._tables_for(request)
        answer = self._explain(tables, labels, request, _relabel(request.must_include_mask, labels))
        return dataclasses.replace(answer, policy=policy)

    def _tables_for(self, request: Request) -> tuple[Tables, tuple[int, ...]]:
        """The tables to answer ``request`` with, and the GPU index of each table position
        (empty when positions are GPU indices)."""
        if self._tables is not None:
            return self._tables, ()
        labels = request.available
        scores = self._topology.scores
        sub = [[scores[a][b] for b in labels] for a in labels]
        return Tables.build(sub, [request.size]), labels

    def _explain(
        self, tables: Tables, labels: tuple[int, ...], request: Request, group: int
    ) -> Allocation:
        s = request.size
        available = _relabel(request.available_mask, labels)
        own = int(tables.setscore[group])
        total = own + int(tables.rest[s][available ^ group])
        full, leftover = tables.split(available ^ group, s)

        def out(mask: int) -> tuple[int, ...]:
            return self._out(mask, labels)

        others = sorted((out(g) for g in full), key=lambda g: g[0])
        return Allocation(self.name, out(group), own, total, (out(group), *others), out(leftover))

    @staticmethod
    def _out(mask: int, labels: tuple[int, ...]) -> tuple[int, ...]:
        """Table positions back to GPU indices."""
        local = _indices(mask)
        return tuple(labels[i] for i in local) if labels else local


def _relabel(mask: int, labels: tuple[int, ...]) -> int:
    """A mask over GPU indices as a mask over table positions (identity when no labels)."""
    if not labels:
        return mask
    return sum(1 << position for position, gpu in enumerate(labels) if mask >> gpu & 1)
