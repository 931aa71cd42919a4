"""Pod manifests: parsing, defaulting, QoS, effective requests, and errors that name the place."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from nvplugin.errors import InputError
from nvplugin.kubelet.pods import (
    Container,
    Pod,
    load_pod_file,
    load_pods,
    parse_quantity,
    qos_class,
    stable_uid,
)

PODS = """\
apiVersion: v1
kind: Pod
metadata: {name: train, uid: 1234-abcd}
spec:
  initContainers:
  - name: fetch
    resources: {limits: {nvidia.com/gpu: 2, cpu: "1", memory: 1Gi}}
  - name: proxy
    restartPolicy: Always
    resources: {limits: {nvidia.com/gpu: 1, cpu: 500m, memory: 512Mi}}
  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: 4, cpu: "8", memory: 32Gi}
---
apiVersion: v1
kind: Pod
metadata: {name: burst, namespace: ml}
spec:
  containers:
  - name: a
    resources: {requests: {cpu: 250m}, limits: {cpu: "1"}}
---
---
apiVersion: v1
kind: Pod
metadata: {name: idle}
spec:
  containers: [{name: a, image: busybox}]
"""


def test_load_many_documents_in_order() -> None:
    pods = load_pods(PODS, "pods.yaml")
    assert [p.name for p in pods] == ["train", "burst", "idle"]
    train, burst, idle = pods
    assert train.uid == "1234-abcd"
    assert [c.name for c in train.all_containers] == ["fetch", "proxy", "main"]
    assert [c.restartable for c in train.all_containers] == [False, True, False]
    assert train.qos_class == "Guaranteed"
    assert burst.qos_class == "Burstable" and burst.namespace == "ml"
    assert idle.qos_class == "BestEffort"
    # Requests default to limits; quantities keep their text.
    main = train.container("main")
    assert main.requests["cpu"].value == 8 and str(main.requests["memory"]) == "32Gi"
    assert main.count("nvidia.com/gpu") == 4 and main.extended_resources() == {"nvidia.com/gpu": 4}
    assert burst.containers[0].requests["cpu"].milli == 250


def test_effective_pod_requests_with_sidecars() -> None:
    train = load_pods(PODS)[0]
    # max(app 4 + sidecar 1, regular init 2 + sidecars before it 0) = 5
    assert train.effective_count("nvidia.com/gpu") == 5
    assert train.effective_requests()["cpu"] == Fraction(17, 2)
    # A regular init container after a sidecar needs its own amount plus the sidecar's.
    pod = Pod.of(
        "p",
        [Container.of("app", limits={"nvidia.com/gpu": 1})],
        [
            Container.of("side", limits={"nvidia.com/gpu": 2}, restart_policy="Always"),
            Container.of("init", limits={"nvidia.com/gpu": 3}),
        ],
    )
    assert pod.effective_count("nvidia.com/gpu") == 5  # max(1 + 2, 3 + 2)
    assert pod.effective_count("example.com/none") == 0


def test_generated_uid_is_stable_per_namespace_and_name() -> None:
    a = load_pods("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c}]}")
    b = load_pods("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: d}]}")
    assert a[0].uid == b[0].uid == stable_uid("default", "x")
    assert stable_uid("other", "x") != stable_uid("default", "x")


def test_kind_list_and_files(tmp_path: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: v1, kind: Pod, metadata: {name: a}, spec: {containers: [{name: c}]}}\n"
        "- {apiVersion: v1, kind: Pod, metadata: {name: b}, spec: {containers: [{name: c}]}}\n"
    )
    assert [p.name for p in load_pod_file(path)] == ["a", "b"]
    with pytest.raises(InputError, match=r"pod file .*missing\.yaml: no such file"):
        load_pod_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", 2),
        ("1Gi", 2**30),
        ("1.5k", 1500),
        ("1e3", 1000),
        (".5", Fraction(1, 2)),
    ],
)
def test_quantities(text: str, value: Fraction) -> None:
    assert parse_quantity(text).value == value


def test_bad_quantities() -> None:
    for text in ("", "abc", "1.2.3", "5 Gi", "1Zi"):
        with pytest.raises(ValueError):
            parse_quantity(text)


def test_qos_rules() -> None:
    full = {"cpu": "1", "memory": "1Gi"}
    assert qos_class([Container.of("a", limits=full)]) == "Guaranteed"
    assert (
        qos_class([Container.of("a", requests={"cpu": "1", "memory": "1Gi"}, limits=full)])
        == "Guaranteed"
    )
    assert qos_class([Container.of("a", requests={"cpu": "500m"}, limits=full)]) == "Burstable"
    assert qos_class([Container.of("a", limits={"cpu": "1"})]) == "Burstable"  # no memory limit
    assert qos_class([Container.of("a", limits=full), Container.of("b")]) == "Burstable"
    assert qos_class([Container.of("a", limits={"nvidia.com/gpu": 1})]) == "BestEffort"


def doc(body: str, name: str = "p") -> str:
    return f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{body}"


GOOD = "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec: {containers: [{name: c}]}\n---\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "pods.yaml: document 1: not a Pod (a list, not a mapping)"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
            "pods.yaml: document 1 (pod \"d\"): kind: not a Pod (kind is 'Deployment')",
        ),
        (
            "apiVersion: v1\nmetadata: {name: d}\n",
            'document 1 (pod "d"): kind: not a Pod (kind is missing)',
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: c}]}",
            "document 1: metadata.name: missing",
        ),
        (
            GOOD + "apiVersion: v1\nkind: Pod\nspec: {containers: [{name: c}]}",
            "pods.yaml: document 2: metadata: missing",
        ),
        (
            doc("  containers: []"),
            'document 1 (pod "p"): spec.containers: a Pod needs at least one container',
        ),
        (doc("  containers: [{image: x}]"), "spec.containers[0].name: missing"),
        (
            doc("  containers: [{name: a, resources: {limits: {nvidia.com/gpu: 1.5}}}]"),
            'spec.containers[0].resources.limits[nvidia.com/gpu]: "1.5" is not a whole number',
        ),
        (
            doc("  containers: [{name: a, resources: {limits: {nvidia.com/gpu: -1}}}]"),
            'spec.containers[0].resources.limits[nvidia.com/gpu]: "-1" must be greater than or '
            "equal to 0",
        ),
        (
            doc("  containers: [{name: a, resources: {limits: {nvidia.com/gpu: 500m}}}]"),
            "is not a whole number",
        ),
        (
            doc("  containers: [{name: a, resources: {requests: {nvidia.com/gpu: 1}}}]"),
            "spec.containers[0].resources.requests[nvidia.com/gpu]: an extended resource needs "
            "a limit",
        ),
        (
            doc(
                "  containers: [{name: a, resources: "
                "{requests: {nvidia.com/gpu: 1}, limits: {nvidia.com/gpu: 2}}}]"
            ),
            "must equal the limit 2 for an extended resource",
        ),
        (
            doc("  containers: [{name: a, resources: {requests: {cpu: 2}, limits: {cpu: 1}}}]"),
            "requests[cpu]: 2 must be less than or equal to the cpu limit 1",
        ),
        (
            doc("  containers: [{name: a, resources: {limits: {memory: lots}}}]"),
            "spec.containers[0].resources.limits[memory]: 'lots' is not a quantity",
        ),
        (
            doc("  containers: [{name: a}, {name: a}]"),
            'spec.containers[1].name: duplicate name "a"',
        ),
        (
            doc(
                "  initContainers: [{name: i, restartPolicy: OnFailure}]\n  containers: [{name: a}]"
            ),
            "spec.initContainers[0].restartPolicy: 'OnFailure': the only allowed value is "
            '"Always"',
        ),
        (doc("  containers: [{name: a, restartPolicy: Always}]"), "only init containers may set"),
        (
            GOOD + GOOD,
            'document 2 (pod "ok"): metadata.name: pod "default/ok" already defined in document 1',
        ),
        ("a: [", "pods.yaml: line 2, column 1: not valid YAML"),
        (doc("  containers: [{name: Bad_Name}]"), "'Bad_Name' is not a valid container name"),
    ],
)
def test_errors_name_document_and_field(text: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        load_pods(text, "pods.yaml")
    assert message in str(err.value)
    assert err.value.exit_code == 2
