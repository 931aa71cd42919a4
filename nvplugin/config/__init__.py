"""The daemon's configuration: NVIDIA's device-plugin config (``version: v1``) plus nvplugin's own
settings, one declaration per setting (:mod:`.model`) read from four sources (:mod:`.loader`):
flags > environment > file > defaults; what a reload must do with a new config (:mod:`.reload`).
Strict about every key; below :mod:`nvplugin.plugin`, which it never imports."""

from nvplugin.config.layout import (
    ALLOCATIONS,
    Exclude,
    GpuPattern,
    ReplicatedResource,
    ReplicatedResources,
    ResourceRules,
    Sharing,
)
from nvplugin.config.loader import env_names, flag_names, load_config
from nvplugin.config.model import (
    CONFIG_VERSION,
    LOG_FORMATS,
    LOG_LEVELS,
    SCHEMA,
    SETTINGS,
    Config,
    HealthConfig,
    HealthServiceConfig,
    LogConfig,
)

__all__ = [
    "ALLOCATIONS",
    "CONFIG_VERSION",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SCHEMA",
    "SETTINGS",
    "Config",
    "Exclude",
    "GpuPattern",
    "HealthConfig",
    "HealthServiceConfig",
    "LogConfig",
    "ReplicatedResource",
    "ReplicatedResources",
    "ResourceRules",
    "Sharing",
    "env_names",
    "flag_names",
    "load_config",
]
