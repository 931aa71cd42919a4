"""The admission pipeline (``nvplugin.admit.admission``) in-process against the real plugin process:
health events, a plugin killed and restarted, a kubelet restart read back from the checkpoint."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

from nvplugin.admit.admission import Admission, AdmitSettings
from nvplugin.admit.process import PluginProcess
from nvplugin.fakekubelet.devicemanager import checkpoint as ckpt
from nvplugin.fakekubelet.pods import Container, Pod
from nvplugin.nodesession import load_topology
from tests.support.serve import new_dir, node_file, remove_dir
from tests.support.waiting import WAIT_S as WAIT

RESOURCE = "nvidia.com/gpu"


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def gpu_pod(name: str, n: int) -> Pod:
    return Pod.of(name, [Container.of("main", limits={RESOURCE: n})])


def test_a_gpu_made_unhealthy_by_an_xid_is_never_allocated() -> None:
    scratch = new_dir()
    try:
        node = node_file(scratch, "workstation-4gpu", [{"after_s": 0.5, "gpu": 1, "xid": 79}])
        topology = load_topology(node)
        sick = topology.gpus[1].uuid
        settings = AdmitSettings(simulate=node, topology_manager_policy="best-effort")

        async def main() -> None:
            async with Admission(settings, topology) as admission:
                dm = admission.devices
                obs = admission.observer
                await obs.wait_for(
                    lambda m: sick in m.unhealthy_devices(RESOURCE), WAIT, "GPU1 unhealthy"
                )
                everything = await admission.admit(gpu_pod("all-four", 4))
                assert not everything.admitted
                assert everything.message == (
                    "Allocate failed due to requested number of devices unavailable for "
                    "nvidia.com/gpu. Requested: 4, Available: 3, which is unexpected"
                )
                given: list[int] = []
                for i in range(3):
                    result = await admission.admit(gpu_pod(f"one-{i}", 1))
                    assert result.admitted, result
                    given += result.containers[0].gpu_indices
                assert sorted(given) == [0, 2, 3]
                last = await admission.admit(gpu_pod("one-more", 1))
                assert not last.admitted
                assert sick not in dm.allocated_devices(RESOURCE)

        run(main())
    finally:
        remove_dir(scratch)


def test_plugin_killed_and_restarted_registers_again_and_allocation_continues() -> None:
    topology = load_topology("dgx-1")
    settings = AdmitSettings(simulate="dgx-1", topology_manager_policy="single-numa-node")

    async def main() -> None:
        async with Admission(settings, topology) as admission:
            dm = admission.devices
            obs = admission.observer
            first = await admission.admit(gpu_pod("first", 2))
            assert first.admitted and first.containers[0].gpu_indices == (0, 3)
            old = admission.plugin
            assert old is not None
            old.kill()
            await obs.wait_for(lambda m: not m.is_registered(RESOURCE), WAIT, "the disconnect")
            assert dm.healthy_devices(RESOURCE) == set()

            admission.plugin = PluginProcess(admission.directory, "--simulate", "dgx-1")
            await obs.wait_for(
                lambda m: len(m.healthy_devices(RESOURCE)) == 8, WAIT, "re-registration"
            )
            assert len([r for r in obs.registrations if r.error is None]) == 2
            second = await admission.admit(gpu_pod("second", 2))
            assert second.admitted and second.containers[0].gpu_indices == (1, 2)
            # The first pod still holds its GPUs.
            first_uid = gpu_pod("first", 2).uid
            assert first_uid in dm.pods()
            assert dm.pod_devices(first_uid, RESOURCE) == {
                topology.gpus[0].uuid,
                topology.gpus[3].uuid,
            }
            assert admission.plugin_failure is None

    run(main())


def test_checkpoint_survives_a_fake_kubelet_restart_with_the_real_plugin() -> None:
    topology = load_topology("dgx-1")
    settings = AdmitSettings(simulate="dgx-1", topology_manager_policy="best-effort")
    uuids = [g.uuid for g in topology.gpus]

    async def main() -> None:
        async with Admission(settings, topology) as admission:
            dm = admission.devices
            obs = admission.observer
            quad = await admission.admit(gpu_pod("quad", 4))
            assert quad.admitted
            held = {uuids[i] for i in quad.containers[0].gpu_indices}
            data = ckpt.read_checkpoint(admission.directory)
            assert data is not None
            assert {d for e in data.entries for d in e.all_device_ids()} == held

            await admission.kubelet.restart()
            assert dm.capacity()[RESOURCE].capacity == 0
            # The plugin sees kubelet.sock re-created, serves again and re-registers.
            await obs.wait_for(
                lambda m: len(m.healthy_devices(RESOURCE)) == 8, WAIT, "re-registration"
            )
            assert dm.allocated_devices(RESOURCE) == held
            other = await admission.admit(gpu_pod("other", 4))
            assert other.admitted
            assert not {uuids[i] for i in other.containers[0].gpu_indices} & held
            last = await admission.admit(gpu_pod("last", 1))
            assert last.message is not None and "Available: 0" in last.message

    run(main())


def test_admission_cleans_up_its_directory_and_plugin() -> None:
    topology = load_topology("workstation-4gpu")

    async def main() -> None:
        admission = Admission(AdmitSettings(simulate="workstation-4gpu"), topology)
        async with admission:
            assert os.path.isdir(admission.directory)
            plugin = admission.plugin
            assert plugin is not None and plugin.alive
        assert not os.path.exists(admission.directory)
        assert not plugin.alive
        assert plugin.process.returncode == 0  # SIGTERM: a clean exit

    run(main())
