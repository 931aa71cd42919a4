"""Extended resource names: the kubelet's rule, and the names derived from one.

This is the only copy of the rule in the package. The config checks it when it loads (so a bad
name is an exit-2 error naming the key, not a silent registration failure), and the fake kubelet
checks it in ``Register`` exactly as the real kubelet does (docs/kubelet-behaviour.md#registration).

The rule (upstream ``v1helper.IsExtendedResourceName``): the name contains ``/``; it is not in the
``kubernetes.io/`` namespace; it does not start with ``requests.``; and ``requests.<name>`` is a
qualified name: an optional DNS-1123 subdomain prefix (<= 253 characters) and a ``/``, then a name
part of 1-63 characters, alphanumeric at both ends, ``[-_.A-Za-z0-9]`` inside.
"""

from __future__ import annotations

import re

from nvplugin.errors import InputError, shortened

DEFAULT_RESOURCE_NAME = "nvidia.com/gpu"

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUALIFIED_NAME_MAX = 63
_REQUESTS_PREFIX = "requests."


def _qualified_name_problem(value: str, shown: str = "") -> str | None:
    """Why ``value`` is not a Kubernetes qualified name, or None when it is one.

    ``shown`` is removed from the front of the prefix in messages (the rule checks
    ``requests.<name>``, but the user wrote ``<name>``).
    """
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "the prefix before '/' is empty"
        if len(prefix) > _DNS1123_SUBDOMAIN_MAX:
            limit = _DNS1123_SUBDOMAIN_MAX - len(shown)
            return f"the prefix is longer than {limit} characters"
        if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return (
                f"the prefix {prefix.removeprefix(shown)!r} is not a DNS-1123 subdomain "
                "(lower-case alphanumerics, '-' and '.', alphanumeric at both ends)"
            )
    else:
        return "it contains more than one '/'"
    if not name:
        return "the name part after '/' is empty"
    if len(name) > _QUALIFIED_NAME_MAX:
        return f"the name part is longer than {_QUALIFIED_NAME_MAX} characters"
    if not _QUALIFIED_NAME.fullmatch(name):
        return (
            f"the name part {name!r} must be alphanumeric at both ends "
            "with only '-', '_', '.' or alphanumerics inside"
        )
    return None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None when it is valid."""
    if "/" not in name:
        return "it has no '/' (extended resource names look like 'vendor.com/name')"
    if "kubernetes.io/" in name:
        return "the kubernetes.io/ namespace is reserved for native resources"
    if name.startswith(_REQUESTS_PREFIX):
        return f"it starts with {_REQUESTS_PREFIX!r}"
    if name.startswith("/"):
        return "the prefix before '/' is empty"
    return _qualified_name_problem(_REQUESTS_PREFIX + name, _REQUESTS_PREFIX)


def is_extended_resource_name(name: str) -> bool:
    """True when the kubelet accepts ``name`` as an extended resource name."""
    return resource_name_problem(name) is None


def resource_name_error(name: str) -> str | None:
    """None when ``name`` is an extended resource name, else the error message: it starts the way
    the kubelet's does (``the ResourceName "<n>" is invalid``) so a user who has seen the
    kubelet's error recognises it, then says why."""
    problem = resource_name_problem(name)
    shown = shortened(name, 200)
    return None if problem is None else f'the ResourceName "{shown}" is invalid: {problem}'


def validate_resource_name(name: str) -> None:
    """Raise :class:`InputError` (see :func:`resource_name_error`) unless ``name`` is valid."""
    error = resource_name_error(name)
    if error is not None:
        raise InputError(error)


def short_name(resource_name: str) -> str:
    """The part after ``/``: ``nvidia.com/gpu`` -> ``gpu``. Names the plugin socket."""
    return resource_name.rsplit("/", 1)[-1]


def socket_name(resource_name: str) -> str:
    """The plugin socket's basename for a resource: ``nvplugin-<short name>.sock``."""
    return f"nvplugin-{short_name(resource_name)}.sock"


def resource_domain(resource_name: str) -> str:
    """The part before ``/``: ``nvidia.com/gpu`` -> ``nvidia.com``."""
    return resource_name.split("/", 1)[0]


def full_name(name: str, default_resource: str) -> str:
    """A name as configured -> a resource name: ``a100`` gets the domain of the default resource
    (``nvidia.com/a100``); a name with ``/`` is taken as it is."""
    return name if "/" in name else f"{resource_domain(default_resource)}/{name}"
