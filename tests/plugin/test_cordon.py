"""The cordon annotations read (both names, UUIDs or indices) and applied: exactly the GPUs they
name, a value naming no GPU said once."""

from __future__ import annotations

import asyncio

import structlog.testing

from nvplugin.config.pod import PodIdentity
from nvplugin.kube.kubeconfig import ApiAccess
from nvplugin.nodefile.reader import load_node
from nvplugin.plugin.cordon import (
    ANNOTATION,
    HAMI_ANNOTATION,
    MAX_VALUE_CHARS,
    Cordon,
    entries,
    follow,
    resolve,
)
from tests.support.waiting import WAIT_S

GPUS = load_node("workstation-4gpu").topology().gpus


def test_entries_from_both_annotations_without_blanks_or_repeats() -> None:
    annotations = {ANNOTATION: " 1, ,GPU-x,1", HAMI_ANNOTATION: "GPU-x,GPU-y", "other": "2"}
    assert entries(annotations) == ("1", "GPU-x", "GPU-y")


def test_an_oversized_value_is_ignored() -> None:
    assert entries({ANNOTATION: "1," * MAX_VALUE_CHARS, HAMI_ANNOTATION: "2"}) == ("2",)


def test_resolve_by_uuid_in_any_case_or_index() -> None:
    items = (GPUS[3].uuid.upper(), "0", "7", "GPU-nope", "-1")
    assert resolve(items, GPUS) == (frozenset({0, 3}), ("7", "GPU-nope", "-1"))


def test_cordon_applies_after_discovery_and_says_an_unknown_entry_once() -> None:
    applied: list[frozenset[int]] = []
    cordon = Cordon(applied.append)
    with structlog.testing.capture_logs() as logs:
        cordon.update(("1", "GPU-nope"))
        assert applied == []  # nothing known of the node yet
        cordon.node(GPUS)
        cordon.update(("1", "GPU-nope"))
        cordon.update(("GPU-nope",))
    assert applied == [frozenset({1}), frozenset()]
    said = [line for line in logs if line["event"].startswith("cordon annotation names no GPU")]
    assert [line["entry"] for line in said] == ["GPU-nope"]


def test_a_node_name_no_node_can_have_turns_the_cordon_off_without_asking_the_api() -> None:
    """Before: a NODE_NAME such as "bad/node" went into the request path (GET
    /api/v1/nodes/bad/node); now the cordon is off, said once, and no client is made."""
    access = ApiAccess(kubeconfig="/nonexistent/kubeconfig")
    pod = PodIdentity(node_name="bad/node", access=access)
    with structlog.testing.capture_logs() as logs:
        asyncio.run(asyncio.wait_for(follow(pod, Cordon(lambda _: None)), WAIT_S))
    (said,) = [line for line in logs if line["event"].startswith("gpu cordon")]
    assert said["event"] == "gpu cordon by node annotation off"
    assert "NODE_NAME 'bad/node' is not a Kubernetes object name" in said["reason"]
