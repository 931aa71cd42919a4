"""When the plugin exits, and what it leaves behind: a socket it cannot serve again ends it with
a message and exit 1 (Kubernetes restarts it; a zombie would advertise nothing); a SIGKILLed
plugin's simulated sysfs tree is swept by the next one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time

from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.nodesession import open_node
from nvplugin.sim.tree import remove_stale_sysfs_trees
from tests.support.serve import Serve, new_dir
from tests.support.waiting import WAIT_S

GPU = "nvidia.com/gpu"


def test_a_socket_that_cannot_be_served_again_exits_1_with_the_reason() -> None:
    async def body() -> None:
        directory = new_dir()
        async with FakeKubelet(directory) as kubelet:
            serve = Serve(directory, "--simulate", "workstation-4gpu", "--socket-give-up-s", "1")
            try:
                await kubelet.wait_registered(GPU, WAIT_S)
                path = os.path.join(directory, "nvplugin-gpu.sock")
                # Something else takes the path (atomically, so the plugin cannot win a race).
                blocker = os.path.join(directory, "blocker")
                with open(blocker, "w") as handle:
                    handle.write("not a socket\n")
                os.replace(blocker, path)
                started = time.monotonic()
                code = await asyncio.to_thread(serve.wait, 20)
                took = time.monotonic() - started
            finally:
                serve.kill()
        assert code == 1
        text = serve.text()
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"error: cannot serve {path} again: "), text[-2000:]
        assert "exists and is not a socket" in last and "exiting so that" in last
        assert "Traceback" not in text
        assert took < 15
        with open(path) as handle:
            assert handle.read() == "not a socket\n"  # what it could not replace, it left alone

    asyncio.run(asyncio.wait_for(body(), 60))


def test_stale_sysfs_trees_of_dead_owners_are_removed() -> None:
    parent = tempfile.mkdtemp()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    names = {
        f"nvplugin-sysfs-{dead_pid}-abc": False,  # owner gone: removed
        f"nvplugin-sysfs-{os.getpid()}-def": True,  # owner alive: kept
        "nvplugin-sysfs-0lu_8vr8": True,  # an older release's name, owner unknown: kept
        f"other-{dead_pid}-x": True,  # not ours
    }
    for name in names:
        os.makedirs(os.path.join(parent, name, "bus"))
    assert remove_stale_sysfs_trees(parent) == [f"nvplugin-sysfs-{dead_pid}-abc"]
    assert {n: os.path.exists(os.path.join(parent, n)) for n in names} == names


def test_a_new_simulation_sweeps_trees_left_by_a_killed_one() -> None:
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = os.path.join(shm, f"nvplugin-sysfs-{int(dead.stdout)}-stale")
    os.makedirs(os.path.join(stale, "bus/pci/devices"))
    with open_node("workstation-4gpu") as node:
        assert node.sim is not None
        assert os.path.basename(node.sim.sysfs_root).startswith(f"nvplugin-sysfs-{os.getpid()}-")
        assert not os.path.exists(stale)
        root = node.sim.sysfs_root
    assert not os.path.exists(root)
