"""The chart's value sets that tests render: each exercises a different branch of the
templates. tests/chart/ renders, validates and lints every one; tests/realapi/ applies what each
renders to a real kube-apiserver with server-side dry-run."""

from __future__ import annotations

from typing import Any

from tests.support.nvidia import VALUES_VERSIONS, with_nvplugin_image
from tests.support.nvidia import values as nvidia_values

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": {
        "nameOverride": "gpu-plugin",
        "image": {"repository": "registry.example.com/nvplugin", "tag": "9.9.9"},
        "imagePullSecrets": [{"name": "registry-creds"}],
        "resourceName": "example.com/a100",
        "allocationPolicy": "simple",
        "failOnInitError": False,
        "deviceListStrategy": ["envvar", "cdi-annotations"],
        "deviceIDStrategy": "index",
        "compatWithCPUManager": True,
        "migStrategy": "none",
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "log": {"format": "console", "level": "debug"},
        "config": {"map": {"default": {"nvplugin": {"preStartRequired": True}}}},
        "simulate": "dgx-a100",
        "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "podSecurityContext": {"fsGroup": 0},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"operator": "Exists"}],
        "priorityClassName": "",
        "runtimeClassName": "nvidia",
        "podAnnotations": {"example.com/team": "ml"},
        "podLabels": {"example.com/tier": "node"},
        "updateStrategy": {"type": "OnDelete"},
        "metrics": {"enabled": True, "port": 9400},
    },
    "existing-configmap": {"config": {"name": "my-nvplugin", "default": "plugin"}},
    "config-string": {
        "config": {
            "map": {
                "config": "version: v1\nnvplugin:\n  health:\n"
                "    recovery:\n      quietPeriod: 60s\n"
            }
        }
    },
    "several-configs": {
        "config": {
            "default": "t4",
            "map": {
                "default": "version: v1\nflags:\n  migStrategy: none\n",
                "t4": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                "    - {name: nvidia.com/gpu, replicas: 4}\n",
            },
        }
    },
    "mps": {
        "mps": {"root": "/var/run/nvidia/mps"},
        "config": {
            "default": "any",
            "map": {
                "default": "version: v1\n",
                # The GPU Operator's MPS guide, as a config.map entry.
                "any": "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n"
                "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
            },
        },
    },
    # The GPU Operator's time-slicing recipe: a key per GPU type, the node label chooses.
    "gpu-operator-recipe": {
        "config": {
            "default": "any",
            "map": {
                "any": "version: v1\nflags:\n  migStrategy: none\n",
                "a100-40gb": "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n"
                "  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 8\n"
                "    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n",
                "tesla-t4": "version: v1\nflags:\n  migStrategy: none\nsharing:\n"
                "  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
            },
        }
    },
    "no-probes": {"probes": {"enabled": False}, "affinity": None, "tolerations": None},
    "overrides": {"fullnameOverride": "gpu", "namespaceOverride": "gpu-operator"},
    "digest": {"image": {"digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"}},
    "labels": {"gfd": {"enabled": True, "noTimestamp": True, "sleepInterval": "5m"}},
    "nodefeatures": {"gfd": {"enabled": True}, "nfd": {"enableNodeFeatureApi": True}},
    "topology": {
        "topology": {
            "publish": True,
            "volcano": True,
            "kubeletConfig": "/var/lib/kubelet/config.yaml",
            "cpuManagerPolicy": "static",
        }
    },
    "scheduler-extender": {"schedulerExtender": {"enabled": True}},
    "extender-only": {"schedulerExtender": {"enabled": True, "scheduler": {"enabled": False}}},
    # NVIDIA's values files as they are, with nvplugin's image (tests/fixtures/nvidia/)
    **{
        f"nvidia-{version}": with_nvplugin_image(nvidia_values(version))
        for version in VALUES_VERSIONS
    },
}
