"""MIG on the node: profile names and tables, node-file layouts, the simulated NVML's MIG calls,
discovery (round trip node file == discovered node) and the capability minors."""

from __future__ import annotations

import os
import queue
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nvplugin.errors import InputError
from nvplugin.node import mig
from nvplugin.node import nvml as nvml_module
from nvplugin.node.health import HealthMonitor, HealthSettings, mig_health
from nvplugin.node.mig import (
    MIG_MODELS,
    MigLayoutError,
    MigModel,
    MigProfile,
    caps_minor,
    lay_out,
    memory_gb,
    mig_minors_text,
    mig_model,
    parse_mig_minors,
    profile_name,
)
from nvplugin.node.model import MigCaps
from nvplugin.node.nvml import Nvml
from nvplugin.nodefile.reader import load_node, parse_node
from nvplugin.nodesession import open_node
from nvplugin.sim.fakenvml import SimulatedNvml
from tests.support.waiting import WAIT_S

pynvml = nvml_module.bindings()


def node_text(gpus: list[str], name: str = "mig-node") -> str:
    """A node file of ``gpus`` (flow mappings), PCIe-switched pairwise (PIX)."""
    n = len(gpus)
    header = "      " + "  ".join(f"GPU{j}" for j in range(n))
    rows = [f"  GPU{i}  " + "  ".join("X" if i == j else "PIX" for j in range(n)) for i in range(n)]
    entries = "\n".join(f"  - {gpu}" for gpu in gpus)
    return f"version: v1\nname: {name}\ngpus:\n{entries}\nlinks: |2\n{header}\n" + "\n".join(rows)


# --- names ---------------------------------------------------------------------------------------


def test_profile_enums_are_nvmls() -> None:
    for name in dir(mig):
        if name.startswith("GI_PROFILE_"):
            assert getattr(mig, name) == getattr(pynvml, f"NVML_GPU_INSTANCE_{name[3:]}"), name


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.label)
def test_every_tabled_profile_is_named_as_nvidia_names_it(model: MigModel) -> None:
    """The table's names follow from its slices and memory by go-nvlib's rule."""
    for p in model.profiles:
        total = model.memory_mib << 20
        assert (
            profile_name(p.gi_profile, p.compute_slices, p.compute_slices, p.memory_mib, total)
            == p.name
        )
        assert p.compute_slices <= model.compute_slices
        assert all(s + p.memory_slices <= model.memory_slices for s in p.placements)


def test_name_rule_details() -> None:
    a100 = 40960 << 20
    assert profile_name(mig.GI_PROFILE_3_SLICE, 3, 1, 20096, a100) == "1c.3g.20gb"
    assert profile_name(mig.GI_PROFILE_1_SLICE_REV1, 1, 1, 4864, a100) == "1g.5gb+me"
    assert profile_name(mig.GI_PROFILE_1_SLICE_NO_ME, 1, 1, 4864, a100) == "1g.5gb-me"
    assert profile_name(mig.GI_PROFILE_1_SLICE_ALL_ME, 1, 1, 4864, a100) == "1g.5gb+me.all"
    assert profile_name(mig.GI_PROFILE_2_SLICE_GFX, 2, 2, 9856, a100) == "2g.10gb+gfx"
    # B200: 1/8 of 180 GiB is 22.5: Go rounds half away from zero (Python's round would say 22)
    assert memory_gb(183359 << 20, 22784) == 23
    assert memory_gb(143771 << 20, 71424) == 71  # H200 3g: 4/8 of 141 = 70.5


def test_models_are_found_by_nvml_name_in_any_case() -> None:
    assert mig_model("NVIDIA A100-SXM4-40GB") is not None
    assert mig_model("nvidia a100-sxm4-40gb") == mig_model("NVIDIA A100-PCIE-40GB")
    assert mig_model("NVIDIA H100 80GB HBM3") is not None
    assert mig_model("Tesla T4") is None and mig_model("Tesla V100-SXM2-16GB") is None


# --- layouts -------------------------------------------------------------------------------------

A100 = mig_model("NVIDIA A100-SXM4-40GB")
assert A100 is not None


def test_layout_places_largest_first_and_backtracks() -> None:
    instances = lay_out(A100, ["1g.5gb", "3g.20gb", "1g.5gb", "1g.5gb", "1g.5gb"])
    # 3g.20gb at 0 would leave 1g.5gb only slices 4-6 (it may not start at 7): it moves to 4.
    assert [(i.profile.name, i.placement) for i in instances] == [
        ("1g.5gb", (0, 1)),
        ("3g.20gb", (4, 4)),
        ("1g.5gb", (1, 1)),
        ("1g.5gb", (2, 1)),
        ("1g.5gb", (3, 1)),
    ]
    ids = [i.gpu_instance for i in instances]
    assert len(set(ids)) == len(ids) and all(0 <= i < mig.MAX_GPU_INSTANCES for i in ids)


def test_every_placement_has_its_own_gpu_instance_id() -> None:
    seen = {}
    for profile in A100.profiles:
        for start in profile.placements:
            key = (start, profile.memory_slices)
            seen[key] = mig.gpu_instance_id(A100.memory_slices, start, profile.memory_slices)
    assert len(set(seen.values())) == len(seen)
    assert seen[(0, 8)] == 0 and max(seen.values()) <= 14


@pytest.mark.parametrize(
    ("profiles", "message", "at"),
    [
        (["1g.5gb", "1g.6gb"], "A100 40GB has no MIG profile '1g.6gb' (profiles: 1g.5gb,", 1),
        (["1g.10gb"] * 5, "5 x 1g.10gb: A100 40GB fits at most 4", None),
        (["3g.20gb", "4g.20gb", "1g.5gb"], "need 8 compute slices; A100 40GB has 7", None),
        (["3g.20gb", "3g.20gb", "1g.5gb"], "3g.20gb x2, 1g.5gb need 9 memory slices", None),
        (["7g.40gb", "1g.5gb"], "need 8 compute slices", None),
    ],
)
def test_layout_errors_name_the_profiles(profiles: list[str], message: str, at: int | None) -> None:
    with pytest.raises(MigLayoutError, match=re.escape(message)) as caught:
        lay_out(A100, profiles)
    assert caught.value.at == at


def test_one_media_extension_instance_per_gpu() -> None:
    a30 = mig_model("NVIDIA A30")
    assert a30 is not None
    lay_out(a30, ["1g.6gb+me", "1g.6gb", "2g.12gb"])
    with pytest.raises(MigLayoutError, match=r"2 profiles with media extensions \(\+me\)"):
        lay_out(a30, ["1g.6gb+me", "2g.12gb+me"])


def test_slices_that_fit_without_a_placement_are_refused() -> None:
    """No tabled model has such a case (their placements never bind beyond the slice counts);
    a model whose 2-slice profile may only start at 0 shows the check."""
    model = MigModel(
        "toy",
        ("toy",),
        4096,
        4,
        4,
        (
            MigProfile("1g.1gb", mig.GI_PROFILE_1_SLICE, 1, 1, 1, 1024, 4, (0, 1, 2, 3)),
            MigProfile("2g.2gb", mig.GI_PROFILE_2_SLICE, 2, 2, 2, 2048, 2, (0,)),
        ),
    )
    lay_out(model, ["2g.2gb", "1g.1gb", "1g.1gb"])
    with pytest.raises(MigLayoutError, match="no placement holds them all"):
        lay_out(model, ["2g.2gb", "2g.2gb"])


# --- capability minors ---------------------------------------------------------------------------


def test_caps_minors_follow_the_drivers_numbering() -> None:
    # Values from the driver's mig-minors file (NVIDIA's docs and tools quote them).
    assert caps_minor(0, 0) == 3
    assert caps_minor(0, 0, 0) == 4
    assert caps_minor(0, 0, 2) == 6
    assert caps_minor(3, 3, 3) == 439
    assert caps_minor(6, 11, 7) == 920
    assert caps_minor(31, 14, 7) == 4322
    assert mig.caps_device(66) == "/dev/nvidia-caps/nvidia-cap66"


def test_mig_minors_file_round_trips_and_skips_other_lines() -> None:
    text = mig_minors_text()
    assert text.startswith("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n")
    assert text.endswith("gpu31/gi14/ci7/access 4322\n")
    table = parse_mig_minors(text + "something new 7\n\n")
    assert len(table) == 32 * 15 * 9
    assert table[(3, 3, 3)] == 439 and table[(0, 0, None)] == 3


# --- node files ----------------------------------------------------------------------------------


def test_mig_key_present_absent_and_empty() -> None:
    spec = parse_node(
        node_text(
            [
                "{name: NVIDIA A100-SXM4-40GB, mig: [3g.20gb, 1g.5gb]}",
                "{name: NVIDIA A100-SXM4-40GB, mig: []}",
                "{name: NVIDIA A100-SXM4-40GB}",
            ]
        ),
        "test",
    )
    on, empty, off = spec.gpus
    assert on.mig is not None and [i.profile.name for i in on.mig] == ["3g.20gb", "1g.5gb"]
    assert empty.mig == () and off.mig is None
    # memory_mib defaults to the model's when MIG is on (profile names depend on it)
    assert on.memory_mib == empty.memory_mib == 40960
    assert off.memory_mib == 16384


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        (
            "{name: Tesla T4, mig: [1g.5gb]}",
            r"gpus\[1\]\.mig: GPU1 \(Tesla T4\) has no MIG profile table \(MIG models: A30, "
            r"A100 40GB",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, mig: [1g.5gb, 1g.10gb, 2g.20gb]}",
            r"gpus\[1\]\.mig\[2\]: GPU1: A100 40GB has no MIG profile '2g\.20gb'",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, mig: [4g.20gb, 4g.20gb]}",
            r"gpus\[1\]\.mig: GPU1: 2 x 4g\.20gb: A100 40GB fits at most 1",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, mig: [3g.20gb, 3g.20gb, 1g.5gb]}",
            r"gpus\[1\]\.mig: GPU1: 3g\.20gb x2, 1g\.5gb need 9 memory slices; A100 40GB has 8",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, mig: 1g.5gb}",
            r"gpus\[1\]\.mig: must be a list of MIG profile names .* \(got '1g\.5gb'\)",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, mig: [1g.5gb, 7]}",
            r"gpus\[1\]\.mig\[1\]: must be a non-empty string \(got 7\)",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, mig: [" + ", ".join(["1g.5gb"] * 9) + "]}",
            r"gpus\[1\]\.mig: GPU1 \(A100 40GB\) holds at most 7 MIG devices \(got 9\)",
        ),
        (
            "{name: NVIDIA A100-SXM4-40GB, memory_mib: 81920, mig: [1g.5gb]}",
            r"gpus\[1\]\.memory_mib: GPU1 is a A100 40GB with MIG: its memory is 40960 MiB",
        ),
    ],
)
def test_bad_mig_layouts_name_gpu_and_profile(gpu: str, message: str) -> None:
    text = node_text(["{name: NVIDIA A100-SXM4-40GB, mig: []}", gpu])
    with pytest.raises(InputError, match=r"^test: " + message):
        parse_node(text, "test")


def test_a_huge_profile_name_is_shown_shortened() -> None:
    text = node_text(["{name: NVIDIA A100-SXM4-40GB, mig: [" + "x" * 5000 + "]}"])
    with pytest.raises(InputError) as caught:
        parse_node(text, "test")
    assert len(str(caught.value)) < 600 and "(5002 characters)" in str(caught.value)


# --- simulated NVML and discovery ----------------------------------------------------------------


def test_builtin_mig_node_round_trips_through_nvml() -> None:
    spec = load_node("dgx-a100-mig")
    with open_node("dgx-a100-mig") as node:
        topology = node.topology
        assert topology == spec.topology()
        calls = node.sim.calls if node.sim else {}
    gpus = topology.gpus
    assert [g.mig_enabled for g in gpus] == [True] * 6 + [False] * 2
    assert [len(g.mig_devices) for g in gpus] == [7, 7, 4, 2, 4, 0, 0, 0]
    assert [m.profile for m in gpus[4].mig_devices] == [
        "2g.10gb",
        "2g.10gb",
        "1g.10gb",
        "1g.5gb+me",
    ]
    assert all(m.uuid.startswith("MIG-") for m in topology.mig_devices)
    assert len({m.uuid for m in topology.mig_devices}) == 24
    first = gpus[0].mig_devices[0]
    assert (first.label, first.gpu_instance, first.compute_instance) == ("0:0", 7, 0)
    assert first.caps == MigCaps(caps_minor(0, 7), caps_minor(0, 7, 0)) == MigCaps(66, 67)
    # each MIG GPU's profile table is read once, not once per MIG device
    assert (
        calls["nvmlDeviceGetGpuInstanceProfileInfo"] == 5 * pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    )


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.label)
def test_every_profile_of_every_model_is_discovered_by_name(model: MigModel) -> None:
    """One GPU per profile, each with that single instance: discovery names each from NVML's
    answers (slices, memory, profile enum) exactly as the table does."""
    gpu_name = model.names[0]
    text = node_text([f"{{name: {gpu_name}, mig: [{p.name}]}}" for p in model.profiles])
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="nvplugin-test-mig-"), "node.yaml")
    try:
        path.write_text(text)
        with open_node(str(path)) as node:
            found = [g.mig_devices[0].profile for g in node.topology.gpus]
            assert node.topology == load_node(str(path)).topology()
    finally:
        path.unlink()
        path.parent.rmdir()
    assert found == [p.name for p in model.profiles]


def test_without_mig_minors_the_caps_are_unknown() -> None:
    spec = load_node("dgx-a100-mig")
    with SimulatedNvml(spec) as sim:
        os.remove(Path(sim.driver_root, mig.MIG_MINORS_PATH))
        with Nvml(sim.sysfs_root, sim.driver_root) as session:
            topology = session.discover("x")
    assert topology.mig_devices and all(m.caps is None for m in topology.mig_devices)


def test_gpus_without_mig_answer_not_supported_and_no_minors_file() -> None:
    spec = load_node("mixed-a100-t4")
    with SimulatedNvml(spec) as sim:
        assert not Path(sim.driver_root, mig.MIG_MINORS_PATH).exists()
        pynvml.nvmlInit()
        try:
            a100, t4 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 2))
            assert pynvml.nvmlDeviceGetMigMode(a100) == [0, 0]
            assert pynvml.nvmlDeviceGetMaxMigDeviceCount(a100) == 0
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetMigMode(t4)
            assert pynvml.nvmlDeviceGetMaxMigDeviceCount(t4) == 0
        finally:
            pynvml.nvmlShutdown()


def test_sim_mig_calls_answer_like_nvml() -> None:
    spec = load_node("dgx-a100-mig")
    with SimulatedNvml(spec):
        pynvml.nvmlInit()
        try:
            gpu2 = pynvml.nvmlDeviceGetHandleByIndex(2)
            assert pynvml.nvmlDeviceGetMigMode(gpu2) == [1, 1]
            assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu2) == 7
            device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 0)
            assert isinstance(device, pynvml.c_nvmlDevice_t)
            attributes = pynvml.nvmlDeviceGetAttributes(device)
            assert isinstance(attributes, pynvml.c_nvmlDeviceAttributes)
            assert (attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (3, 20096)
            gi = pynvml.nvmlDeviceGetGpuInstanceId(device)
            info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(gpu2, gi))
            assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
            profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                gpu2, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
            )
            assert (profile.id, profile.name, profile.instanceCount) == (20, "MIG 1g.5gb+me", 1)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 4)
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 7)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetGpuInstanceById(gpu2, 0)
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                    gpu2, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE
                )
            with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a GPU handle is no MIG device
                pynvml.nvmlDeviceGetGpuInstanceId(gpu2)
            with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a MIG handle is no GPU
                pynvml.nvmlDeviceGetPciInfo(device)
            gpu6 = pynvml.nvmlDeviceGetHandleByIndex(6)
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu6, 0)
        finally:
            pynvml.nvmlShutdown()


def test_mig_calls_of_a_lost_parent_fail_as_lost() -> None:
    builtin = Path(__file__).parents[2] / "nvplugin/nodefile/nodes/dgx-a100-mig.yaml"
    text = builtin.read_text().replace("events: []", "events: [{after_s: 10, gpu: 0, lost: true}]")
    now = [0.0]
    with SimulatedNvml(parse_node(text, "lost"), clock=lambda: now[0]):
        pynvml.nvmlInit()
        try:
            device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(
                pynvml.nvmlDeviceGetHandleByIndex(0), 0
            )
            assert pynvml.nvmlDeviceGetUUID(device).startswith("MIG-")
            now[0] = 10.0
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                pynvml.nvmlDeviceGetUUID(device)
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                pynvml.nvmlDeviceGetAttributes(device)
        finally:
            pynvml.nvmlShutdown()


# --- health -------------------------------------------------------------------------------------


def test_mig_devices_take_their_parents_health() -> None:
    topology = load_node("dgx-a100-mig").topology()
    health = {i: i != 2 for i in range(8)}
    mapped = mig_health(health, topology.mig_devices)
    assert list(mapped) == [m.uuid for m in topology.mig_devices]  # index order
    sick = {m.label for m in topology.mig_devices if not mapped[m.uuid]}
    assert sick == {"2:0", "2:1", "2:2", "2:3"}  # every MIG device of GPU2, no other
    assert all(mig_health({}, topology.mig_devices).values())


def test_an_xid_on_a_parent_turns_all_its_mig_devices_unhealthy_until_it_recovers() -> None:
    """End to end through the simulated NVML: events are the parent's; the per-GPU map the
    monitor publishes maps onto every MIG device of the parent, and back on recovery."""
    builtin = Path(__file__).parents[2] / "nvplugin/nodefile/nodes/dgx-a100-mig.yaml"
    # Scripted time counts from nvmlInit: the loss comes well after the Xid, so that a monitor
    # started late on a loaded machine still sees them one after the other (both due at its
    # first wait, the loss would be reported first), and GPU2's quiet period outlasts it.
    events = (
        "events: [{after_s: 0.1, gpu: 2, xid: 48}, {after_s: 1.0, gpu: 0, lost: true}, "
        "{after_s: 1.1, gpu: 0, recover: true}]"
    )
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="nvplugin-test-mig-"))
    path = folder / "node.yaml"
    path.write_text(builtin.read_text().replace("events: []", events))
    changes: queue.Queue[dict[int, bool]] = queue.Queue()
    seen: list[set[str]] = []
    try:
        with open_node(str(path)) as node:
            devices = node.topology.mig_devices
            labels = {m.uuid: m.label for m in devices}
            monitor = HealthMonitor(
                node.nvml, range(8), HealthSettings(recovery_quiet_s=2.0), changes.put
            )
            monitor.start()
            try:
                while not seen or seen[-1]:
                    mapped = mig_health(changes.get(timeout=10), devices)
                    seen.append({labels[uuid] for uuid, ok in mapped.items() if not ok})
            finally:
                monitor.stop()
    finally:
        path.unlink()
        folder.rmdir()
    gpu2 = {"2:0", "2:1", "2:2", "2:3"}
    gpu0 = {f"0:{i}" for i in range(7)}
    assert seen[:2] == [gpu2, gpu2 | gpu0]
    # then recovery per parent (the two may come back in one change): whole parents only
    assert all(state in (gpu2, gpu0, set()) for state in seen[2:])


# --- the driver's mig-minors file through the bounded reader --------------------------------------


def _discover_with_minors(make: Callable[[Path], None]) -> tuple[list[MigCaps | None], list[str]]:
    """Discover dgx-a100-mig with its driver-root ``mig-minors`` made by ``make``: the MIG
    devices' caps and the warnings logged. Discovery runs on a thread the test gives
    :data:`WAIT_S`: a read that blocks (a FIFO's open waits for a writer) fails the test instead
    of hanging it, and is let go."""
    spec = load_node("dgx-a100-mig")
    with SimulatedNvml(spec) as sim:
        path = Path(sim.driver_root, mig.MIG_MINORS_PATH)
        path.unlink()
        make(path)
        found: list[Any] = []
        with capture_logs() as logs:

            def discover() -> None:
                with Nvml(sim.sysfs_root, sim.driver_root) as session:
                    found.append(session.discover("x"))

            thread = threading.Thread(target=discover, daemon=True)
            thread.start()
            thread.join(WAIT_S)
            if thread.is_alive():  # let the blocked open go (a writer appears), then fail
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                thread.join(WAIT_S)
                raise AssertionError(f"discovery blocked on {path}")
        path.unlink()
    (topology,) = found
    warnings = [e["reason"] for e in logs if e["event"] == "MIG capability minors not read"]
    return [m.caps for m in topology.mig_devices], warnings


def _symlink_to(target: str) -> Callable[[Path], None]:
    return lambda path: path.symlink_to(target)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (os.mkfifo, "not a regular file"),
        (_symlink_to("/dev/zero"), "not a regular file"),
        (lambda path: os.truncate(_touch(path), 190 * 1024 * 1024), "larger than 1048576 bytes"),
        (lambda path: path.write_bytes(b"gpu0/gi1/access 12\n\xff\n"), "not UTF-8"),
    ],
    ids=["fifo", "dev-zero", "190-MB", "not-utf8"],
)
def test_a_mig_minors_file_that_is_not_the_drivers_is_refused_not_read(
    make: Callable[[Path], None], reason: str
) -> None:
    caps, warnings = _discover_with_minors(make)
    assert caps and all(c is None for c in caps)
    assert len(warnings) == 1 and reason in warnings[0], warnings
    assert "mig-minors" in warnings[0]


def _touch(path: Path) -> Path:
    path.touch()
    return path


def test_a_minor_of_thousands_of_digits_is_skipped_like_an_unknown_line() -> None:
    def write(path: Path) -> None:
        text = mig.mig_minors_text().replace("gpu0/gi7/access 66", "gpu0/gi7/access " + "6" * 5000)
        path.write_text(text)

    caps, warnings = _discover_with_minors(write)
    assert not warnings
    # The device on GPU 0's GPU instance 7 has no caps; every other one has.
    assert sum(c is None for c in caps) == 1 and len(caps) > 1
