"""Allocate responses: what a container gets for the GPUs the kubelet gave it.

Today there is one strategy, the environment variable the NVIDIA container runtime reads
(``NVIDIA_VISIBLE_DEVICES`` = the GPUs' UUIDs in index order). NVIDIA's plugin also offers volume
mounts, CDI annotations and CDI devices, and index instead of UUID IDs; those arrive in a later
issue as more :class:`Strategy` implementations, chosen by config. The server only ever calls
:meth:`Responder.container_response`, so adding one touches nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nvplugin.node.model import Gpu
from nvplugin.plugin.api.v1beta1 import api_pb2

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = "void"
"""The NVIDIA runtime's value for "no GPU" (an empty value would mean "not set" to some
runtimes, which then expose every GPU)."""


class Strategy(Protocol):
    """Adds one kind of information about ``gpus`` (index order) to a container response."""

    def apply(self, gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse) -> None: ...


@dataclass(frozen=True)
class EnvvarStrategy:
    """``NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>,...`` in index order."""

    def apply(self, gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse) -> None:
        value = ",".join(gpu.uuid for gpu in sorted(gpus, key=lambda g: g.index))
        response.envs[VISIBLE_DEVICES_ENV] = value or NO_DEVICES


@dataclass(frozen=True)
class Responder:
    """Builds a container's Allocate response by applying each strategy in turn."""

    strategies: tuple[Strategy, ...] = (EnvvarStrategy(),)

    def container_response(self, gpus: Sequence[Gpu]) -> api_pb2.ContainerAllocateResponse:
        response = api_pb2.ContainerAllocateResponse()
        for strategy in self.strategies:
            strategy.apply(gpus, response)
        return response


def make_responder() -> Responder:
    """The responder the config asks for (today: always the envvar strategy)."""
    return Responder()
