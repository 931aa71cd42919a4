"""``nvplugin serve`` keeping the node's labels current, as GPU Feature Discovery does: in NFD's
feature file named by ``flags.gfd.outputFile`` (``GFD_OUTPUT_FILE``), or, with
``flags.useNodeFeatureAPI`` (``GFD_USE_NODE_FEATURE_API``), as NFD's NodeFeature object
(:mod:`.nodefeature`; the file is then not written, as GFD writes one or the other).

The labels are :func:`nvplugin.labels.node_labels` of what is served now. The daemon calls
:meth:`Labeller.update` whenever that may have changed -- the resources served at start, after
every reload (a new plan, or only new label settings), and while it waits for GPUs (GFD's
labels of a node without GPUs: timestamp and machine type, so a stale file from a killed plugin
does not claim GPUs) -- and the file is rewritten only when its labels change. Every
``flags.gfd.sleepInterval`` the file is written again if it differs from the labels (someone
removed it, an old plugin's stop removed it after the new one wrote it). At stop it is removed,
as GFD removes its file: a node without the plugin does not keep GPU labels.

The timestamp (``nvidia.com/gfd.timestamp``) is when the labels last changed: GFD stamps its
labels once per start and per SIGHUP; here a reload that changes nothing keeps the stamp.

Failures never stop the plugin: a file that cannot be written (no such directory, a read-only
mount) is logged and tried again at the next change or interval; the NodeFeature object is
published by a background task that retries with backoff. File work runs off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from nvplugin.config import Config
from nvplugin.errors import NvpluginError, reason
from nvplugin.labels import (
    feature_text,
    labels_without_gpus,
    node_labels,
    other_models,
    read_machine,
)
from nvplugin.labels.gfd import NodeFacts, labelled_model
from nvplugin.labels.output import remove, write_atomically
from nvplugin.log import get_logger
from nvplugin.nodesession import NodeSession
from nvplugin.plugin.nodefeature import NodeFeaturePublisher
from nvplugin.plugin.tasks import Tasks
from nvplugin.rm.plan import ResourcePlan


@dataclass(frozen=True)
class _Written:
    """The file as last written: where, and its labels without the timestamp, and the stamp."""

    path: str
    labels: dict[str, str]
    stamp: int | None


class Labeller:
    """Keeps the feature file or the NodeFeature object current (see the module docstring).
    ``tasks``: the owner of its refresh (the daemon's whole life; ended before :meth:`close`);
    ``clock`` gives seconds since the epoch (tests pass their own); ``publisher``: where the
    NodeFeature mode publishes (None: that mode is logged as unavailable)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        publisher: NodeFeaturePublisher | None = None,
        *,
        tasks: Tasks,
    ) -> None:
        self._tasks = tasks
        self._publisher = publisher
        self._published: tuple[dict[str, str], int | None] | None = None
        self._clock = clock
        self._log = get_logger("nvplugin.labels")
        self._config: Config | None = None
        self._node: NodeSession | None = None
        self._plan: ResourcePlan | None = None
        self._written: _Written | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._refreshing = False
        self._closed = False
        self._warned_models: tuple[str, ...] = ()

    @property
    def path(self) -> str | None:
        """The feature file now written (None: labelling is off, or nothing written yet)."""
        return self._written.path if self._written is not None else None

    async def update(
        self, config: Config, node: NodeSession | None, plan: ResourcePlan | None
    ) -> None:
        """Label what is served now: ``plan`` on ``node`` under ``config`` (no node: waiting for
        GPUs). Moves the file when ``flags.gfd.outputFile`` changed, removes it when unset."""
        self._config, self._node, self._plan = config, node, plan
        if not self._refreshing:
            self._refreshing = True
            self._tasks.spawn(self._refresh(), "nvplugin-labels")
        await self._apply()
        self._wake.set()  # the interval counts from now, with the new settings

    async def close(self) -> None:
        """Stop labelling and remove the feature file (the NodeFeature object stays: its pod
        owns it). Its refresh, and the publisher's task, end with their owner."""
        async with self._lock:
            self._closed = True
            written, self._written = self._written, None
            if written is not None:
                await self._remove(written.path)

    async def _refresh(self) -> None:
        """Write the file again every sleepInterval when it differs from the labels."""
        while True:
            config = self._config
            interval = config.gfd.sleep_interval_s if config is not None else 60.0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
                    self._wake.clear()
                    continue
            await self._apply(again=True)

    async def _apply(self, again: bool = False) -> None:
        async with self._lock:
            config = self._config
            if config is None or self._closed:
                return
            api = config.use_node_feature_api
            path = None if api else config.gfd.output_file
            written = self._written
            if written is not None and written.path != path:
                await self._remove(written.path)
                self._written = written = None
            if path is None and not api:
                return
            try:
                labels = await asyncio.to_thread(self._labels, config)
            except NvpluginError as exc:
                self._log.error("cannot label the node", error=reason(exc))
                return
            if api:
                self._publish(config, labels)
                return
            assert path is not None
            last = (written.labels, written.stamp) if written is not None else None
            stamp = self._stamp(config, labels, last)
            stamped = _stamped(labels, stamp)
            try:
                changed = await asyncio.to_thread(write_atomically, path, feature_text(stamped))
            except NvpluginError as exc:
                self._log.error("cannot write the node's labels", error=reason(exc))
                self._written = None
                return
            self._written = _Written(path, labels, stamp)
            if changed:
                log = self._log.warning if again else self._log.info
                what = "rewrote the node's labels" if again else "labelled the node"
                log(what, file=path, labels=len(stamped))

    def _publish(self, config: Config, labels: dict[str, str]) -> None:
        """The NodeFeature mode: hand the labels to the publisher (it never blocks)."""
        if self._publisher is None:
            self._log.error("cannot publish the NodeFeature object: no Kubernetes API access")
            return
        stamp = self._stamp(config, labels, self._published)
        self._published = (labels, stamp)
        self._publisher.want(_stamped(labels, stamp))

    def _stamp(
        self, config: Config, labels: dict[str, str], last: tuple[dict[str, str], int | None] | None
    ) -> int | None:
        """The timestamp label's value: None with noTimestamp; ``last``'s (labels, stamp) stamp
        while the labels are unchanged; else now."""
        if config.gfd.no_timestamp:
            return None
        if last is not None and last[0] == labels and last[1] is not None:
            return last[1]  # nothing changed: the labels keep their time
        return int(self._clock())

    def _labels(self, config: Config) -> dict[str, str]:
        """The labels without the timestamp (file I/O: the machine type; off the loop)."""
        node = self._node
        if node is None or self._plan is None:
            root = node.sysfs_root if node is not None else "/sys"
            return labels_without_gpus(read_machine(config.gfd.machine_type_file, root), None)
        scan = node.scan
        machine = read_machine(config.gfd.machine_type_file, node.sysfs_root)
        facts = NodeFacts(scan.topology, scan.driver, machine)
        others = tuple(other_models(scan.topology.gpus))
        if others and others != self._warned_models:
            self._warned_models = others
            self._log.warning(
                "nvidia.com/gpu.* labels describe one GPU model of several",
                labelled=labelled_model(scan.topology.gpus),
                others=list(others),
            )
        return node_labels(facts, self._plan, None)

    async def _remove(self, path: str) -> None:
        try:
            if await asyncio.to_thread(remove, path):
                self._log.info("removed the node's labels", file=path)
        except NvpluginError as exc:
            self._log.error("cannot remove the node's labels", error=reason(exc))


def _stamped(labels: dict[str, str], stamp: int | None) -> dict[str, str]:
    """``labels`` with the timestamp label, unless ``stamp`` is None."""
    stamped = dict(labels)
    if stamp is not None:
        stamped["nvidia.com/gfd.timestamp"] = str(stamp)
    return stamped
