"""The simulated driver root carries what a real one has for containers: device nodes (stand-in
files whose majors are in its proc/devices and minors known to the model), versioned libraries
with soname links, firmware, programs and the optional hook."""

from __future__ import annotations

import os
import stat

from nvplugin.cdi.hostfiles import read_majors
from nvplugin.node import driverfiles as facts
from nvplugin.nodesession import open_node
from nvplugin.sim.driverroot import CAPS_MAJOR, UVM_MAJOR


def test_device_nodes_and_their_majors() -> None:
    with open_node("dgx-a100-mig") as node:
        root = node.driver_root
        assert root is not None
        majors = read_majors(root)
        assert (majors[facts.FRONTEND], majors[facts.UVM], majors[facts.CAPS]) == (
            195,
            UVM_MAJOR,
            CAPS_MAJOR,
        )
        for gpu in node.topology.gpus:
            assert stat.S_ISREG(os.lstat(f"{root}/dev/nvidia{gpu.minor}").st_mode)
            for mig in gpu.mig_devices:
                assert mig.caps is not None
                for minor in (mig.caps.gpu_instance, mig.caps.compute_instance):
                    assert os.path.isfile(f"{root}/dev/nvidia-caps/nvidia-cap{minor}")
        for name in facts.CONTROL_NODES:
            assert os.path.isfile(f"{root}/dev/{name}")


def test_libraries_with_sonames_firmware_and_programs() -> None:
    with open_node("dgx-a100") as node:
        root = node.driver_root
        version = node.scan.driver.version
        libdir = f"{root}/usr/lib/x86_64-linux-gnu"
        for name in facts.LIBRARIES:
            assert stat.S_ISREG(os.lstat(f"{libdir}/{name}.{version}").st_mode)
            assert os.readlink(f"{libdir}/{name}.1") == f"{name}.{version}"
        assert os.path.isfile(f"{root}/lib/firmware/nvidia/{version}/gsp_ga10x.bin")
        for program in ("nvidia-smi", "nvidia-cdi-hook", "nvidia-ctk"):
            assert os.access(f"{root}/usr/bin/{program}", os.X_OK)
        # The stand-in libraries are never loaded as NVML: the simulation's is patched in.
        assert node.nvml.library is None
