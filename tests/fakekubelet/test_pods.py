"""Pod manifests: parsing, defaulting, QoS, effective requests, and errors that name the place."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from nvplugin.errors import InputError
from nvplugin.fakekubelet.pods import (
    Container,
    Pod,
    load_pod_file,
    load_pods,
    qos_class,
    stable_uid,
)
from nvplugin.fakekubelet.quantity import INT64_MAX, INT64_MIN, add, parse_quantity

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
    assert burst.containers[0].requests["cpu"].milli_value == 250


def test_effective_pod_requests_with_sidecars() -> None:
    train = load_pods(PODS)[0]
    # max(app 4 + sidecar 1, regular init 2 + sidecars before it 0) = 5
    assert train.effective_count("nvidia.com/gpu") == 5
    assert train.effective_requests()["cpu"] == Decimal("8.5")
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


# What the API server makes of quantities (apimachinery resource.ParseQuantity and the
# int64 accessors: Value(), MilliValue()), hostile ones included.
@pytest.mark.parametrize(
    ("text", "value", "int_value", "milli_value"),
    [
        ("500m", "0.5", 1, 500),
        ("2", "2", 2, 2000),
        ("1Gi", "1073741824", 2**30, 2**30 * 1000),
        ("1.5k", "1500", 1500, 1500000),
        ("1e3", "1000", 1000, 10**6),
        ("1E+03", "1000", 1000, 10**6),
        (".5", "0.5", 1, 500),
        ("1.", "1", 1, 1000),
        ("01", "1", 1, 1000),
        # Digits finer than 1n round away from zero to 1n.
        ("1e-10", "1e-9", 1, 1),
        ("5e-1000", "1e-9", 1, 1),
        ("-1e-10", "-1e-9", -1, -1),
        ("1.5e-2147483648", "1e-9", 1, 1),
        ("0.0000000011", "0.000000002", 1, 1),
        # Binary values are capped at 2^63-1; decimal ones are not, and the int64 views saturate.
        ("7Ei", str(7 * 2**60), 7 * 2**60, INT64_MAX),
        ("8Ei", str(INT64_MAX), INT64_MAX, INT64_MAX),
        ("-8Ei", str(-INT64_MAX), -INT64_MAX, INT64_MIN),
        ("7.9999999999999999999Ei", str(INT64_MAX), INT64_MAX, INT64_MAX),
        ("-9.5000000001Gi", "-10200547328.107374183", -10200547329, -10200547328108),
        ("9223372036854775808", "9223372036854775808", INT64_MAX, INT64_MAX),
        ("1E", "1e18", 10**18, INT64_MAX),
        ("-1e30", "-1e30", INT64_MIN, INT64_MIN),
        ("1e999999999", "1e999999999", INT64_MAX, INT64_MAX),
        ("1e2147483647", "1e2147483647", INT64_MAX, INT64_MAX),
        # A number without digits is zero where the parser's fast path reads it.
        (".", "0", 0, 0),
        ("+", "0", 0, 0),
        ("-", "0", 0, 0),
        ("Ki", "0", 0, 0),
        ("Ti", "0", 0, 0),
        ("E3", "0", 0, 0),
        ("e2147483647", "0", 0, 0),
        ("0Pi", "0", 0, 0),
        ("0e-10", "0", 0, 0),
    ],
)
def test_quantities(text: str, value: str, int_value: int, milli_value: int) -> None:
    quantity = parse_quantity(text)
    assert quantity.value == Decimal(value)
    assert (quantity.int_value, quantity.milli_value) == (int_value, milli_value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "an empty quantity"),
        ("abc", '"abc" is not a quantity'),
        ("1.2.3", "is not a quantity"),
        ("5 Gi", "is not a quantity"),
        ("1Zi", "is not a quantity"),
        ("1e5e5", "is not a quantity"),
        ("1mm", 'has an unknown unit "mm"'),
        ("1e", 'has an unknown unit "e"'),
        ("1e+", 'has an unknown unit "e+"'),
        ("1Ki5", 'has an unknown unit "Ki5"'),
        # The parser's exact path reads the number itself: without digits it fails.
        ("Pi", '"Pi" has no digits'),
        ("Ei", "has no digits"),
        ("e-10", "has no digits"),
        (".e-10", "has no digits"),
        # Past the parser's 32-bit scale (released parsers wrap these modulo 2^32, or hang).
        ("1e2147483648", "the exponent is out of range (-2147483648 to 2147483647)"),
        ("1e-2147483649", "exponent is out of range"),
        ("1e4294967297", "exponent is out of range"),
        ("1e99999999999999999999", "exponent is out of range"),
    ],
)
def test_bad_quantities(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_quantity(text)
    assert message in str(err.value)


def test_whole_numbers_as_the_api_server_counts_them() -> None:
    # Its test: the milli-value (rounded up, at most 2^63-1) is a multiple of 1000.
    assert parse_quantity("4").whole_number == 4
    assert parse_quantity("0.9999").whole_number == 1
    assert parse_quantity("0.999").whole_number is None
    assert parse_quantity("1.0000001").whole_number is None
    assert parse_quantity(str(INT64_MAX // 1000)).whole_number == INT64_MAX // 1000
    assert parse_quantity(str(INT64_MAX // 1000 + 1)).whole_number is None
    assert parse_quantity("1e30").whole_number is None


def test_long_quantities_stay_exact_and_messages_stay_short() -> None:
    big = "9" * 100_000
    assert parse_quantity(big).value == Decimal(big)
    assert parse_quantity("1" + "0" * 100_000 + "e-100000").value == 1
    with pytest.raises(ValueError) as err:
        parse_quantity("1" * 100_000 + "x")
    assert len(str(err.value)) < 200 and "100001 characters" in str(err.value)
    assert len(str(parse_quantity(big))) < 100


def test_sums_are_exact_up_to_a_thousand_digits() -> None:
    assert add(Decimal("1e30"), Decimal("1e-9")) == Decimal(
        "1000000000000000000000000000000.000000001"
    )
    rounded = add(Decimal("1e999999999"), Decimal("1e-9"))
    assert rounded > Decimal("1e999999999") and rounded.adjusted() == 999999999


def test_hostile_quantities_in_pods() -> None:
    def pod(resources: str) -> Pod:
        (only,) = load_pods(doc(f"  containers: [{{name: a, resources: {resources}}}]"))
        return only

    # Decimal values are not capped: a huge cpu request is valid, and the kubelet counts it
    # saturated (no whole CPUs: its milli-value overflows).
    huge = pod("{limits: {cpu: 1e999999999, memory: 1e999999999}}")
    assert huge.qos_class == "Guaranteed"
    assert huge.effective_count("cpu") == INT64_MAX
    assert huge.containers[0].requests["cpu"].whole_number is None
    mixed = pod("{requests: {cpu: 1n, memory: 1}, limits: {cpu: 1e999999999, memory: 1}}")
    assert mixed.qos_class == "Burstable"
    with pytest.raises(InputError, match=r'"1e30" is more than 9223372036854775'):
        pod("{limits: {nvidia.com/gpu: 1e30}}")
    with pytest.raises(InputError, match=r"exponent is out of range"):
        pod("{limits: {nvidia.com/gpu: 1e4294967297}}")
    assert pod("{limits: {nvidia.com/gpu: 0.9999}}").containers[0].count("nvidia.com/gpu") == 1


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
            'spec.containers[0].resources.limits[memory]: "lots" is not a quantity',
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


def test_quantities_finer_than_a_milli_are_rounded_up_as_the_api_server_defaults_them() -> None:
    """The API server's defaulting rounds every quantity of requests and limits up to 1m before
    the kubelet sees the pod: the QoS class, the CPU manager and the fit all see the rounded
    value (measured on the real kubelet 1.32)."""
    (pod,) = load_pods(
        doc(
            "  containers:\n  - name: a\n    resources:\n"
            "      requests: {cpu: 1999999999n, memory: 1Gi}\n"
            "      limits: {cpu: '2', memory: 1Gi}\n"
        )
    )
    assert pod.qos_class == "Guaranteed"
    assert pod.containers[0].requests["cpu"].value == 2
    assert str(pod.containers[0].requests["cpu"]) == "1999999999n"  # messages show the text
    (tiny,) = load_pods(doc("  containers: [{name: a, resources: {requests: {cpu: 1n}}}]"))
    assert tiny.effective_requests()["cpu"] == Decimal("0.001")
    assert tiny.effective_count("cpu") == 1
    assert Container.of("b", requests={"memory": "1500001u"}).requests["memory"].value == (
        Decimal("1.501")
    )
