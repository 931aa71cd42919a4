"""Topology manager policy options and the kubelet's start-up checks, with its exact error texts.

Options (``--topology-manager-policy-options k=v,...``,
docs/kubelet-behaviour.md#merge-and-policies):

- ``prefer-closest-numa-nodes=<bool>``: among equally narrow hints prefer the lowest average
  NUMA distance (never under ``single-numa-node``). Go ``strconv.ParseBool`` syntax.
- ``max-allowable-numa-nodes=<int>``: raise the 8-node limit; values below 8 fail.

The real kubelet checks in two places, and so do we:

1. :func:`validate_config` is the kubelet's configuration validation (run before anything
   starts): policy and scope must be known names, whatever the policy.
2. :func:`new_policy_options` and :func:`nvplugin.fakekubelet.topologymanager.manager.new_manager`
   are ``NewManager``: with policy ``none`` nothing else is checked (not even the options);
   otherwise options, NUMA distances, the NUMA node limit, then the policy and scope names
   (``unknown policy: "x"``, ``unknown scope: "x"``; reachable only when step 1 is skipped).

Every failure is a :class:`StartupError` (an :class:`~nvplugin.errors.InputError`, exit 2).
Feature gates are taken at their defaults: both options are available.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from nvplugin.errors import InputError

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
POLICIES = (POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE)

SCOPE_CONTAINER = "container"
SCOPE_POD = "pod"
SCOPES = (SCOPE_CONTAINER, SCOPE_POD)

PREFER_CLOSEST_NUMA_NODES = "prefer-closest-numa-nodes"
MAX_ALLOWABLE_NUMA_NODES = "max-allowable-numa-nodes"
OPTIONS = (PREFER_CLOSEST_NUMA_NODES, MAX_ALLOWABLE_NUMA_NODES)

DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8
"""More NUMA nodes than this makes hint enumeration explode; the kubelet refuses to start."""

_INT64_MAX = (1 << 63) - 1
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_GO_INT = re.compile(r"[+-]?[0-9]+")


class StartupError(InputError):
    """The fake kubelet refuses to start with this configuration (the kubelet's exact text)."""


def go_quote(text: str) -> str:
    """``text`` as Go's ``%q`` prints it (double quotes, Go escapes)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append(
                {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t"}.get(
                    ch, r"\v"
                )
            )
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """The parsed options (the kubelet's ``PolicyOptions``)."""

    prefer_closest_numa: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES


def _parse_go_bool(name: str, value: str) -> bool:
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    raise StartupError(
        f"bad value for option {go_quote(name)}: strconv.ParseBool: parsing "
        f"{go_quote(value)}: invalid syntax"
    )


def _parse_go_int(name: str, value: str) -> int:
    prefix = f"unable to convert policy option to integer {go_quote(name)}: strconv.Atoi: parsing "
    if not _GO_INT.fullmatch(value):
        raise StartupError(f"{prefix}{go_quote(value)}: invalid syntax")
    number = int(value)
    if not -_INT64_MAX - 1 <= number <= _INT64_MAX:
        raise StartupError(f"{prefix}{go_quote(value)}: value out of range")
    return number


def new_policy_options(policy_options: Mapping[str, str] | None) -> PolicyOptions:
    """Parse ``name -> value`` options (the kubelet's ``NewPolicyOptions``), in the given order.

    The kubelet ranges over a Go map, so with several bad options which error it reports is
    random; we report the first in ``policy_options`` order.
    """
    prefer_closest = False
    max_nodes = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name, value in (policy_options or {}).items():
        if name not in OPTIONS:
            raise StartupError(f"unknown Topology Manager Policy option: {go_quote(name)}")
        if name == PREFER_CLOSEST_NUMA_NODES:
            prefer_closest = _parse_go_bool(name, value)
        else:
            number = _parse_go_int(name, value)
            if number < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                raise StartupError(
                    f"the minimum value of {go_quote(name)} should not be less than "
                    f"{DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
                )
            max_nodes = number
    return PolicyOptions(prefer_closest_numa=prefer_closest, max_allowable_numa_nodes=max_nodes)


def parse_policy_options_flag(text: str) -> dict[str, str]:
    """``--topology-manager-policy-options`` as the kubelet's flag parser reads it.

    Comma-separated ``key=value`` pairs, blanks trimmed, empty items skipped, a key without
    ``=`` gets the empty value, a repeated key keeps the last value.
    """
    options: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        options[key.strip()] = value.strip() if sep else ""
    return options


def validate_config(policy: str, scope: str) -> None:
    """The kubelet's configuration validation of ``--topology-manager-policy`` and ``-scope``.

    Both are checked; two failures are reported together the way Go aggregates errors.
    """
    errors = []
    if policy not in POLICIES:
        allowed = " ".join(go_quote(p) for p in POLICIES)
        errors.append(
            "invalid configuration: topologyManagerPolicy (--topology-manager-policy) "
            f"{go_quote(policy)} must be one of: [{allowed}]"
        )
    if scope not in SCOPES:
        errors.append(
            "invalid configuration: topologyManagerScope (--topology-manager-scope) "
            f"{go_quote(scope)} must be one of: {go_quote(SCOPE_CONTAINER)}, or "
            f"{go_quote(SCOPE_POD)}"
        )
    if len(errors) == 1:
        raise StartupError(errors[0])
    if errors:
        raise StartupError("[" + ", ".join(errors) + "]")
