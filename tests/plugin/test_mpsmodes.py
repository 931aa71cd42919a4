"""The compute-mode records under the MPS root (a host directory, not trusted): what is read,
what is written, and that every GPU that can be restored is, whatever one record holds."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from nvplugin.nodesession import NodeSession, open_node
from nvplugin.plugin.mpsmodes import COMPUTE_MODES_DIR, ModeRecords
from tests.support.waiting import WAIT_S

SECRET = "secret-of-the-host\n"


@pytest.fixture
def node() -> Iterator[NodeSession]:
    with open_node("dgx-1") as session:
        yield session


def _in_thread(work: object) -> list[object]:
    """``work()`` in a daemon thread: a read that blocks fails the test, not the run."""
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(work()), daemon=True)  # type: ignore[operator]
    worker.start()
    worker.join(WAIT_S)
    return results


def test_bad_records_are_ignored_and_every_other_gpu_is_restored(node: NodeSession) -> None:
    """Before: a record holding garbage ended serve with a KeyError and restored no
    GPU; a linked record leaked its target; a FIFO record hung SIGTERM."""
    root = tempfile.mkdtemp()
    records = ModeRecords(root, node.nvml)
    gpus = node.topology.gpus[:4]
    for gpu in gpus:
        assert records.claim(gpu) == "DEFAULT"
    directory = os.path.join(root, COMPUTE_MODES_DIR)
    outside = os.path.join(tempfile.mkdtemp(), "secret")
    with open(outside, "w") as f:
        f.write(SECRET)
    with open(os.path.join(directory, gpus[1].uuid), "wb") as f:
        f.write(b"\x00garbage-not-a-mode\n")
    os.unlink(os.path.join(directory, gpus[2].uuid))
    os.symlink(outside, os.path.join(directory, gpus[2].uuid))
    os.unlink(os.path.join(directory, gpus[3].uuid))
    os.mkfifo(os.path.join(directory, gpus[3].uuid))
    with capture_logs() as logs:
        found = _in_thread(records.recorded)
    assert found == [{gpus[0].uuid: "DEFAULT"}]
    assert len([e for e in logs if e["event"] == "compute-mode record ignored"]) == 3
    assert "garbage-not" not in str(logs) and "secret-of" not in str(logs)
    assert records.restore(gpus[0], "DEFAULT")
    assert node.nvml.compute_mode(gpus[0].index) == "DEFAULT"


def test_a_linked_record_is_replaced_never_followed(node: NodeSession) -> None:
    """Before: a record linked out of the root made serve create a file there."""
    root = tempfile.mkdtemp()
    directory = os.path.join(root, COMPUTE_MODES_DIR)
    os.makedirs(directory)
    target = os.path.join(tempfile.mkdtemp(), "created-by-the-plugin")
    gpu = node.topology.gpus[0]
    os.symlink(target, os.path.join(directory, gpu.uuid))
    assert ModeRecords(root, node.nvml).claim(gpu) == "DEFAULT"
    assert not os.path.lexists(target)
    record = os.path.join(directory, gpu.uuid)
    assert stat.S_ISREG(os.lstat(record).st_mode)
    assert stat.S_IMODE(os.lstat(record).st_mode) == 0o644


def test_directories_have_their_modes_under_umask_000(node: NodeSession) -> None:
    """Before: under umask 000 the directories were 0777."""
    base = tempfile.mkdtemp()
    root = os.path.join(base, "mps", "root")
    old = os.umask(0)
    try:
        ModeRecords(root, node.nvml).claim(node.topology.gpus[0])
    finally:
        os.umask(old)
    for path in (os.path.join(base, "mps"), root, os.path.join(root, COMPUTE_MODES_DIR)):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, path
