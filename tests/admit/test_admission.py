"""When ``nvplugin admit`` counts its plugin ready: every socket in the private directory has
registered and sent its device list (over real sockets, with tiny in-test plugins)."""

from __future__ import annotations

import os
import shutil
import tempfile

from nvplugin.admit.admission import AdmitSettings, plugin_sockets, serving_everything
from nvplugin.fakekubelet.kubelet import FakeKubelet
from tests.support.tinyplugin import TinyPlugin, device, register, run
from tests.support.waiting import WAIT_S as WAIT


def test_ready_once_every_socket_registered_and_listed() -> None:
    directory = tempfile.mkdtemp(prefix="nva-")

    async def main() -> None:
        first, second = TinyPlugin([device("a")]), TinyPlugin([device("b")])
        async with FakeKubelet(directory) as kubelet:
            obs = kubelet.observer

            def ready() -> bool:
                return serving_everything(directory, kubelet.devices, obs)

            assert plugin_sockets(directory) == [] and not ready()
            await first.serve(os.path.join(directory, "first.sock"))
            await second.serve(os.path.join(directory, "second.sock"))
            try:
                assert plugin_sockets(directory) == [
                    os.path.join(directory, name) for name in ("first.sock", "second.sock")
                ]
                await register(kubelet, "first.sock", resource="example.com/first")
                await obs.wait_for(lambda _: bool(obs.snapshots("example.com/first")), WAIT)
                assert not ready()  # the second socket has not registered yet
                await register(kubelet, "second.sock", resource="example.com/second")
                await obs.wait_for(lambda _: ready(), WAIT, "both registered and listed")
            finally:
                await first.stop()
                await second.stop()

    try:
        run(main())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_plugin_is_told_only_what_the_user_said() -> None:
    assert AdmitSettings().plugin_args() == []
    settings = AdmitSettings(simulate="dgx-1", config="c.yaml", mig_strategy="mixed")
    assert settings.plugin_args() == [
        *("--simulate", "dgx-1"),
        *("--config", "c.yaml"),
        *("--mig-strategy", "mixed"),
    ]
