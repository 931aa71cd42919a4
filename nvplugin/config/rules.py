"""Rules for single config values that need more than a type: paths, addresses, annotation
prefixes. Each returns why a value is wrong, or None; the plugin uses the parsers here too (one
copy of each rule)."""

from __future__ import annotations

import ipaddress

from nvplugin.api.nvidia import CDI_KIND, PLUGIN_CDI_KIND
from nvplugin.errors import show
from nvplugin.resourcenames import resource_name_problem

DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
"""How Allocate hands devices to containers, in the order the plugin applies them."""
DEVICE_ID_STRATEGIES = ("uuid", "index")
MIG_STRATEGIES = ("none", "single", "mixed")
"""``flags.migStrategy`` values, NVIDIA's names; the first is the default
(:mod:`nvplugin.rm.migstrategy` applies them)."""
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_ANNOTATION_NAME = "nvplugin"
"""Annotation keys are ``<prefix>nvplugin_<hash of the device IDs>``."""
DEFAULT_CDI_KIND = PLUGIN_CDI_KIND
"""The CDI kind of the spec nvplugin writes, NVIDIA's plugin's (its vendor is fixed there: the
kind does not follow ``cdiAnnotationPrefix``, which names only the annotation's key)."""
TOOLKIT_CDI_KIND = CDI_KIND
"""The kind of the spec the NVIDIA container toolkit writes (``nvidia-ctk cdi generate``,
``nvidia-cdi-refresh``): with it, nvplugin writes no spec and relies on the toolkit's."""
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
"""Where nvplugin writes its spec: the CDI directory for generated, short-lived specs (runtimes
read it after ``/etc/cdi``, and its specs take precedence)."""


def absolute_path_problem(value: str) -> str | None:
    """Host paths the kubelet and the runtime are given must be absolute."""
    return None if value.startswith("/") else f"{show(value)} is not an absolute path"


def cdi_annotation_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot start an annotation key (``<dns subdomain>/``), or None."""
    if not prefix.endswith("/"):
        return f"{show(prefix)} must end with '/' (like {DEFAULT_CDI_ANNOTATION_PREFIX!r})"
    problem = resource_name_problem(f"{prefix}{CDI_ANNOTATION_NAME}_0123456789abcdef")
    return None if problem is None else f"{show(prefix)} cannot prefix an annotation key: {problem}"


def address_problem(text: str) -> str | None:
    """Why ``text`` is not a ``host:port`` to bind (None when it is).

    The host is required (an IP address or a name; ``[...]`` around IPv6): the plugin binds what
    it is told, and "every interface" must be asked for as ``0.0.0.0`` or ``[::]``.
    """
    try:
        parse_address(text)
    except ValueError as exc:
        return str(exc)
    return None


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ValueError says what is wrong. Port 0 = any free port."""
    host, sep, port_text = text.rpartition(":")
    shown = show(text)
    if not sep or not host:
        raise ValueError(f"{shown} is not host:port (e.g. 127.0.0.1:9400 or 0.0.0.0:9400)")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"{shown}: an IPv6 host must be written [address]")
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{shown}: {show(host)} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{shown}: write an IPv6 host in brackets, e.g. [::1]:9400")
    if not port_text.isdigit() or len(port_text) > 5 or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{shown}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def _segment(text: str, middle: str) -> bool:
    """A CDI name segment: an ASCII letter first, a letter or digit last, ``middle`` between."""
    if not text or not (text[0].isascii() and text[0].isalpha()):
        return False
    if not (text[-1].isascii() and text[-1].isalnum()):
        return False
    return all((c.isascii() and c.isalnum()) or c in middle for c in text)


def cdi_kind_problem(kind: str) -> str | None:
    """Why ``kind`` is not a CDI kind ``<vendor>/<class>``, or None. The vendor is a letter, then
    letters, digits, ``-``, ``_`` or ``.``, ending in a letter or digit; the class likewise
    without ``.`` (a dot there needs CDI 0.6.0, which older runtimes reject)."""
    vendor, sep, klass = kind.partition("/")
    if not sep or not _segment(vendor, "-_.") or not _segment(klass, "-_"):
        return (
            f"{show(kind)} is not a CDI kind <vendor>/<class> (vendor: a letter, then letters, "
            "digits, '-', '_' or '.', ending in a letter or digit; class: the same without '.')"
        )
    return None


def cdi_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a CDI device, or None: letters, digits, ``-``, ``_``, ``.`` and
    ``:``, beginning and ending with a letter or digit."""
    ok = bool(name) and all((c.isascii() and c.isalnum()) or c in "-_.:" for c in name)
    if ok and name[0].isalnum() and name[-1].isalnum():
        return None
    return (
        f"{show(name)} cannot name a CDI device (letters, digits, '-', '_', '.', ':', "
        "beginning and ending with a letter or digit)"
    )
