"""A short notation for topology hints in test tables: ``"0P"`` = {0} preferred, ``"0,1N"`` =
{0,1} not preferred, ``"nilP"`` = don't care, ``"-N"`` = an empty mask."""

from __future__ import annotations

from nvplugin.fakekubelet.topologymanager import BitMask, TopologyHint


def h(spec: str) -> TopologyHint:
    body, flag = spec[:-1], spec[-1]
    assert flag in "PN", spec
    if body == "nil":
        mask = None
    elif body in ("", "-"):
        mask = BitMask()
    else:
        mask = BitMask.of(*(int(b) for b in body.split(",")))
    return TopologyHint(mask, flag == "P")


def hs(*specs: str) -> list[TopologyHint]:
    return [h(s) for s in specs]


def show(hint: TopologyHint) -> str:
    """The notation of a hint (inverse of :func:`h`)."""
    mask = hint.numa_affinity
    if mask is None:
        body = "nil"
    elif mask.is_empty():
        body = "-"
    else:
        body = ",".join(str(b) for b in mask.get_bits())
    return body + ("P" if hint.preferred else "N")
