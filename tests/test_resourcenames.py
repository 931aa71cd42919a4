"""The kubelet's extended-resource-name rule (docs/kubelet-behaviour.md#registration),
table-driven."""

from __future__ import annotations

import pytest

from nvplugin.errors import InputError, shortened
from nvplugin.resourcenames import (
    is_extended_resource_name,
    resource_name_problem,
    short_name,
    socket_name,
    validate_resource_name,
)

VALID = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.5gb",
    "example.com/a_b",
    "a/b",
    "x/" + "a" * 63,
    "a" * 244 + "/gpu",  # 'requests.' + prefix = 253 characters
    "example.com/GPU",  # upper case is fine in the name part
]

INVALID = [
    ("gpu", "no '/'"),
    ("nvidia.com/", "name part after '/' is empty"),
    ("/gpu", "prefix before '/' is empty"),
    ("kubernetes.io/gpu", "kubernetes.io/"),
    ("foo.kubernetes.io/gpu", "kubernetes.io/"),
    ("requests.nvidia.com/gpu", "starts with 'requests.'"),
    ("Nvidia.com/gpu", "'Nvidia.com' is not a DNS-1123 subdomain"),
    ("nvidia_com/gpu", "not a DNS-1123 subdomain"),
    ("nvidia.com/-gpu", "alphanumeric at both ends"),
    ("nvidia.com/gpu.", "alphanumeric at both ends"),
    ("nvidia.com/g pu", "alphanumeric at both ends"),
    ("a/b/c", "more than one '/'"),
    ("x/" + "a" * 64, "longer than 63"),
    ("a" * 245 + "/gpu", "longer than 244"),
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names_pass(name: str) -> None:
    assert is_extended_resource_name(name)
    validate_resource_name(name)


@pytest.mark.parametrize(("name", "why"), INVALID)
def test_invalid_names_are_refused_with_the_reason(name: str, why: str) -> None:
    assert not is_extended_resource_name(name)
    problem = resource_name_problem(name)
    assert problem is not None and why in problem
    with pytest.raises(InputError) as caught:
        validate_resource_name(name)
    # A name is quoted whole up to 200 characters (a config value can be megabytes).
    assert str(caught.value).startswith(f'the ResourceName "{shortened(name, 200)}" is invalid: ')
    assert caught.value.exit_code == 2


def test_socket_name_uses_the_short_name() -> None:
    assert short_name("nvidia.com/gpu") == "gpu"
    assert socket_name("nvidia.com/gpu") == "nvplugin-gpu.sock"
    assert socket_name("nvidia.com/gpu.shared") == "nvplugin-gpu.shared.sock"
