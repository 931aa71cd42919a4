"""``nvplugin migrate``: NVIDIA's deployment in, nvplugin's equivalent out, with every change
named by its key path -- before anything is installed.

- :mod:`.values`: a values file of NVIDIA's chart -> the values for nvplugin's chart, read
  against the same declarations the chart refuses values with
  (:mod:`nvplugin.chart.values`, the settings' chart values) and the config files in it
  against the plugin's own loader.
- :mod:`.daemonset`: a DaemonSet manifest written for NVIDIA's image -> the same with nvplugin's
  image, its command, flags and environment read by the plugin's own loader.
- :mod:`.companions`: what NVIDIA's chart runs beside its plugin (the config manager, GPU
  Feature Discovery, the MPS control daemon), dropped and given to the plugin's pod.
- :mod:`.findings`: the findings and the output (commented YAML, or JSON).
"""

from nvplugin.migrate.findings import Finding, Migration, Status

__all__ = ["Finding", "Migration", "Status"]
