"""Per-node configs, applied in place: the daemon follows its Node's label and the config
directory, and runs whatever config they choose -- without a sidecar, a symlink or a signal.

:class:`ConfigSelector` runs beside the serve loop, from start to stop:

- the Node's label, through :mod:`nvplugin.kube` (list, watch, resume, relist on 410, capped
  backoff). Without ``NODE_NAME`` or credentials this is off, said once at start; while the API is
  away nothing changes: the running config is kept and the daemon serves on;
- the config directory (the ConfigMap volume), through inotify: the kubelet swaps its ``..data``
  link atomically, a test or an admin may write files in place; either is a change here. It is
  checked every :data:`POLL_S` besides (and only so where inotify is unavailable);
- on any change, the choice is made again (:func:`nvplugin.config.select.choose`, NVIDIA's rule)
  and, when it names another config or the chosen file's contents changed, applied through the
  daemon's reload: the same checks as a SIGHUP, in place when only in-place settings differ,
  re-serving the resources otherwise (``migStrategy`` included), and the running config kept when
  the new one fails to load or to serve.

A choice that cannot be applied -- a label naming no config, a file that does not load, one that
cannot be served -- is logged with the reason and counted (``nvplugin_config_rejected_total``),
once per problem (not at every check while it lasts), and the running config stays. Which
config runs, and why (label, default, fallback), is logged at every change and exported as
``nvplugin_config_selected{config,why}``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nvplugin.backoff import Backoff
from nvplugin.config import Config
from nvplugin.config.select import (
    WHY_NONE,
    WHY_RECORD,
    Choice,
    NoConfig,
    Selection,
    Start,
    available,
    choose,
    digest,
    write_record,
)
from nvplugin.errors import InputError, reason
from nvplugin.log import get_logger
from nvplugin.plugin.metrics import Metrics
from nvplugin.plugin.registrar import DirWatcher
from nvplugin.plugin.tasks import Tasks
from nvplugin.yamlinput import MAX_BYTES

SETTLE_S = 0.1
"""After a change, how long to wait for the rest of it (a ConfigMap update is several events)."""
POLL_S = 2.0
"""How often the directory is checked besides inotify's events (what it could not report: an
edit in place of a file a link points to; everything, where inotify is unavailable)."""

_UNKNOWN = object()

Apply = Callable[[Callable[[], Config]], Awaitable[bool]]
"""The daemon's reload with a given loader: True when the new config runs."""


@dataclass(frozen=True)
class Following:
    """What ``serve`` hands the daemon for per-node selection: the settings, what it started
    with, and how to load a config file (flags and environment applied; None: no file)."""

    selection: Selection
    start: Start
    load: Callable[[str | None], Config]


@dataclass(frozen=True)
class ApiTiming:
    """How the Node is followed (shorter in tests)."""

    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    watch_s: int | None = None  # None: nvplugin.kube's default


class ConfigSelector:
    """Follows the label and the directory; applies the chosen config with ``apply``."""

    def __init__(
        self,
        following: Following,
        apply: Apply,
        metrics: Metrics,
        *,
        timing: ApiTiming = ApiTiming(),
        settle_s: float = SETTLE_S,
    ) -> None:
        self._selection = following.selection
        self._load = following.load
        self._start = following.start
        self._apply = apply
        self._metrics = metrics
        self._timing = timing
        self._settle_s = settle_s
        self.active: Choice = following.start.choice
        self._digest = following.start.digest
        self._refused = following.start.refused
        self._label: str | None = None
        self._label_known = False  # the API has answered once
        self._problem: str | None = None  # the last one said, so that it is said once
        self._changed = asyncio.Event()
        self._log = get_logger("nvplugin.config", node=self._selection.node_name)
        self._record = following.start.record
        # What the record holds now (a config name, or None), as far as this process knows.
        self._recorded: object = self.active.name if self.active.why == WHY_RECORD else _UNKNOWN
        self.chosen = asyncio.Event()
        """Set once the config to serve is known: at once, unless the start waits for the
        node's label (:attr:`Start.wait`); then when the label has been read and acted on, or
        can never be."""
        if not following.start.wait:
            self.chosen.set()

    def load_active(self) -> Config:
        """The running choice's config read again (what a SIGHUP reloads)."""
        return self._load(self.active.path(self._selection.srcdir))

    async def run(self) -> None:
        """Follow until cancelled."""
        self._selected(self.active)
        if self._start.problem is not None:
            self._rejected(self._start.reason or "invalid", self._start.problem, self.active)
        if not self.chosen.is_set():
            self._log.warning(
                "waiting for the node's label before serving",
                reason="no config chosen by the label is recorded on this node",
                record=self._record,
            )
        # The followers live as long as this: ended with it, however it ends.
        tasks = Tasks("config selector")
        watcher = DirWatcher(self._selection.srcdir, "the config directory")
        try:
            tasks.spawn(self._follow_label(), "nvplugin-node-label")
            tasks.spawn(watcher.run(), "nvplugin-config-dirwatch")
            tasks.spawn(self._watch_directory(watcher), "nvplugin-config-dir")
            while True:
                await self._changed.wait()
                await asyncio.sleep(self._settle_s)  # the rest of the change
                self._changed.clear()
                try:
                    await self._choose()
                except Exception as exc:  # never the end of following: the next change retries
                    self._log.error(
                        "choosing the config failed; running config kept", error=reason(exc)
                    )
                if self._label_known:
                    self.chosen.set()
        finally:
            await tasks.close()

    # --- choosing and applying ---

    async def _choose(self) -> None:
        srcdir = self._selection.srcdir
        try:
            names = await asyncio.to_thread(available, srcdir)
        except OSError as exc:
            message = f"cannot read the config directory {srcdir}: {exc.strerror or exc}"
            self._rejected("unreadable", message, None)
            return
        try:
            choice = choose(self._label, names, self._selection)
        except NoConfig as exc:
            self._rejected(exc.reason, str(exc), None)
            return
        path = choice.path(srcdir)
        hashed = await asyncio.to_thread(digest, path, MAX_BYTES)
        if choice.name == self.active.name and hashed == self._digest:
            self._problem = None
            if choice != self.active:  # the same file, for another reason
                self.active = choice
                self._selected(choice)
            await self._keep_record(choice)
            return
        if (choice, hashed) == self._refused:
            return  # refused already (and said); nothing new to try
        try:
            config = await asyncio.to_thread(self._load, path)
        except InputError as exc:
            self._refused = (choice, hashed)
            self._rejected("invalid", str(exc), choice)
            return
        if not await self._apply(lambda: config):
            self._refused = (choice, hashed)
            self._rejected("not-served", "the daemon could not serve it (logged above)", choice)
            return
        self.active, self._digest, self._refused, self._problem = choice, hashed, None, None
        self._selected(choice)
        await self._keep_record(choice)

    async def _keep_record(self, choice: Choice) -> None:
        """Record a choice made with the node's label known, for the next start (see
        :class:`~nvplugin.config.select.Start`); a failure is said and changes nothing else."""
        if self._record is None or not self._label_known or self._recorded == choice.name:
            return
        try:
            await asyncio.to_thread(write_record, self._record, choice, self._label)
        except OSError as exc:
            self._log.warning(
                "cannot record the chosen config; a restart while the API is away will wait for it",
                file=self._record,
                error=exc.strerror or str(exc),
            )
        self._recorded = choice.name

    def _selected(self, choice: Choice) -> None:
        self._metrics.config_selected(choice.name or "", choice.why)
        self._log.info(
            "config selected",
            config=choice.name,
            why=choice.why,
            file=choice.path(self._selection.srcdir),
            label=self._selection.node_label,
            value=self._label,
        )

    def _rejected(self, why: str, message: str, choice: Choice | None) -> None:
        if message == self._problem:
            return  # the same problem, seen again at a later check
        self._problem = message
        self._metrics.config_rejected(why)
        self._log.error(
            # Before any config ran (start), what runs is no config file: say so, not "kept".
            "config choice rejected; serving the built-in defaults (no config file)"
            if self.active.why == WHY_NONE
            else "config choice rejected; keeping the running config",
            reason=why,
            error=message,
            chosen=choice.name if choice is not None else None,
            running=self.active.name,
        )

    # --- the label ---

    async def _follow_label(self) -> None:
        try:
            await self._read_labels()
        finally:
            self.chosen.set()  # no label will come: serve what was chosen without it

    async def _read_labels(self) -> None:
        problem = self._selection.api_problem()
        if problem is not None:
            self._log.warning("per-node config by node label off", reason=problem)
            return
        # Only here is the client library imported: without the API, serve never loads it.
        from nvplugin.kube.client import ApiUnavailable, open_client
        from nvplugin.kube.node import API_JITTER, follow_labels

        try:
            client = await asyncio.to_thread(open_client, self._selection.access)
        except ApiUnavailable as exc:
            self._log.warning("per-node config by node label off", reason=str(exc))
            return
        name = self._selection.node_name or ""
        timing = self._timing
        backoff = Backoff(timing.backoff_initial_s, timing.backoff_max_s, API_JITTER)
        extra = {} if timing.watch_s is None else {"watch_s": timing.watch_s}
        try:
            async for state in follow_labels(client, name, backoff=backoff, **extra):
                if not state.exists:
                    self._log.warning("node not found; using the default or a fallback")
                label = state.labels.get(self._selection.node_label) or None
                if label != self._label or not state.exists:
                    self._log.info("node label", label=self._selection.node_label, value=label)
                self._label = label
                self._label_known = True
                self._changed.set()
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    # --- the directory ---

    async def _watch_directory(self, watcher: DirWatcher) -> None:
        """Wake the choice on every change in the directory (``watcher``, the registrar's kind:
        inotify, else polling), and at least every :data:`POLL_S` (a change inotify did not
        report)."""
        while True:
            await watcher.wait(POLL_S)
            self._changed.set()
