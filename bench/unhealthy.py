"""How soon an event scripted on a simulated node reaches the kubelet as Unhealthy: an
in-process daemon (to know when the simulated NVML makes each event due) and a ListAndWatch
client. Shared by bench_plugin (Xid events) and bench_health (ECC faults)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc


def unhealthy_latencies(
    node_path: str, config_yaml: str, faults: Sequence[tuple[float, int]], listen_s: float
) -> list[float]:
    """Serve ``node_path`` with the config ``config_yaml`` for ``listen_s`` seconds; for each of
    ``faults`` (seconds after the simulated node's start, GPU index) that ListAndWatch said, the
    milliseconds from the event due to the message saying its GPU newly Unhealthy."""
    from nvplugin.api.v1beta1 import api_pb2, api_pb2_grpc
    from nvplugin.config import load_config
    from nvplugin.log import configure
    from nvplugin.nodesession import NodeSession, open_node
    from nvplugin.plugin.daemon import Daemon

    directory = os.path.dirname(node_path)
    config_path = os.path.join(directory, "config.yaml")
    Path(config_path).write_text(config_yaml)
    plugin_dir = os.path.join(directory, "dp")
    config = load_config(
        config_path, flags={"nvplugin.devicePluginDir": plugin_dir, "nvplugin.log.level": "error"}
    )
    configure("json", "error")
    sessions: list[NodeSession] = []

    def opener(simulate: str | None) -> NodeSession:
        session = open_node(simulate)
        sessions.append(session)
        return session

    daemon = Daemon(config, simulate=node_path, opener=opener)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(daemon.run(handle_signals=False)), daemon=True
    )
    thread.start()
    socket_path = os.path.join(plugin_dir, "nvplugin-gpu.sock")
    while not os.path.exists(socket_path):
        time.sleep(0.01)
    received: list[tuple[float, frozenset[int]]] = []
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())

        def read() -> None:
            index_of: dict[str, int] = {}
            try:
                for message in stream:
                    now = time.monotonic()
                    if not index_of:
                        index_of = {d.ID: i for i, d in enumerate(message.devices)}
                    unhealthy = (index_of[d.ID] for d in message.devices if d.health != "Healthy")
                    received.append((now, frozenset(unhealthy)))
            except grpc.RpcError:
                pass  # cancelled below

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(listen_s)
        stream.cancel()
        reader.join(5)
    loop.call_soon_threadsafe(daemon.stop)
    thread.join(5)
    started = sessions[0].sim._started  # type: ignore[union-attr]  # the events' clock
    latencies = []
    for after_s, gpu in faults:
        due = started + after_s
        previous: frozenset[int] = frozenset()
        for at, bad in received:
            if at >= due - 0.001 and gpu in bad and gpu not in previous:
                latencies.append((at - due) * 1000)
                break
            previous = bad
    return latencies
