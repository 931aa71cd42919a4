"""The MPS control program and its daemons as processes: where ``nvidia-cuda-mps-control`` is,
its commands (the program's client, run as a child process), the daemons found in ``/proc`` and
what their environment says, and how they are ended.

A control command is ``nvidia-cuda-mps-control`` with the command on its standard input, run as a
child process off the event loop, bounded in time (then killed) and in output
(:data:`MAX_OUTPUT`). A daemon is found in ``/proc`` -- the process running
``nvidia-cuda-mps-control -d`` whose environment names the pipe directory -- since it daemonizes
away from its parent; nvplugin's own say so in their environment (:data:`OWNER_ENV`), which is
how a later plugin tells them from another's. ``/proc`` reads are blocking: callers on the event
loop run them on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence

from nvplugin.api.nvidia import MPS_PIPE_ENV
from nvplugin.errors import NvpluginError
from nvplugin.log import get_logger

CONTROL = "nvidia-cuda-mps-control"
CONTROL_DIRS = ("usr/bin", "bin", "usr/local/bin")
"""Where a driver root holds ``nvidia-cuda-mps-control`` (relative to it)."""
MAX_OUTPUT = 64 * 1024
"""The most output a control command may print before it is killed."""
CHECK_COMMAND = "get_server_list"
OWNER_ENV = "MPS_CONTROL_OWNER"
"""Set to :data:`OWNER` in the environment of the daemons nvplugin starts: a later plugin adopts
or stops only those (not NVIDIA's daemon, say, on the same pipe directory)."""
OWNER = "nvplugin"

_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_MIB_PER_UNIT = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


class MpsError(NvpluginError):
    """A control daemon could not be started, set up or reached (it is started again)."""


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


def memory_mib(answer: str) -> float | None:
    """A memory limit as the control daemon prints it (``4040M``, ``3G``; ``0``: none) in MiB;
    None when it is not one (a bare number other than 0 has no unit to read it by)."""
    match = _MEMORY.fullmatch(answer.strip())
    if match is None:
        return None
    value, unit = float(match.group(1)), match.group(2).upper()
    if not unit:
        return 0.0 if value == 0 else None
    return value * _MIB_PER_UNIT[unit]


# --- control commands -----------------------------------------------------------------------------


async def run_control(
    control: str, env: dict[str, str], args: Sequence[str], stdin: str, timeout: float
) -> str:
    """Run ``control ARGS`` with ``stdin``; its output. MpsError when it fails, does not end
    within ``timeout`` (it is killed) or cannot run."""
    what = " ".join(args) or stdin.strip()
    try:
        proc = await asyncio.create_subprocess_exec(
            control,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a signal to the plugin's group is not the daemon's
        )
    except OSError as exc:
        raise MpsError(f"cannot run {control}: {exc.strerror or exc}") from None
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
    found = []
    for name in sorted(os.listdir(proc), key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if not any(os.path.basename(arg) == CONTROL.encode() for arg in argv):
            continue
        if b"-d" not in argv and b"-f" not in argv:
            continue
        pipe = daemon_environment(int(name), proc).get(MPS_PIPE_ENV)
        if pipe is not None and alive(int(name)):
            found.append((int(name), pipe))
    return found


def daemon_environment(pid: int, proc: str = "/proc") -> dict[str, str]:
    """The environment process ``pid`` started with (empty when it cannot be read: gone, or not
    ours to read)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as environ:
            entries = environ.read().split(b"\0")
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in entries if entry)
    return {name: value for name, _, value in pairs}


def alive(pid: int) -> bool:
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


async def end_daemons(
    pids: Sequence[int], quit: Callable[[], Awaitable[object]] | None, timeout_s: float
) -> None:
    """End the daemons ``pids`` (of one pipe directory): ``quit`` (their ``quit`` command;
    SIGTERM when None, without the program to send it), then SIGKILL what is left after
    ``timeout_s``; returns once they are gone (or another ``timeout_s`` passed)."""
    if not pids:
        return
    try:
        if quit is not None:
            await quit()
        else:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
    except MpsError:
        pass  # no answer: nothing to wait for
    else:
        await _gone(pids, timeout_s)
    for pid in pids:
        if alive(pid):
            get_logger("nvplugin.mps").warning(
                "MPS control daemon did not quit; killing it", pid=pid
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    await _gone(pids, timeout_s)


async def _gone(pids: Sequence[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def open_pidfd(pid: int, exited: asyncio.Future[None]) -> int | None:
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


def close_pidfd(fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(Exception):
        asyncio.get_running_loop().remove_reader(fd)
    os.close(fd)
