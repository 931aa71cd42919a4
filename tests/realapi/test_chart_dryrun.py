"""Every object the chart renders, for every value set tests use (tests/support/chartvalues.py),
applied to a real kube-apiserver with server-side dry-run: validated, defaulted and admitted as
``helm install`` would have it, not stored. tests/chart/ checks the same objects against the
published OpenAPI schemas; the server also checks what those do not say (label and name syntax,
field-level validation, RBAC references, admission), so a field it refuses fails here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.chartvalues import VALUE_SETS
from tests.support.helm import render
from tests.support.realapi import RealAPI, RealAPIError


@pytest.fixture(scope="module")
def namespace(real_api: RealAPI) -> str:
    return real_api.namespace("chart")


def _namespaces(objects: list[dict[str, Any]]) -> set[str]:
    return {o["metadata"]["namespace"] for o in objects if o["metadata"].get("namespace")}


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_the_server_accepts_every_rendered_object(
    real_api: RealAPI, namespace: str, case: str
) -> None:
    rendered = render(VALUE_SETS[case], namespace=namespace)
    assert rendered.objects
    for other in _namespaces(rendered.objects) - {namespace}:  # namespaceOverride
        real_api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    refused = []
    for obj in rendered.objects:
        try:
            (applied,) = real_api.apply(obj, dry_run=True)
        except RealAPIError as exc:
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
            continue
        assert applied["kind"] == obj["kind"]
        assert applied["metadata"]["name"] == obj["metadata"]["name"]
    assert refused == []
    # Dry run: nothing stored.
    for obj in rendered.objects:
        with pytest.raises(RealAPIError) as gone:
            real_api.request("GET", real_api.path_of(obj))
        assert gone.value.status == 404


def test_a_field_the_server_refuses_fails(real_api: RealAPI, namespace: str) -> None:
    daemonset = copy.deepcopy(render({}, namespace=namespace).daemonset)
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(RealAPIError) as unknown:
        real_api.apply(daemonset, dry_run=True)
    # (500: how this server answers an apply whose typed patch cannot be built.)
    assert "volumeMount: field not declared in schema" in str(unknown.value)

    # What the OpenAPI schema cannot say: a label value's syntax.
    daemonset = copy.deepcopy(render({}, namespace=namespace).daemonset)
    daemonset["spec"]["template"]["metadata"]["labels"]["example.com/tier"] = "ml team"
    with pytest.raises(RealAPIError) as label:
        real_api.apply(daemonset, dry_run=True)
    assert label.value.status == 422 and "ml team" in str(label.value)
