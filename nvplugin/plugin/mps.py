"""The MPS control daemon of each resource shared through MPS: started, set up, watched, restarted
and stopped by the plugin itself -- no second DaemonSet, no node label.

For each MPS resource (:class:`DaemonSpec`), :class:`MpsDaemon`:

- claims its GPUs: compute mode EXCLUSIVE_PROCESS through NVML, the mode it found recorded in
  ``<root>/compute-modes/<GPU UUID>`` first, so that it is restored when MPS stops serving the GPU
  -- also by the next plugin if this one was killed before it could restore it;
- quits a daemon of a previous plugin still running on the resource's pipe directory, then runs
  ``nvidia-cuda-mps-control -d`` (from the driver root) with ``CUDA_MPS_PIPE_DIRECTORY`` and
  ``CUDA_MPS_LOG_DIRECTORY`` under ``<root>/<resource>/`` and ``CUDA_VISIBLE_DEVICES`` its GPUs'
  UUIDs in index order (so ordinal n in a command is the resource's n-th GPU);
- sets each GPU's default pinned device memory limit and the default active thread percentage
  to one share (:mod:`nvplugin.rm.mps`), by its control commands -- the daemon is *ready* when
  they are answered, and only then is the resource advertised;
- watches it: its exit (a pidfd: at once) and its answer to ``get_server_list`` every
  ``check_s``. When it dies or does not answer within ``command_timeout_s``, the resource's
  devices are Unhealthy at once, what is left of it is killed, and it is started again after a
  backoff (``backoff_s`` doubling to ``backoff_max_s``; back to the start once it stayed up that
  long); ready again, the devices are Healthy again;
- stops: ``quit``, then SIGKILL if it is still there after ``stop_timeout_s``; compute modes
  restored. No process is left behind.

A control command is the real program's client: ``nvidia-cuda-mps-control`` with the command on
its standard input, run as a child process off the event loop, bounded in time
(``command_timeout_s``, then killed) and in output (:data:`MAX_OUTPUT`). The daemon process is
found in ``/proc`` -- the process running ``nvidia-cuda-mps-control -d`` whose environment names
the resource's pipe directory -- since it daemonizes away from its parent. NVML calls and ``/proc``
reads run on worker threads.

:class:`MpsDaemons` keeps the daemons across a re-serve (SIGHUP): a daemon whose spec is unchanged
keeps running -- its clients keep their server -- and one no longer wanted is stopped before new
ones start (a GPU may move from one MPS resource to another).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nvplugin.api.nvidia import MPS_CONTAINER_ROOT, MPS_LOG_ENV, MPS_PIPE_ENV, MPS_SHM_PATH
from nvplugin.backoff import Backoff, Retry
from nvplugin.config import Config
from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu
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

CONTROL = "nvidia-cuda-mps-control"
CONTROL_DIRS = ("usr/bin", "bin", "usr/local/bin")
"""Where a driver root holds ``nvidia-cuda-mps-control`` (relative to it)."""
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
COMPUTE_MODES_DIR = "compute-modes"
"""``<root>/compute-modes/<GPU UUID>``: the compute mode a GPU had before MPS claimed it."""
MAX_OUTPUT = 64 * 1024
"""The most output a control command may print before it is killed."""
CHECK_COMMAND = "get_server_list"


class MpsError(NvpluginError):
    """A control daemon could not be started, set up or reached (it is started again)."""


class ComputeModes(Protocol):
    """The part of :class:`nvplugin.node.nvml.Nvml` MPS needs."""

    def compute_mode(self, index: int) -> str: ...

    def set_compute_mode(self, index: int, mode: str) -> None: ...


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
        """The daemon's and its clients' environment: ``inherited`` plus the MPS directories and
        the resource's GPUs; the program's own directory first on PATH (the MPS server beside
        it in a driver root is found there)."""
        path = inherited.get("PATH", os.defpath)
        return {
            **inherited,
            "PATH": f"{os.path.dirname(self.control)}{os.pathsep}{path}",
            MPS_PIPE_ENV: self.pipe_dir,
            MPS_LOG_ENV: self.log_dir,
            "CUDA_VISIBLE_DEVICES": ",".join(gpu.uuid for gpu in self.gpus),
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


def find_control(driver_root: str | None) -> str:
    """``nvidia-cuda-mps-control`` under the driver root (where this process sees it), else on
    PATH (the NVIDIA container runtime puts it in ``/usr/bin`` with the compute capability);
    NvpluginError saying where it looked."""
    roots = [driver_root] if driver_root else []
    for root in roots:
        for directory in CONTROL_DIRS:
            candidate = os.path.join(root, directory, CONTROL)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which(CONTROL)
    if found is not None:
        return found
    where = f"under the driver root {driver_root} ({', '.join(CONTROL_DIRS)}) nor " if roots else ""
    raise NvpluginError(
        f"sharing.mps: {CONTROL} is not {where}on PATH: MPS needs the NVIDIA driver's MPS "
        "programs (mount the host's driver root, flags.nvidiaDriverRoot, or run the plugin with "
        "the NVIDIA container runtime and NVIDIA_DRIVER_CAPABILITIES including compute)"
    )


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


# --- one daemon -----------------------------------------------------------------------------------

Ready = Callable[[str | None], None]
"""Told the daemon's state: None when it is ready, else why it is not."""


class MpsDaemon:
    """One resource's control daemon (see the module docstring). :meth:`start` runs it from now
    on (a task); :meth:`stop` ends it. ``on_state`` (set with :meth:`follow`) hears every change."""

    def __init__(
        self,
        spec: DaemonSpec,
        nvml: ComputeModes,
        inherited: dict[str, str],
        timing: Timing = Timing(),
    ) -> None:
        self.spec = spec
        self._nvml = nvml
        self._env = spec.environment(inherited)
        self._timing = timing
        self._log = get_logger("nvplugin.mps", resource=spec.resource)
        self._tasks = self._lifetime()  # the watch, from start to stop
        self._state: str | None = "starting"
        self._followers: list[Ready] = []
        self._pid: int | None = None
        self._claimed: dict[int, str] = {}  # GPU index -> the mode to restore
        self.starts = 0

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
        """Claim the GPUs, replace any daemon left on the pipe directory, start and set up."""
        spec = self.spec
        await asyncio.to_thread(self._prepare)
        await self._quit()  # a daemon of a previous plugin (or one that stopped answering)
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
            for directory in (spec.pipe_dir, spec.log_dir, shm_dir(spec.root), self._modes_dir()):
                os.makedirs(directory, mode=0o755, exist_ok=True)
            for gpu in spec.gpus:
                if gpu.index not in self._claimed:
                    self._claimed[gpu.index] = self._record(gpu)
                if self._nvml.compute_mode(gpu.index) != EXCLUSIVE_PROCESS:
                    self._nvml.set_compute_mode(gpu.index, EXCLUSIVE_PROCESS)
        except OSError as exc:
            raise MpsError(f"cannot prepare {exc.filename}: {exc.strerror or exc}") from None
        except NvpluginError as exc:
            raise MpsError(str(exc)) from None

    def _modes_dir(self) -> str:
        return os.path.join(self.spec.root, COMPUTE_MODES_DIR)

    def _record(self, gpu: Gpu) -> str:
        """The mode to restore ``gpu`` to: as recorded (a plugin before this one claimed it and
        did not restore it), else its mode now, recorded."""
        path = Path(self._modes_dir(), gpu.uuid)
        with contextlib.suppress(OSError):
            recorded = path.read_text().strip()
            if recorded:
                return recorded
        mode = self._nvml.compute_mode(gpu.index)
        path.write_text(mode + "\n")
        return mode

    def _release(self) -> None:
        """Each claimed GPU back in its recorded mode; the record removed once restored."""
        for gpu in self.spec.gpus:
            mode = self._claimed.pop(gpu.index, None)
            if mode is None:
                continue
            try:
                if mode != EXCLUSIVE_PROCESS:
                    self._nvml.set_compute_mode(gpu.index, mode)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._modes_dir(), gpu.uuid))
            except (OSError, NvpluginError) as exc:  # the record stays: the next plugin restores
                self._log.error("cannot restore the compute mode", gpu=gpu.index, error=str(exc))
            else:
                self._log.info("compute mode restored", gpu=gpu.index, mode=mode)

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
        pidfd = _open_pidfd(pid, exited)
        try:
            while not exited.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._timing.check_s):
                        await asyncio.shield(exited)
                if exited.done() or not _alive(pid):
                    break
                try:
                    await self.command(CHECK_COMMAND)
                except MpsError as exc:
                    return f"control daemon {pid} does not answer: {exc}"
            return f"control daemon {pid} exited"
        finally:
            _close_pidfd(pidfd)
            self._pid = None if not _alive(pid) else pid

    async def _quit(self) -> None:
        """End every daemon on the pipe directory: ``quit``, then SIGKILL what is left."""
        pids = await asyncio.to_thread(daemon_pids, self.spec.pipe_dir)
        if not pids:
            self._pid = None
            return
        try:
            await self.command("quit", self._timing.stop_timeout_s)
        except MpsError:
            pass  # no answer: nothing to wait for
        else:
            deadline = time.monotonic() + self._timing.stop_timeout_s
            while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        for pid in pids:
            if _alive(pid):
                self._log.warning("MPS control daemon did not quit; killing it", pid=pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + self._timing.stop_timeout_s
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._pid = None

    # --- control commands ---

    async def command(self, text: str, timeout: float | None = None) -> str:
        """Send one control command; its answer. MpsError when no daemon answers in time."""
        return await self._run_control([], text + "\n", timeout or self._timing.command_timeout_s)

    async def _run_control(self, args: Sequence[str], stdin: str, timeout: float) -> str:
        what = " ".join(args) or stdin.strip()
        try:
            proc = await asyncio.create_subprocess_exec(
                self.spec.control,
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # a signal to the plugin's group is not the daemon's
            )
        except OSError as exc:
            raise MpsError(f"cannot run {self.spec.control}: {exc.strerror or exc}") from None
        assert proc.stdin is not None and proc.stdout is not None
        output = asyncio.create_task(_bounded(proc.stdout))
        try:
            async with asyncio.timeout(timeout):
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(stdin.encode())
                    await proc.stdin.drain()
                    proc.stdin.close()
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            output.cancel()
            raise MpsError(f"{what!r}: no answer within {timeout:g} s") from None
        except BaseException:  # cancelled (stopping): no command outlives its caller
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            output.cancel()
            raise
        finally:
            if not output.done():
                # The daemon it started may hold the pipe: take what came, do not wait for EOF.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(output), 0.2)
                output.cancel()
        text = output.result() if output.done() and not output.cancelled() else b""
        answer = text.decode(errors="replace")
        if proc.returncode != 0:
            raise MpsError(f"{what!r} failed (exit {proc.returncode}): {answer.strip()[:200]}")
        return answer


async def _bounded(stream: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < MAX_OUTPUT:
        chunk = await stream.read(MAX_OUTPUT - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


# --- processes ------------------------------------------------------------------------------------


def daemon_pids(pipe: str) -> list[int]:
    """The control daemons running on pipe directory ``pipe``, in pid order."""
    return [pid for pid, directory in control_daemons() if directory == pipe]


def control_daemons(proc: str = "/proc") -> list[tuple[int, str]]:
    """Every MPS control daemon this process can see, with its pipe directory, in pid order:
    processes whose command line runs ``nvidia-cuda-mps-control -d`` (or ``-f``) and whose
    environment names ``CUDA_MPS_PIPE_DIRECTORY`` (a daemon without it uses NVIDIA's default
    ``/tmp/nvidia-mps``; nvplugin always sets it)."""
    prefix = f"{MPS_PIPE_ENV}=".encode()
    found = []
    for name in sorted(os.listdir(proc), key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
            if not any(os.path.basename(arg) == CONTROL.encode() for arg in argv):
                continue
            if b"-d" not in argv and b"-f" not in argv:
                continue
            with open(f"{proc}/{name}/environ", "rb") as environ:
                pipes = [v for v in environ.read().split(b"\0") if v.startswith(prefix)]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if pipes and _alive(int(name)):
            found.append((int(name), pipes[0][len(prefix) :].decode(errors="replace")))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # ours to reap when we are its parent (PID 1, subreaper)
        return False
    return True


def _open_pidfd(pid: int, exited: asyncio.Future[None]) -> int | None:
    """A pidfd for ``pid`` that resolves ``exited`` when it ends; None where pidfds are missing
    (the periodic check then notices, within ``check_s``)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None

    def ended() -> None:
        if not exited.done():
            exited.set_result(None)

    asyncio.get_running_loop().add_reader(fd, ended)
    return fd


def _close_pidfd(fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(Exception):
        asyncio.get_running_loop().remove_reader(fd)
    os.close(fd)


# --- the daemons of a config ----------------------------------------------------------------------


@dataclass
class MpsDaemons:
    """The running daemons, by resource, kept across re-serves while their spec stays."""

    nvml: ComputeModes
    inherited: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    timing: Timing = Timing()
    running: dict[str, MpsDaemon] = field(default_factory=dict)

    async def serve(self, specs: Sequence[DaemonSpec]) -> dict[str, MpsDaemon]:
        """The daemons for ``specs``, by resource: running ones whose spec is unchanged, new ones
        (started) for the rest; the daemons no longer wanted stopped first."""
        wanted = {spec.resource: spec for spec in specs}
        for name, daemon in list(self.running.items()):
            daemon.unfollow_all()
            if wanted.get(name) != daemon.spec:
                del self.running[name]
                await daemon.stop()
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
        """Stop every daemon, together (shutdown)."""
        daemons, self.running = list(self.running.values()), {}
        await asyncio.gather(*(daemon.stop() for daemon in daemons))
