"""What nvplugin knows about MIG (Multi-Instance GPU), kept in one place and free of NVML.

- **Profile names.** NVIDIA's plugin (go-nvlib) names a MIG device from its GPU instance profile
  and its attributes: ``[<C>c.]<G>g.<GB>gb[<suffix>]`` with G the GPU instance's compute slices,
  C the compute instance's (left out when equal to G), GB the instance's share of the GPU's
  memory rounded up to eighths of the whole (:func:`memory_gb`), and a suffix from the profile
  variant (``+me`` media extensions, ``+me.all``, ``+gfx``, ``-me``). Discovery uses this rule, so
  resource names match NVIDIA's; nvidia-smi prints the same names.
- **Profile tables** of the MIG-capable models nvplugin simulates (:data:`MIG_MODELS`): slice
  counts, memory, instance limits and placements, as ``nvidia-smi mig -lgip``/``-lgipp`` list them.
  A node file's ``mig:`` lists are checked against them, and laid out (:func:`lay_out`) the way the
  driver places GPU instances.
- **Capability minors.** A container that gets a MIG device needs the device nodes
  ``/dev/nvidia-caps/nvidia-cap<minor>`` of its GPU instance and compute instance; the driver
  lists every minor in ``/proc/driver/nvidia-caps/mig-minors`` (:func:`parse_mig_minors`), where
  the numbering is fixed: :func:`caps_minor`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import os
import re
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvplugin.errors import InputError, show
from nvplugin.log import get_logger
from nvplugin.node.model import Gpu, MigCaps, MigDevice, MigUnits
from nvplugin.yamlinput import read_text

# NVML's GPU instance profile enum (NVML_GPU_INSTANCE_PROFILE_*): stable ABI values, named here so
# this module needs no pynvml (tests check them against pynvml's constants).
GI_PROFILE_1_SLICE = 0x0
GI_PROFILE_2_SLICE = 0x1
GI_PROFILE_3_SLICE = 0x2
GI_PROFILE_4_SLICE = 0x3
GI_PROFILE_7_SLICE = 0x4
GI_PROFILE_8_SLICE = 0x5
GI_PROFILE_6_SLICE = 0x6
GI_PROFILE_1_SLICE_REV1 = 0x7
GI_PROFILE_2_SLICE_REV1 = 0x8
GI_PROFILE_1_SLICE_REV2 = 0x9
GI_PROFILE_1_SLICE_GFX = 0xA
GI_PROFILE_2_SLICE_GFX = 0xB
GI_PROFILE_4_SLICE_GFX = 0xC
GI_PROFILE_1_SLICE_NO_ME = 0xD
GI_PROFILE_2_SLICE_NO_ME = 0xE
GI_PROFILE_1_SLICE_ALL_ME = 0xF
GI_PROFILE_2_SLICE_ALL_ME = 0x10
GI_PROFILE_3_SLICE_GFX = 0x11

PROFILE_SUFFIXES: Mapping[int, str] = {
    GI_PROFILE_1_SLICE_REV1: "+me",
    GI_PROFILE_2_SLICE_REV1: "+me",
    GI_PROFILE_1_SLICE_ALL_ME: "+me.all",
    GI_PROFILE_2_SLICE_ALL_ME: "+me.all",
    GI_PROFILE_1_SLICE_GFX: "+gfx",
    GI_PROFILE_2_SLICE_GFX: "+gfx",
    GI_PROFILE_3_SLICE_GFX: "+gfx",
    GI_PROFILE_4_SLICE_GFX: "+gfx",
    GI_PROFILE_1_SLICE_NO_ME: "-me",
    GI_PROFILE_2_SLICE_NO_ME: "-me",
}
"""The name suffix of each GPU instance profile variant (go-nvlib's attributes); others: none."""

MEMORY_FRACTION_DENOMINATOR = 8
"""go-nvlib rounds an instance's share of the GPU's memory up to eighths before naming it."""


def memory_gb(total_bytes: int, instance_mib: int) -> int:
    """The ``<GB>`` of a profile name: the instance's memory as a fraction of the GPU's, rounded
    up to eighths, times the GPU's memory in whole GiB (rounded up), rounded half away from zero
    (Go's ``math.Round``; Python's ``round`` would name B200's 1g profile ``1g.22gb``)."""
    fraction = (instance_mib << 20) / total_bytes
    eighths = math.ceil(fraction * MEMORY_FRACTION_DENOMINATOR) / MEMORY_FRACTION_DENOMINATOR
    total_gb = -(-total_bytes // (1 << 30))
    return math.floor(eighths * total_gb + 0.5)


def profile_name(
    gi_profile: int, gi_slices: int, ci_slices: int, instance_mib: int, total_bytes: int
) -> str:
    """The MIG profile name NVIDIA's plugin gives a MIG device (see the module docstring)."""
    base = f"{gi_slices}g.{memory_gb(total_bytes, instance_mib)}gb"
    if ci_slices != gi_slices:
        base = f"{ci_slices}c.{base}"
    return base + PROFILE_SUFFIXES.get(gi_profile, "")


# --- profile tables ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of a model, as ``nvidia-smi mig -lgip`` lists it.

    ``gi_profile`` is NVML's profile enum, ``id`` the profile ID nvidia-smi shows (NVML's
    ``nvmlGpuInstanceProfileInfo_t.id``); ``placements`` the memory slices an instance may
    start at (``-lgipp``), each taking ``memory_slices``; ``units`` its multiprocessors and
    engines.
    """

    name: str
    gi_profile: int
    id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    instances: int
    placements: tuple[int, ...]
    units: MigUnits = field(default_factory=MigUnits)

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True, slots=True)
class MigModel:
    """A MIG-capable GPU model: NVML names (fnmatch, any case), total memory as NVML reports it,
    its compute and memory slices, and its profiles. ``media_extensions``: how many ``+me``
    instances fit at once (one set of JPEG/OFA engines)."""

    label: str
    names: tuple[str, ...]
    memory_mib: int
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]
    media_extensions: int = 1

    def profile(self, name: str) -> MigProfile | None:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None

    def matches(self, gpu_name: str) -> bool:
        return any(fnmatch.fnmatchcase(gpu_name.lower(), n.lower()) for n in self.names)


_ONE_SLICE_STARTS = (0, 1, 2, 3, 4, 5, 6)


def _eight_slices(
    label: str,
    names: tuple[str, ...],
    memory_mib: int,
    mib: tuple[int, int, int, int],
    gb: tuple[int, int, int, int],
    units: tuple[MigUnits, ...],
) -> MigModel:
    """A model with 7 compute and 8 memory slices (A100, H100, H200, B200): its seven profiles.

    ``mib``: instance memory of 1, 2, 4 and 8 memory slices; ``gb``: the same as profile names
    say it; ``units``: each profile's multiprocessors and engines, in the order below. IDs,
    limits and placements are the same on all of these models.
    """
    one, two, four, eight = mib
    gb1, gb2, gb4, gb8 = gb
    u1, u1me, u1x2, u2, u3, u4, u7 = units
    profiles = (
        MigProfile(f"1g.{gb1}gb", GI_PROFILE_1_SLICE, 19, 1, 1, one, 7, _ONE_SLICE_STARTS, u1),
        MigProfile(
            f"1g.{gb1}gb+me", GI_PROFILE_1_SLICE_REV1, 20, 1, 1, one, 1, _ONE_SLICE_STARTS, u1me
        ),
        MigProfile(f"1g.{gb2}gb", GI_PROFILE_1_SLICE_REV2, 15, 1, 2, two, 4, (0, 2, 4, 6), u1x2),
        MigProfile(f"2g.{gb2}gb", GI_PROFILE_2_SLICE, 14, 2, 2, two, 3, (0, 2, 4), u2),
        MigProfile(f"3g.{gb4}gb", GI_PROFILE_3_SLICE, 9, 3, 4, four, 2, (0, 4), u3),
        MigProfile(f"4g.{gb4}gb", GI_PROFILE_4_SLICE, 5, 4, 4, four, 1, (0,), u4),
        MigProfile(f"7g.{gb8}gb", GI_PROFILE_7_SLICE, 0, 7, 8, eight, 1, (0,), u7),
    )
    return MigModel(label, names, memory_mib, 7, 8, profiles)


_A100_UNITS = (
    MigUnits(14, 1, 0, 0, 0, 0),
    MigUnits(14, 1, 1, 0, 1, 1),
    MigUnits(14, 1, 1, 0, 0, 0),
    MigUnits(28, 2, 1, 0, 0, 0),
    MigUnits(42, 3, 2, 0, 0, 0),
    MigUnits(56, 4, 2, 0, 0, 0),
    MigUnits(98, 7, 5, 0, 1, 1),
)
"""A100's profiles, in :func:`_eight_slices`' order: SMs, CE, DEC, ENC, JPEG, OFA."""
_H100_UNITS = (
    MigUnits(16, 1, 1, 0, 1, 0),
    MigUnits(16, 1, 1, 0, 1, 1),
    MigUnits(26, 1, 1, 0, 1, 0),
    MigUnits(32, 2, 2, 0, 2, 0),
    MigUnits(60, 3, 3, 0, 3, 0),
    MigUnits(64, 4, 4, 0, 4, 0),
    MigUnits(132, 8, 7, 0, 7, 1),
)
"""H100's profiles (also used for H200 and B200), in :func:`_eight_slices`' order."""


MIG_MODELS: tuple[MigModel, ...] = (
    MigModel(
        "A30",
        ("NVIDIA A30",),
        24576,
        4,
        4,
        (
            MigProfile(
                "1g.6gb", GI_PROFILE_1_SLICE, 14, 1, 1, 5952, 4, (0, 1, 2, 3), MigUnits(14, 1)
            ),
            MigProfile(
                "1g.6gb+me",
                GI_PROFILE_1_SLICE_REV1,
                21,
                1,
                1,
                5952,
                1,
                (0, 1, 2, 3),
                MigUnits(14, 1, 1, 0, 1, 1),
            ),
            MigProfile(
                "2g.12gb", GI_PROFILE_2_SLICE, 5, 2, 2, 11968, 2, (0, 2), MigUnits(28, 2, 2)
            ),
            MigProfile(
                "2g.12gb+me",
                GI_PROFILE_2_SLICE_REV1,
                6,
                2,
                2,
                11968,
                1,
                (0, 2),
                MigUnits(28, 2, 2, 0, 1, 1),
            ),
            MigProfile(
                "4g.24gb", GI_PROFILE_4_SLICE, 0, 4, 4, 24000, 1, (0,), MigUnits(56, 4, 4, 0, 1, 1)
            ),
        ),
    ),
    _eight_slices(
        "A100 40GB",
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        40960,
        (4864, 9856, 20096, 40448),
        (5, 10, 20, 40),
        _A100_UNITS,
    ),
    _eight_slices(
        "A100 80GB",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        81920,
        (9728, 19968, 40192, 81152),
        (10, 20, 40, 80),
        _A100_UNITS,
    ),
    _eight_slices(
        "H100 80GB",
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
        81559,
        (9984, 20096, 40448, 81152),
        (10, 20, 40, 80),
        _H100_UNITS,
    ),
    _eight_slices(
        "H200 141GB",
        ("NVIDIA H200", "NVIDIA H200 NVL"),
        143771,
        (16384, 33280, 71424, 142976),
        (18, 35, 71, 141),
        _H100_UNITS,
    ),
    _eight_slices(
        "B200 180GB",
        ("NVIDIA B200",),
        183359,
        (22784, 45056, 90112, 182272),
        (23, 45, 90, 180),
        _H100_UNITS,
    ),
)
"""MIG-capable models nvplugin can simulate. Profile names, IDs, limits and placements are
NVIDIA's (MIG user guide, ``nvidia-smi mig -lgip``/``-lgipp``); instance memory is what
``-lgip`` reports for A100 and H100 and an approximation that gives the same names for A30,
H200 and B200 (only the names and slices matter to the plugin). Multiprocessors and engines
(what GPU Feature Discovery labels) follow the MIG user guide's tables for A30 and A100 and
``-lgip`` for H100; H200 and B200 reuse H100's, an approximation."""


def mig_model(gpu_name: str) -> MigModel | None:
    """The MIG model of a GPU by its NVML name, or None (no MIG, or a model not tabled here)."""
    for model in MIG_MODELS:
        if model.matches(gpu_name):
            return model
    return None


# --- laying out a GPU's instances ----------------------------------------------------------------


class MigLayoutError(ValueError):
    """A list of profiles that does not fit the GPU; the message names the profiles. ``at`` is
    the position of the one profile at fault, when one is."""

    def __init__(self, message: str, at: int | None = None) -> None:
        super().__init__(message)
        self.at = at


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance (with one compute instance spanning it) laid out on a simulated GPU."""

    profile: MigProfile
    start: int
    gpu_instance: int
    compute_instance: int = 0

    @property
    def placement(self) -> tuple[int, int]:
        return self.start, self.profile.memory_slices


def gpu_instance_id(memory_slices: int, start: int, size: int) -> int:
    """A GPU instance ID from its placement: 0 for the whole GPU, then the halves, quarters and
    eighths in memory order (0..14 on 8 memory slices: the GI IDs ``mig-minors`` lists)."""
    return memory_slices // size - 1 + start // size


def lay_out(model: MigModel, names: Sequence[str]) -> tuple[MigInstance, ...]:
    """Instances for the profiles ``names`` in that order (which is their MIG index order),
    placed as the driver could place them; MigLayoutError when they do not fit the GPU.

    Checks, each naming the profiles: known profile, per-profile instance limit, media
    extensions, compute and memory slices, then a placement for every instance (largest first,
    lowest memory slice first, backtracking: at most 7 instances, so exhaustive is cheap).
    """
    profiles = []
    for at, name in enumerate(names):
        profile = model.profile(name)
        if profile is None:
            known = ", ".join(p.name for p in model.profiles)
            raise MigLayoutError(
                f"{model.label} has no MIG profile {show(name)} (profiles: {known})", at
            )
        profiles.append(profile)
    counts = Counter(p.name for p in profiles)
    for profile in model.profiles:
        if counts[profile.name] > profile.instances:
            raise MigLayoutError(
                f"{counts[profile.name]} x {profile.name}: {model.label} fits at most "
                f"{profile.instances}"
            )
    media = sum(1 for p in profiles if p.media_extensions)
    if media > model.media_extensions:
        raise MigLayoutError(
            f"{media} profiles with media extensions (+me): {model.label} has engines for "
            f"{model.media_extensions}"
        )
    shown = summarize(names)
    for what, need, have in (
        ("compute", sum(p.compute_slices for p in profiles), model.compute_slices),
        ("memory", sum(p.memory_slices for p in profiles), model.memory_slices),
    ):
        if need > have:
            raise MigLayoutError(f"{shown} need {need} {what} slices; {model.label} has {have}")
    order = sorted(range(len(profiles)), key=lambda i: (-profiles[i].memory_slices, i))
    starts = _place([profiles[i] for i in order], [False] * model.memory_slices)
    if starts is None:
        raise MigLayoutError(
            f"{shown} fit {model.label}'s slices but no placement holds them all "
            "(nvidia-smi mig -lgipp lists where each profile may start)"
        )
    placed = dict(zip(order, starts, strict=True))
    return tuple(
        MigInstance(p, placed[i], gpu_instance_id(model.memory_slices, placed[i], p.memory_slices))
        for i, p in enumerate(profiles)
    )


def _place(profiles: Sequence[MigProfile], used: list[bool]) -> list[int] | None:
    """Start slices for ``profiles`` in order on the free slices of ``used``, or None."""
    if not profiles:
        return []
    first, rest = profiles[0], profiles[1:]
    size = first.memory_slices
    for start in first.placements:
        span = range(start, start + size)
        if any(used[s] for s in span):
            continue
        for s in span:
            used[s] = True
        placed = _place(rest, used)
        for s in span:
            used[s] = False
        if placed is not None:
            return [start, *placed]
    return None


def summarize(profiles: Iterable[str]) -> str:
    """``3g.20gb, 2g.10gb, 1g.5gb x2``: profiles in first-seen order with their counts."""
    counts = Counter(profiles)
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.items()) or "none"


def mig_state(gpu: Gpu) -> str:
    """A GPU's MIG layout in a few words: ``MIG off``, ``MIG on, no MIG devices``, or its
    profiles (``3g.20gb, 2g.10gb, 1g.5gb x2``)."""
    if not gpu.mig_enabled:
        return "MIG off"
    if not gpu.mig_devices:
        return "MIG on, no MIG devices"
    return summarize(device.profile for device in gpu.mig_devices)


def mig_uuid(gpu_uuid: str, gpu_instance: int, compute_instance: int) -> str:
    """A simulated MIG device's UUID (``MIG-<uuid>``, the form drivers since R470 use): stable,
    derived from its parent and its instance IDs."""
    digest = hashlib.sha1(f"{gpu_uuid}/gi{gpu_instance}/ci{compute_instance}".encode()).digest()
    return f"MIG-{uuidlib.UUID(bytes=digest[:16], version=5)}"


def simulated_devices(
    parent: int, minor: int, gpu_uuid: str, instances: Sequence[MigInstance]
) -> tuple[MigDevice, ...]:
    """The MIG devices a simulated GPU's instances are discovered as (MIG index = position)."""
    return tuple(
        MigDevice(
            parent=parent,
            index=n,
            uuid=mig_uuid(gpu_uuid, inst.gpu_instance, inst.compute_instance),
            profile=inst.profile.name,
            gpu_instance=inst.gpu_instance,
            compute_instance=inst.compute_instance,
            memory_mib=inst.profile.memory_mib,
            slices=inst.profile.compute_slices,
            placement=inst.placement,
            caps=MigCaps(
                caps_minor(minor, inst.gpu_instance),
                caps_minor(minor, inst.gpu_instance, inst.compute_instance),
            ),
            compute_slices=inst.profile.compute_slices,
            units=inst.profile.units,
        )
        for n, inst in enumerate(instances)
    )


# --- /dev/nvidia-caps minors ------------------------------------------------------------------

MIG_MINORS_PATH = "proc/driver/nvidia-caps/mig-minors"
"""Where the driver lists MIG capability minors, relative to the driver root."""
CAPS_DEVICE_DIR = "/dev/nvidia-caps"
MAX_GPU_INSTANCES = 15
MAX_COMPUTE_INSTANCES = 8
CAPS_FIRST_GPU_MINOR = 3
"""``config`` is minor 1 and ``monitor`` 2; per GPU minor, each of 15 GPU instance IDs has its
access minor followed by those of its 8 compute instance IDs (``gpu31/gi14/ci7`` is 4322)."""
CAPS_GPUS = 32
"""The driver's file covers GPU minors 0..31."""
MAX_MINORS_BYTES = 1024 * 1024
"""The most of the driver's ``mig-minors`` file that is read: it is about 120 KB (4322 lines
for its 32 GPU minors); a longer file is not the driver's."""
MAX_MINOR_DIGITS = 9
"""A minor of more digits is no minor (the kernel's are 20-bit): its line is skipped, like a
line of a form not known, rather than turned into an integer of thousands of digits."""


def caps_minor(gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> int:
    """The minor of ``gpu<N>/gi<G>/access`` or, with a compute instance, ``.../ci<C>/access``."""
    per_gi = 1 + MAX_COMPUTE_INSTANCES
    minor = CAPS_FIRST_GPU_MINOR + gpu_minor * MAX_GPU_INSTANCES * per_gi + gpu_instance * per_gi
    return minor if compute_instance is None else minor + 1 + compute_instance


def caps_device(minor: int) -> str:
    """The device node of a capability minor: ``/dev/nvidia-caps/nvidia-cap<minor>``."""
    return f"{CAPS_DEVICE_DIR}/nvidia-cap{minor}"


def mig_minors_text(gpu_minors: int = CAPS_GPUS) -> str:
    """The ``mig-minors`` file as the driver writes it, for GPU minors 0..gpu_minors-1."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpu_minors):
        for gi in range(MAX_GPU_INSTANCES):
            lines.append(f"gpu{gpu}/gi{gi}/access {caps_minor(gpu, gi)}")
            lines += [
                f"gpu{gpu}/gi{gi}/ci{ci}/access {caps_minor(gpu, gi, ci)}"
                for ci in range(MAX_COMPUTE_INSTANCES)
            ]
    return "\n".join(lines) + "\n"


_NUMBER = rf"(\d{{1,{MAX_MINOR_DIGITS}}})"
_MINORS_LINE = re.compile(rf"^gpu{_NUMBER}/gi{_NUMBER}(?:/ci{_NUMBER})?/access {_NUMBER}$")

CapsKey = tuple[int, int, int | None]
"""(GPU minor, GPU instance ID, compute instance ID or None for the GPU instance itself)."""


def parse_mig_minors(text: str) -> dict[CapsKey, int]:
    """The access minors of ``mig-minors`` text; other lines (config, monitor, anything a newer
    driver adds, numbers too long to be minors) are skipped, as NVIDIA's plugin skips lines it
    does not know."""
    minors: dict[CapsKey, int] = {}
    for line in text.splitlines():
        match = _MINORS_LINE.match(line.strip())
        if match:
            gpu, gi, ci, minor = match.groups()
            minors[(int(gpu), int(gi), None if ci is None else int(ci))] = int(minor)
    return minors


def read_mig_minors(paths: Sequence[Path]) -> dict[CapsKey, int] | None:
    """The access minors of the first of ``paths`` (the driver's ``mig-minors`` under each
    driver root) that exists and reads; None when none does.

    The file is read like every other input (:func:`nvplugin.yamlinput.read_text`): a regular
    file, at most :data:`MAX_MINORS_BYTES`, UTF-8. What is there instead -- a FIFO (whose open
    would wait for a writer for ever), a device such as ``/dev/zero`` (endless), a file of
    hundreds of megabytes -- is refused with a warning naming it, and the next path is tried.
    """
    for path in paths:
        if not os.path.lexists(path):
            continue
        try:
            text = read_text(path, f"the driver's MIG minors file {path}", MAX_MINORS_BYTES)
        except InputError as exc:
            get_logger("nvplugin.node").warning("MIG capability minors not read", reason=str(exc))
            continue
        return parse_mig_minors(text)
    return None
