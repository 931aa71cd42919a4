"""The MPS control daemon of each resource shared through MPS: started (or adopted), set up,
watched, restarted and stopped by the plugin itself -- no second DaemonSet, no node label -- and
left running when the plugin exits, so that its clients keep their server across a plugin
restart.

For each MPS resource (:class:`DaemonSpec`), :class:`MpsDaemon`:

- claims its GPUs: compute mode EXCLUSIVE_PROCESS through NVML, the mode it had recorded first
  (:mod:`.mpsmodes`), so that it is restored when MPS stops serving the GPU for good;
- adopts the daemon already running on the resource's pipe directory when it is the one this
  spec would start: nvplugin's (:data:`~.mpscontrol.OWNER_ENV`), alone there, with the same
  ``CUDA_VISIBLE_DEVICES`` and log directory, answering ``get_server_list``, and with the same
  defaults (``get_default_active_thread_percentage``, ``get_default_device_pinned_mem_limit
  <n>``). It is watched as if this plugin had started it, and nothing is sent to it but those
  queries. Any other daemon there is quit (logged with why), and then
- runs ``nvidia-cuda-mps-control -d`` (from the driver root) with ``CUDA_MPS_PIPE_DIRECTORY`` and
  ``CUDA_MPS_LOG_DIRECTORY`` under ``<root>/<resource>/`` and ``CUDA_VISIBLE_DEVICES`` its GPUs'
  UUIDs in index order (so ordinal n in a command is the resource's n-th GPU), and sets each GPU's
  default pinned device memory limit and the default active thread percentage to one share
  (:mod:`nvplugin.rm.mps`) by its control commands -- the daemon is *ready* when they are
  answered (or when it was adopted), and only then is the resource advertised;
- watches it: its exit (a pidfd: at once) and its answer to ``get_server_list`` every
  ``check_s``. When it dies or does not answer within ``command_timeout_s``, the resource's
  devices are Unhealthy at once, what is left of it is killed, and it is started again after a
  backoff (``backoff_s`` doubling to ``backoff_max_s``; back to the start once it stayed up that
  long); ready again, the devices are Healthy again;
- stops (:meth:`MpsDaemon.stop`: MPS no longer serves the resource so): ``quit``, then SIGKILL
  if it is still there after ``stop_timeout_s``; compute modes restored, records removed; or is
  released (:meth:`MpsDaemon.release`: the plugin exits): no longer watched, left running with
  its GPUs claimed and their records kept, for the next plugin to adopt.

:class:`MpsDaemons` keeps the daemons across a re-serve (SIGHUP): a daemon whose spec is unchanged
keeps running -- its clients keep their server -- and one no longer wanted is stopped before new
ones start (a GPU may move from one MPS resource to another). Given the plugin's MPS root
(:class:`MpsRoot`), each serve also ends what no served resource wants any more of what earlier
plugins left there (:func:`end_leftovers`): nvplugin's daemons on the node's GPUs on another pipe
directory under the root, and the compute modes recorded for GPUs MPS no longer serves -- so
MPS is turned off for good by the first plugin that runs without it (and by ``nvplugin mps
stop``, which wants nothing).

At shutdown the daemons are released where they can outlive the plugin, and stopped where they
cannot (:func:`daemons_outlive_us`: not when the plugin is its PID namespace's init, as in its
container, or a container init's child).

The control program's processes and commands are :mod:`.mpscontrol`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nvplugin.api.nvidia import MPS_CONTAINER_ROOT, MPS_LOG_ENV, MPS_PIPE_ENV, MPS_SHM_PATH
from nvplugin.backoff import Backoff, Retry
from nvplugin.config import Config
from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu
from nvplugin.plugin.mpscontrol import (
    CHECK_COMMAND,
    CONTROL,
    OWNER,
    OWNER_ENV,
    MpsError,
    alive,
    close_pidfd,
    control_daemons,
    daemon_environment,
    daemon_pids,
    end_daemons,
    find_control,
    memory_mib,
    open_pidfd,
    run_control,
)
from nvplugin.plugin.mpsmodes import EXCLUSIVE_PROCESS, ComputeModes, ModeRecords, make_dirs
from nvplugin.plugin.tasks import Tasks
from nvplugin.rm import ServedResource
from nvplugin.rm.mps import (
    log_dir,
    memory_limit,
    pipe_dir,
    share_memory_mib,
    share_threads,
    shm_dir,
)

__all__ = [
    "EXCLUSIVE_PROCESS",
    "ComputeModes",
    "DaemonSpec",
    "Ended",
    "MpsDaemon",
    "MpsDaemons",
    "MpsError",
    "MpsRoot",
    "Timing",
    "control_daemons",
    "daemon_pids",
    "daemon_specs",
    "daemons_outlive_us",
    "end_leftovers",
    "find_control",
    "local_root",
    "mps_root",
]

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Timing:
    """How long the daemon's steps may take and how often it is checked."""

    command_timeout_s: float = 5.0
    start_timeout_s: float = 10.0
    check_s: float = 5.0
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    stop_timeout_s: float = 2.0


@dataclass(frozen=True)
class DaemonSpec:
    """One MPS resource's control daemon. ``root``: the MPS root as this process sees it;
    ``control``: the ``nvidia-cuda-mps-control`` program. Two equal specs are the same daemon."""

    resource: str
    gpus: tuple[Gpu, ...]
    replicas: int
    root: str
    control: str

    @property
    def pipe_dir(self) -> str:
        return pipe_dir(self.root, self.resource)

    @property
    def log_dir(self) -> str:
        return log_dir(self.root, self.resource)

    def environment(self, inherited: dict[str, str]) -> dict[str, str]:
        """The daemon's and its control commands' environment: ``inherited`` plus the MPS
        directories, the resource's GPUs and nvplugin's mark; the program's own directory first
        on PATH (the MPS server beside it in a driver root is found there)."""
        path = inherited.get("PATH", os.defpath)
        return {
            **inherited,
            "PATH": f"{os.path.dirname(self.control)}{os.pathsep}{path}",
            MPS_PIPE_ENV: self.pipe_dir,
            MPS_LOG_ENV: self.log_dir,
            VISIBLE_ENV: ",".join(gpu.uuid for gpu in self.gpus),
            OWNER_ENV: OWNER,
        }

    def setup_commands(self) -> list[str]:
        """One share of each GPU as the daemon's defaults: memory per ordinal, then threads."""
        commands = [
            f"set_default_device_pinned_mem_limit {ordinal} "
            f"{memory_limit(share_memory_mib(gpu, self.replicas))}"
            for ordinal, gpu in enumerate(self.gpus)
        ]
        commands.append(f"set_default_active_thread_percentage {share_threads(self.replicas)}")
        return commands


def local_root(mps_root: str, container_root: str = MPS_CONTAINER_ROOT) -> str:
    """Where this process reaches the host's MPS root ``mps_root``: at NVIDIA's container root
    ``/mps`` when it exists (NVIDIA's charts and nvplugin's mount the root there), else at its
    host path (the plugin runs on the host, or its pod mounts the root at the same path)."""
    return container_root if os.path.isdir(container_root) else mps_root


def shares_memory(root: str) -> bool:
    """Whether this process's ``/dev/shm`` is ``<root>/shm``, which MPS clients get as theirs:
    the MPS servers the daemon starts share memory with their clients through it."""
    try:
        here, there = os.stat(MPS_SHM_PATH), os.stat(shm_dir(root))
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def daemon_specs(
    config: Config, resources: Sequence[ServedResource], driver_root: str | None, real: bool
) -> list[DaemonSpec]:
    """The control daemons the resources shared through MPS need, in plan order; NvpluginError
    when the MPS control program cannot be found. ``real``: a real node (not simulated), where
    the MPS servers need this process's ``/dev/shm`` to be the clients' (warned otherwise)."""
    shared = [resource for resource in resources if resource.replicas.mps]
    if not shared:
        return []
    control = find_control(driver_root)
    root = local_root(config.mps_root)
    log = get_logger("nvplugin.mps")
    log.info("MPS root", host=config.mps_root, here=root, control=control)
    if real and not shares_memory(root):
        log.warning(
            "this process's /dev/shm is not the MPS root's shm directory, which MPS clients get "
            "as /dev/shm: the MPS servers would not share memory with them (mount "
            f"{shm_dir(config.mps_root)} at /dev/shm, as nvplugin's chart does)",
            shm=shm_dir(root),
        )
    return [
        DaemonSpec(resource.name, resource.gpus, resource.replicas.count, root, control)
        for resource in shared
    ]


@dataclass(frozen=True)
class MpsRoot:
    """The MPS root a plugin owns, as this process sees it (``path``), the node's GPUs and the
    control program (None where it is not found: leftover daemons then get SIGTERM instead of
    ``quit``): where what earlier plugins left is found and ended (:func:`end_leftovers`)."""

    path: str
    gpus: tuple[Gpu, ...]
    control: str | None


def mps_root(config: Config, gpus: Sequence[Gpu], driver_root: str | None) -> MpsRoot:
    """``config``'s MPS root, with or without MPS in the config."""
    try:
        control: str | None = find_control(driver_root)
    except NvpluginError:
        control = None
    return MpsRoot(local_root(config.mps_root), tuple(gpus), control)


INIT_PID_NAMESPACE = 0xEFFFFFFC
"""The inode of the host's (initial) PID namespace, ``/proc/self/ns/pid`` (the kernel's
PROC_PID_INIT_INO)."""


def daemons_outlive_us(
    pid: int | None = None, ppid: int | None = None, namespace: int | None = None
) -> bool:
    """Whether the daemons this process starts can outlive it. Not when it is PID 1, the init of
    its PID namespace -- a container's main process, as nvplugin runs in its chart -- whose exit
    makes the kernel kill every process of the namespace; nor when its parent is a container's
    init (tini, a shell: PID 1 of a PID namespace other than the host's), which ends with it.
    There they are better stopped cleanly (``quit``, compute modes restored) than killed a moment
    later. ``pid``, ``ppid``, ``namespace`` (the PID namespace's inode): this process's, unless
    given."""
    pid = os.getpid() if pid is None else pid
    ppid = os.getppid() if ppid is None else ppid
    if namespace is None:
        try:
            namespace = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            namespace = 0  # unknown: taken for a container's
    return pid != 1 and (ppid != 1 or namespace == INIT_PID_NAMESPACE)


# --- one daemon -----------------------------------------------------------------------------------

Ready = Callable[[str | None], None]
"""Told the daemon's state: None when it is ready, else why it is not."""


class MpsDaemon:
    """One resource's control daemon (see the module docstring). :meth:`start` runs it from now
    on (a task); :meth:`stop` ends it, :meth:`release` leaves it running. ``on_state`` (set with
    :meth:`follow`) hears every change."""

    def __init__(
        self,
        spec: DaemonSpec,
        nvml: ComputeModes,
        inherited: dict[str, str],
        timing: Timing = Timing(),
    ) -> None:
        self.spec = spec
        self._records = ModeRecords(spec.root, nvml)
        self._env = spec.environment(inherited)
        self._timing = timing
        self._log = get_logger("nvplugin.mps", resource=spec.resource)
        self._tasks = self._lifetime()  # the watch, from start to stop
        self._state: str | None = "starting"
        self._followers: list[Ready] = []
        self._pid: int | None = None
        self._claimed: dict[int, str] = {}  # GPU index -> the mode to restore
        self.starts = 0  # daemons started
        self.adopted = 0  # daemons adopted

    @property
    def ready(self) -> bool:
        return self._state is None

    @property
    def pid(self) -> int | None:
        """The daemon's process, while it runs."""
        return self._pid

    def follow(self, on_state: Ready) -> None:
        """Hear the daemon's state now and at every change (a re-serve adds a new service)."""
        self._followers.append(on_state)
        on_state(self._state)

    def unfollow_all(self) -> None:
        self._followers.clear()

    def start(self) -> None:
        if not self._tasks:
            self._tasks.spawn(self._run(), f"nvplugin-mps-{self.spec.resource}")

    async def stop(self) -> None:
        """Stop watching, quit the daemon (SIGKILL when it does not go), restore compute modes."""
        tasks, self._tasks = self._tasks, self._lifetime()
        await tasks.close()
        self._set_state("stopped")
        await self._quit()
        await asyncio.to_thread(self._release)
        self._log.info("MPS control daemon stopped", gpus=[gpu.index for gpu in self.spec.gpus])

    async def release(self) -> None:
        """Stop watching and leave the daemon running (the plugin exits): its GPUs stay claimed
        and their records stay, for the next plugin to adopt it, or whoever turns MPS off to
        restore them."""
        tasks, self._tasks = self._tasks, self._lifetime()
        await tasks.close()
        self._set_state("released")
        self._log.info(
            "MPS control daemon left running",
            pid=self._pid if self._pid is not None and alive(self._pid) else None,
            pipe_dir=self.spec.pipe_dir,
        )

    def _lifetime(self) -> Tasks:
        return Tasks(f"MPS control daemon {self.spec.resource}")

    # --- the life of the daemon ---

    def _set_state(self, state: str | None) -> None:
        if state == self._state:
            return
        self._state = state
        for follower in list(self._followers):
            follower(state)

    async def _run(self) -> None:
        # A daemon that served a good while (the longest wait or more) starts again quickly.
        restarts = Retry(Backoff(self._timing.backoff_s, self._timing.backoff_max_s))
        while True:
            started = time.monotonic()
            try:
                await self._start()
            except Exception as exc:  # whatever it was, the daemon is started again
                self._set_state(str(exc))
                wait = restarts.next_after(time.monotonic() - started)
                self._log.error("MPS control daemon failed to start", error=str(exc), retry_s=wait)
            else:
                self._set_state(None)
                reason = await self._watch()
                self._set_state(reason)  # the devices go Unhealthy at once
                wait = restarts.next_after(time.monotonic() - started)
                self._log.error("MPS control daemon lost", reason=reason, restart_s=wait)
                await self._quit()
            await asyncio.sleep(wait)

    async def _start(self) -> None:
        """Claim the GPUs; adopt the daemon on the pipe directory if it is this spec's, else
        replace whatever runs there: start and set up."""
        spec = self.spec
        await asyncio.to_thread(self._prepare)
        if await self._adopt():
            return
        self.starts += 1
        output = await self._run_control(["-d"], "", self._timing.start_timeout_s)
        self._pid = await self._wait_for_daemon()
        for command in spec.setup_commands():
            await self.command(command)
        self._log.info(
            "MPS control daemon ready",
            pid=self._pid,
            gpus=[gpu.index for gpu in spec.gpus],
            replicas=spec.replicas,
            pipe_dir=spec.pipe_dir,
            started=output.strip() or None,
        )

    def _prepare(self) -> None:
        """The directories, and each GPU in EXCLUSIVE_PROCESS (its mode before, recorded)."""
        spec = self.spec
        try:
            for directory in (spec.pipe_dir, spec.log_dir, shm_dir(spec.root)):
                make_dirs(directory)
            for gpu in spec.gpus:
                self._claimed.setdefault(gpu.index, self._records.claim(gpu))
        except OSError as exc:
            raise MpsError(f"cannot prepare {exc.filename}: {exc.strerror or exc}") from None
        except NvpluginError as exc:
            raise MpsError(str(exc)) from None

    def _release(self) -> None:
        """Each claimed GPU back in its recorded mode; the record removed once restored (kept
        when NVML refuses: the next plugin restores it)."""
        for gpu in self.spec.gpus:
            mode = self._claimed.pop(gpu.index, None)
            if mode is not None:
                self._records.restore(gpu, mode)

    # --- adoption ---

    async def _adopt(self) -> bool:
        """Adopt the daemon running on the pipe directory if it is the one this spec would
        start; True if so. Any other is quit, with why."""
        pids = await asyncio.to_thread(daemon_pids, self.spec.pipe_dir)
        if not pids:
            return False
        reason = await self._differs(pids)
        if reason is not None:
            self._log.warning("MPS control daemon replaced", pids=pids, reason=reason)
            await self._quit()
            return False
        self._pid = pids[0]
        self.adopted += 1
        self._log.info(
            "MPS control daemon adopted",
            pid=self._pid,
            gpus=[gpu.index for gpu in self.spec.gpus],
            replicas=self.spec.replicas,
            pipe_dir=self.spec.pipe_dir,
        )
        return True

    async def _differs(self, pids: Sequence[int]) -> str | None:
        """Why the daemons ``pids`` on the pipe directory are not the one this spec would start
        (None: it is)."""
        spec = self.spec
        if len(pids) > 1:
            return f"{len(pids)} daemons run on the pipe directory"
        env = await asyncio.to_thread(daemon_environment, pids[0])
        if env.get(OWNER_ENV) != OWNER:
            return f"not started by nvplugin ({OWNER_ENV} is not {OWNER} in its environment)"
        for name in (VISIBLE_ENV, MPS_LOG_ENV):
            if env.get(name) != self._env[name]:
                return f"its {name} is {env.get(name)!r}, not {self._env[name]!r}"
        try:
            await self.command(CHECK_COMMAND)
            threads = (await self.command("get_default_active_thread_percentage")).strip()
            memory = [
                (await self.command(f"get_default_device_pinned_mem_limit {ordinal}")).strip()
                for ordinal in range(len(spec.gpus))
            ]
        except MpsError as exc:
            return f"it does not answer: {exc}"
        want = share_threads(spec.replicas)
        if _number(threads) != want:
            return f"its default active thread percentage is {threads!r}, not {want}"
        for ordinal, (gpu, answer) in enumerate(zip(spec.gpus, memory, strict=True)):
            mib = share_memory_mib(gpu, spec.replicas)
            if memory_mib(answer) != mib:
                return (
                    f"its default pinned memory limit of device {ordinal} is {answer!r}, not "
                    f"{memory_limit(mib)}"
                )
        return None

    async def _wait_for_daemon(self) -> int:
        """The daemon's pid once it answers (``-d`` may return before it listens)."""
        deadline = time.monotonic() + self._timing.start_timeout_s
        while True:
            try:
                await self.command(CHECK_COMMAND)
            except MpsError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            pids = await asyncio.to_thread(daemon_pids, self.spec.pipe_dir)
            if len(pids) == 1:
                return pids[0]
            raise MpsError(
                f"{CONTROL} -d answers on {self.spec.pipe_dir}, but "
                f"{'no' if not pids else len(pids)} daemon process(es) run with that pipe "
                "directory in this process's view of /proc"
            )

    async def _watch(self) -> str:
        """Wait until the daemon exits or stops answering; why."""
        pid = self._pid
        assert pid is not None
        exited = asyncio.get_running_loop().create_future()
        pidfd = open_pidfd(pid, exited)
        try:
            while not exited.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._timing.check_s):
                        await asyncio.shield(exited)
                if exited.done() or not alive(pid):
                    break
                try:
                    await self.command(CHECK_COMMAND)
                except MpsError as exc:
                    return f"control daemon {pid} does not answer: {exc}"
            return f"control daemon {pid} exited"
        finally:
            close_pidfd(pidfd)
            self._pid = None if not alive(pid) else pid

    async def _quit(self) -> None:
        """End every daemon on the pipe directory: ``quit``, then SIGKILL what is left."""
        pids = await asyncio.to_thread(daemon_pids, self.spec.pipe_dir)
        quit = functools.partial(self.command, "quit", self._timing.stop_timeout_s)
        await end_daemons(pids, quit, self._timing.stop_timeout_s)
        self._pid = None

    # --- control commands ---

    async def command(self, text: str, timeout: float | None = None) -> str:
        """Send one control command; its answer. MpsError when no daemon answers in time."""
        return await self._run_control([], text + "\n", timeout or self._timing.command_timeout_s)

    async def _run_control(self, args: Sequence[str], stdin: str, timeout: float) -> str:
        return await run_control(self.spec.control, self._env, args, stdin, timeout)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# --- the daemons of a config ----------------------------------------------------------------------


@dataclass
class MpsDaemons:
    """The running daemons, by resource, kept across re-serves while their spec stays."""

    nvml: ComputeModes
    inherited: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    timing: Timing = Timing()
    running: dict[str, MpsDaemon] = field(default_factory=dict)

    async def serve(
        self, specs: Sequence[DaemonSpec], root: MpsRoot | None = None
    ) -> dict[str, MpsDaemon]:
        """The daemons for ``specs``, by resource: running ones whose spec is unchanged, new ones
        (started, or adopted) for the rest; the daemons no longer wanted stopped first, and
        with ``root``, what earlier plugins left there that no spec wants
        (:func:`end_leftovers`)."""
        wanted = {spec.resource: spec for spec in specs}
        for name, daemon in list(self.running.items()):
            daemon.unfollow_all()
            if wanted.get(name) != daemon.spec:
                del self.running[name]
                await daemon.stop()
        if root is not None:
            await end_leftovers(root, self.nvml, specs, self.inherited, self.timing)
        for name, spec in wanted.items():
            if name not in self.running:
                daemon = MpsDaemon(spec, self.nvml, self.inherited, self.timing)
                self.running[name] = daemon
                daemon.start()
        return dict(self.running)

    def detach(self) -> None:
        """Forget who follows the daemons (their services stop); they keep running."""
        for daemon in self.running.values():
            daemon.unfollow_all()

    async def stop(self) -> None:
        """Stop every daemon, together (shutdown where they cannot outlive the plugin)."""
        daemons, self.running = list(self.running.values()), {}
        await asyncio.gather(*(daemon.stop() for daemon in daemons))

    async def release(self) -> None:
        """Leave every daemon running, unwatched, its GPUs claimed (shutdown)."""
        daemons, self.running = list(self.running.values()), {}
        await asyncio.gather(*(daemon.release() for daemon in daemons))


@dataclass(frozen=True)
class Ended:
    """What :func:`end_leftovers` ended: the pipe directories whose daemons it stopped, the GPUs
    whose mode it restored, and those it could not (their records kept), by index."""

    pipe_dirs: tuple[str, ...] = ()
    restored: tuple[int, ...] = ()
    not_restored: tuple[int, ...] = ()


async def end_leftovers(
    root: MpsRoot,
    nvml: ComputeModes,
    wanted: Sequence[DaemonSpec],
    inherited: dict[str, str],
    timing: Timing = Timing(),
) -> Ended:
    """End what earlier plugins left under ``root`` that none of ``wanted`` wants: nvplugin's
    daemons (:data:`~.mpscontrol.OWNER_ENV`) on another pipe directory under the root that serve
    a GPU of this node (``quit``, SIGKILL after ``stop_timeout_s``), then the compute modes
    recorded for this node's GPUs that no wanted spec serves (restored, records removed). Another
    node's daemons and records -- a simulated node's, say -- are left alone."""
    if not os.path.isdir(root.path):
        return Ended()
    log = get_logger("nvplugin.mps")
    pipes = {spec.pipe_dir for spec in wanted}
    node = {gpu.uuid: gpu for gpu in root.gpus}
    left = await asyncio.to_thread(_leftover_daemons, root.path, pipes, set(node))
    for pipe, pids in left:
        log.info(
            "stopping an MPS control daemon no served resource wants", pipe_dir=pipe, pids=pids
        )
        quit = None
        if root.control is not None:
            env = {**inherited, MPS_PIPE_ENV: pipe}
            quit = functools.partial(
                run_control, root.control, env, [], "quit\n", timing.stop_timeout_s
            )
        await end_daemons(pids, quit, timing.stop_timeout_s)
    claimed = {gpu.uuid for spec in wanted for gpu in spec.gpus}
    records = ModeRecords(root.path, nvml)

    def restore() -> tuple[list[int], list[int]]:
        done: tuple[list[int], list[int]] = ([], [])
        recorded = records.recorded()
        for gpu in sorted(root.gpus, key=lambda gpu: gpu.index):
            mode = recorded.get(gpu.uuid)
            if mode is not None and gpu.uuid not in claimed:
                done[0 if records.restore(gpu, mode) else 1].append(gpu.index)
        return done

    restored, failed = await asyncio.to_thread(restore)
    return Ended(tuple(pipe for pipe, _ in left), tuple(restored), tuple(failed))


def _leftover_daemons(root: str, keep: set[str], gpus: set[str]) -> list[tuple[str, list[int]]]:
    """nvplugin's daemons under ``root`` on a pipe directory not in ``keep``, serving one of
    ``gpus`` (UUIDs): (pipe directory, pids), in pipe directory order."""
    found: dict[str, list[int]] = {}
    for pid, pipe in control_daemons():
        if not pipe.startswith(root.rstrip(os.sep) + os.sep) or pipe in keep:
            continue
        env = daemon_environment(pid)
        if env.get(OWNER_ENV) != OWNER or not gpus & set(env.get(VISIBLE_ENV, "").split(",")):
            continue
        found.setdefault(pipe, []).append(pid)
    return sorted(found.items())
