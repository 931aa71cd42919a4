"""nvplugin.kube.client against a real HTTP API server (tests/support/kubeapi.py): credentials
read bounded and off the event loop."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading

import pytest
import yaml

from nvplugin.kube import ApiAccess
from nvplugin.kube.client import MAX_TOKEN, ApiUnavailable, open_client
from nvplugin.kube.node import get_node
from tests.support.kubeapi import KubeApiServer
from tests.support.waiting import WAIT_S

NODE = "gpu-node-1"


def _with_token_file(api: KubeApiServer, token_file: str) -> str:
    """A kubeconfig for ``api`` whose user reads its token from ``token_file``."""
    path = api.kubeconfig()
    with open(path) as f:
        config = yaml.safe_load(f)
    config["users"][0]["user"] = {"tokenFile": token_file}
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


def test_a_token_file_is_read_bounded_and_off_the_loop() -> None:
    """Before: the kubeconfig's tokenFile was read on the event loop, whole: a FIFO
    there stopped every RPC, /dev/zero grew the plugin by gigabytes. A FIFO, and a file larger
    than a token, fail the request naming the file; a good token file works."""

    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE)
            directory = tempfile.mkdtemp()
            fifo = os.path.join(directory, "fifo")
            os.mkfifo(fifo)

            def unblock() -> None:  # what a wedged reader would finally get: the right token
                with open(fifo, "w") as f:
                    f.write(api.token)

            writer = threading.Timer(WAIT_S / 3, unblock)
            writer.daemon = True
            writer.start()
            client = await asyncio.to_thread(
                open_client, ApiAccess(kubeconfig=_with_token_file(api, fifo))
            )
            try:
                with pytest.raises(ApiUnavailable, match="not a regular file"):
                    await get_node(client, NODE)
            finally:
                writer.cancel()
                await client.close()

            huge = os.path.join(directory, "huge")
            with open(huge, "w") as f:
                f.write("x" * (MAX_TOKEN + 1))
            client = await asyncio.to_thread(
                open_client, ApiAccess(kubeconfig=_with_token_file(api, huge))
            )
            try:
                with pytest.raises(ApiUnavailable, match="larger than"):
                    await get_node(client, NODE)
            finally:
                await client.close()

            good = os.path.join(directory, "token")
            with open(good, "w") as f:
                f.write(api.token + "\n")
            client = await asyncio.to_thread(
                open_client, ApiAccess(kubeconfig=_with_token_file(api, good))
            )
            try:
                assert (await get_node(client, NODE)).exists
            finally:
                await client.close()

    asyncio.run(asyncio.wait_for(body(), WAIT_S * 2))


def test_a_kubeconfig_larger_than_the_bound_is_refused_unread() -> None:
    """Before: a 100 MB kubeconfig kept the plugin alive 15 s after SIGTERM."""
    path = os.path.join(tempfile.mkdtemp(), "kubeconfig")
    with open(path, "w") as f:
        f.write("# " + "x" * (2 * 1024 * 1024) + "\n")
    with pytest.raises(ApiUnavailable, match="larger than"):
        open_client(ApiAccess(kubeconfig=path))
