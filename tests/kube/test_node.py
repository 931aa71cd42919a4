"""nvplugin.kube against the project's own HTTP API server (tests/support/kubeapi.py) through
lightkube, for what only it can show: how the Node is asked for (a field selector, watching from
the list's version), resuming a dropped watch, listing again on 410 Gone, the API away at start
and later, a wrong token, a rotated one. Getting the Node, following its label, its deletion and
RBAC are checked on a real kube-apiserver (tests/realapi/test_node_follow.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from lightkube import AsyncClient

from nvplugin.backoff import Backoff
from nvplugin.kube import ApiAccess
from nvplugin.kube.client import ApiUnavailable, open_client
from nvplugin.kube.node import API_BACKOFF, NodeLabels, follow_labels, get_node
from tests.support.kubeapi import KubeApiServer, self_signed
from tests.support.waiting import WAIT_S

NODE = "gpu-node-1"
LABEL = "nvidia.com/device-plugin.config"
FAST = Backoff(initial_s=0.05, maximum_s=0.2)


def run(body: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


class Follower:
    """follow_labels in a task; what it yielded, in order."""

    def __init__(self, client: AsyncClient, **kwargs: object) -> None:
        self.seen: list[NodeLabels] = []
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._run(client, kwargs))

    async def _run(self, client: AsyncClient, kwargs: dict[str, object]) -> None:
        async for state in follow_labels(client, NODE, backoff=FAST, **kwargs):  # type: ignore[arg-type]
            self.seen.append(state)
            self._changed.set()

    def values(self) -> list[str | None]:
        return [s.labels.get(LABEL) if s.exists else "<no node>" for s in self.seen]

    async def until(self, value: str | None) -> None:
        async with asyncio.timeout(WAIT_S):
            while not self.seen or self.values()[-1] != value:
                self._changed.clear()
                await self._changed.wait()

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def cluster(**kwargs: str) -> AsyncIterator[tuple[KubeApiServer, AsyncClient]]:
    async with KubeApiServer(**kwargs) as api:
        api.add_node(NODE, {LABEL: "a100-40gb"})
        api.add_node("other-node", {LABEL: "tesla-t4"})
        client = await asyncio.to_thread(open_client, ApiAccess(kubeconfig=api.kubeconfig()))
        try:
            yield api, client
        finally:
            await client.close()


def test_lists_by_field_selector_then_watches_from_the_lists_version() -> None:
    async def body() -> None:
        async with cluster() as (api, client):
            follower = Follower(client)
            await follower.until("a100-40gb")
            api.label(NODE, LABEL, "tesla-t4")
            await follower.until("tesla-t4")
            api.label("other-node", LABEL, "x")  # another node: not ours, not seen
            api.touch(NODE)  # a change that is no label's: not reported again
            api.label(NODE, LABEL, None)
            await follower.until(None)
            await follower.stop()
            assert follower.values() == ["a100-40gb", "tesla-t4", None]
            listing, watch = api.requests[0], api.watches()[0]
            assert listing.query == {"fieldSelector": f"metadata.name={NODE}"}
            assert watch.query["fieldSelector"] == f"metadata.name={NODE}"
            assert watch.query["resourceVersion"] == "102"  # the list's version
            assert int(watch.query["timeoutSeconds"]) > 0

    run(body)


def test_a_dropped_or_ended_watch_is_resumed_from_the_last_version() -> None:
    async def body() -> None:
        async with cluster() as (api, client):
            follower = Follower(client)
            await follower.until("a100-40gb")
            api.label(NODE, LABEL, "tesla-t4")
            await follower.until("tesla-t4")
            await api.wait_for(lambda: api.open_watches == 1)
            api.drop_watches()  # a reset mid-stream
            await api.wait_for(lambda: len(api.watches()) == 2 and api.open_watches == 1)
            resumed = api.watches()[1].query["resourceVersion"]
            assert resumed == api.nodes[NODE]["metadata"]["resourceVersion"]
            api.end_watches()  # the server's timeoutSeconds: a clean end
            await api.wait_for(lambda: len(api.watches()) == 3 and api.open_watches == 1)
            assert api.watches()[2].query["resourceVersion"] == resumed
            api.label(NODE, LABEL, "a100-80gb")
            await follower.until("a100-80gb")
            await follower.stop()
            # Resumed, never listed again: no change was missed or repeated.
            assert [r for r in api.requests if "watch" not in r.query] == api.requests[:1]
            assert follower.values() == ["a100-40gb", "tesla-t4", "a100-80gb"]

    run(body)


@pytest.mark.parametrize("gone_as", ["event", "status"])
def test_410_gone_lists_again(gone_as: str) -> None:
    async def body() -> None:
        async with cluster(gone_as=gone_as) as (api, client):
            follower = Follower(client)
            await follower.until("a100-40gb")
            await api.wait_for(lambda: api.open_watches == 1)
            api.compact()
            api.drop_watches()
            await api.wait_for(lambda: api.open_watches == 1 and len(api.watches()) >= 3)
            lists = [r for r in api.requests if "watch" not in r.query]
            assert len(lists) == 2  # the first, and the one after 410
            api.label(NODE, LABEL, "tesla-t4")
            await follower.until("tesla-t4")
            await follower.stop()

    run(body)


def test_the_api_down_at_start_and_later() -> None:
    async def body() -> None:
        async with cluster() as (api, client):
            await api.down()
            follower = Follower(client)
            api.label(NODE, LABEL, "tesla-t4")
            await api.up()
            await follower.until("tesla-t4")
            await api.down()  # later: the watch is cut, retries are refused
            api.label(NODE, LABEL, "a100-80gb")
            await api.up()
            await follower.until("a100-80gb")
            await follower.stop()
            assert follower.values() == ["tesla-t4", "a100-80gb"]

    run(body)


def test_a_wrong_token_is_an_outage_not_a_crash() -> None:
    async def body() -> None:
        async with KubeApiServer() as api:
            api.add_node(NODE, {LABEL: "a100-40gb"})
            path = api.kubeconfig(token="wrong")
            client = await asyncio.to_thread(open_client, ApiAccess(kubeconfig=path))
            follower = Follower(client)
            await api.wait_for(lambda: len(api.requests) >= 3)  # retried, with backoff
            assert follower.seen == []
            await follower.stop()
            await client.close()

    run(body)


def test_credentials_missing_or_unusable() -> None:
    assert ApiAccess().problem() is not None
    assert "KUBERNETES_SERVICE_HOST" in (ApiAccess().problem() or "")
    no_token = ApiAccess(service_host="10.0.0.1", service_port="443", service_account_dir="/nx")
    assert "/nx/token" in (no_token.problem() or "")
    with pytest.raises(ApiUnavailable, match="not a file"):
        open_client(ApiAccess(kubeconfig="/no/such/kubeconfig"))


def test_backoff_is_capped() -> None:
    backoff = API_BACKOFF
    assert (backoff.initial_s, backoff.maximum_s) == (0.5, 10.0)
    waits = [0.0]
    for _ in range(8):
        waits.append(backoff.after(waits[-1]))
    assert waits[1:] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert all(0.8 * w <= backoff.jittered(w) <= w for w in waits[1:])


def test_in_cluster_credentials_over_tls_and_a_rotated_token() -> None:
    """The service account the kubelet mounts (token, CA, namespace) against an HTTPS server for
    127.0.0.1: the CA is trusted, the token sent, and a rotated token read again on a 401."""

    async def body() -> None:
        account = tempfile.mkdtemp()
        tls, ca = self_signed(account)
        assert ca == os.path.join(account, "ca.crt")  # where the kubelet puts it
        Path(account, "token").write_text("first-token")
        Path(account, "namespace").write_text("kube-system")
        async with KubeApiServer(tls=tls, token="first-token") as api:
            api.add_node(NODE, {LABEL: "a100-40gb"})
            access = ApiAccess(
                service_host="127.0.0.1",
                service_port=str(api.port),
                service_account_dir=account,
            )
            assert access.problem() is None
            client = await asyncio.to_thread(open_client, access)
            try:
                assert (await get_node(client, NODE)).labels[LABEL] == "a100-40gb"
                # The kubelet rotates the projected token: the next request gets 401 with the
                # old one, and the client reads the file again.
                api.token = "second-token"
                Path(account, "token").write_text("second-token")
                assert (await get_node(client, NODE)).exists
                assert api.requests[-1].headers["authorization"] == "Bearer second-token"
            finally:
                await client.close()

    run(body)
