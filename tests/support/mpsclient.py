"""A simulated MPS client (a CUDA program's stand-in, ``nvidia-cuda-mps-control
--simulated-client``) of a control daemon, shared by the MPS tests."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Mapping

from tests.support.waiting import WAIT_S


@contextlib.asynccontextmanager
async def mps_client(program: str, env: Mapping[str, str]) -> AsyncIterator[subprocess.Popen[str]]:
    """A client of the daemon on ``env``'s ``CUDA_MPS_PIPE_DIRECTORY`` run by ``program`` (the
    simulated control program), once the daemon serves it; ended however the block ends."""
    client = subprocess.Popen(
        [program, "--simulated-client"], env=dict(env), stdout=subprocess.PIPE, text=True
    )
    try:
        assert client.stdout is not None
        served = await asyncio.wait_for(asyncio.to_thread(client.stdout.readline), WAIT_S)
        assert served.startswith("served by "), served
        yield client
    finally:
        if client.poll() is None:
            client.terminate()
        await asyncio.to_thread(client.wait, WAIT_S)
        if client.stdout is not None:
            client.stdout.close()
