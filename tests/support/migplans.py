"""MIG plans shared by the rm, plugin and e2e tests: a dgx-a100-mig node, a homogeneous MIG config,
and the plan a config makes of it."""

from __future__ import annotations

import os
import shutil
from typing import Any

from nvplugin.config import Config, load_config
from nvplugin.nodesession import load_topology
from nvplugin.rm import ResourcePlan, plan_for
from tests.support.service import write_config

NODE = load_topology("dgx-a100-mig")


HOMOGENEOUS = """\
version: v1
name: a100-3g
gpus:
  - {name: NVIDIA A100-SXM4-40GB, numa_node: 0, mig: [3g.20gb, 3g.20gb]}
  - {name: NVIDIA A100-SXM4-40GB, numa_node: 1, mig: [3g.20gb, 3g.20gb]}
links: |2
        GPU0     GPU1
  GPU0  X        SYS
  GPU1  SYS      X
"""


def config_of(text: str = "", strategy: str = "mixed") -> Config:
    path = write_config(f"version: v1\nflags:\n  migStrategy: {strategy}\n" + text)
    try:
        return load_config(path)
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def plan_of(config: Config, gpus: Any = NODE.gpus) -> ResourcePlan:
    return plan_for(config, gpus)
